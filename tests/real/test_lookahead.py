"""Lookahead decoding on real models: greedy equality, the KV invariant with many sequences,
sampling, statistics, refused parameters, the CLI."""

from __future__ import annotations


import pytest
from click.testing import CliRunner

from llamaspec import ConfigError, LlamaSpec, LookaheadConfig, ModelConfig, SamplingConfig, SpecConfig, Stats
from llamaspec.cli import cli

from conftest import PROMPTS, ROOT, SMOL, THREADS
from checks import assert_kv_invariant, assert_sampled_as_alone, check_stats as check_step_stats, generate_checked


SHIPPED = ROOT / "llamaspec" / "data"  # the prompts llamaspec ships
CODE_EDIT = (SHIPPED / "baseline_type_hints.txt").read_text()
OPEN_CHAT = (SHIPPED / "open_chat.txt").read_text()
# every step carries the window and all candidates, so the multi-sequence path always runs
FIXED = LookaheadConfig(w=4, n=4, g=3)


@pytest.fixture(scope="module")
def smol_fixed(module_spec):
    return module_spec(SMOL, spec="lookahead", fixed=("lookahead",), lookahead=FIXED)


def check_stats(stats: Stats, n_tokens: int):
    check_step_stats(stats, n_tokens)
    src = stats.sources.get("lookahead")
    assert src is None or (src.accepted <= src.drafted and src.steps <= stats.n_target_calls)


def test_a_small_fixed_window_on_the_code_edit(make_spec, reference):
    """A window of another shape (3, 4, 2), whole with its candidates every step: each token is
    the one-token-at-a-time argmax (or a near-tie), and the prompt-seeded pool gets candidates
    accepted from the start."""
    spec = make_spec(SMOL, spec="lookahead", fixed=("lookahead",), lookahead=LookaheadConfig(w=3, n=4, g=2))
    result = spec.generate(CODE_EDIT, max_tokens=48, temperature=0)
    ref = reference(SMOL)
    argmax, gap = ref.top2(spec.tokenize(CODE_EDIT), result.tokens)
    differ = [i for i, (a, b) in enumerate(zip(argmax, result.tokens)) if a != b]
    assert all(gap[i] < ref.near_tie for i in differ), differ
    assert result.stats.n_accept > 10 and result.stats.sources["lookahead"].accepted > 10, result.stats.summary()


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_kv_invariant_after_every_step(smol_fixed, temperature):
    """Every step carries the window's 4 sequences and the candidates' branches; after each
    only the text's own sequence holds cells."""
    (result,) = generate_checked(smol_fixed, smol_fixed.tokenize(PROMPTS[2]), max_tokens=48, temperature=temperature,
                              seed=5)
    assert result.stats.n_predict == 48 and result.stats.n_drafted > 0


def test_abandoned_stream_leaves_only_the_texts_sequence(smol_fixed):
    chunks = smol_fixed.stream(PROMPTS[0], max_tokens=40, temperature=0)
    next(chunks)
    chunks.close()
    assert_kv_invariant(smol_fixed)
    result = smol_fixed.generate(PROMPTS[0], max_tokens=8, temperature=0)  # still works
    assert len(result.tokens) == 8


def test_sampling_runs_and_is_reproducible(smol_fixed, reference):
    """A seed gives the same text from the same state; after the sources learned from that text
    (other windows and branches in the batch), the same text or one that leaves it first at a
    sampling near-tie (a batch of other rows rounds differently)."""
    smol_fixed.reset()
    a = smol_fixed.generate(PROMPTS[1], max_tokens=32, temperature=0.8, seed=11)
    smol_fixed.reset()
    b = smol_fixed.generate(PROMPTS[1], max_tokens=32, temperature=0.8, seed=11)
    assert a.tokens == b.tokens and len(a.tokens) == 32
    again = smol_fixed.generate(PROMPTS[1], max_tokens=32, temperature=0.8, seed=11)
    assert_sampled_as_alone(reference(SMOL), smol_fixed.tokenize(PROMPTS[1]), again.tokens, a.tokens,
                            SamplingConfig(temperature=0.8), 11, "after learning")


def test_pool_is_seeded_from_the_prompt_and_references(make_spec):
    prompt = "<|im_start|>user\nRepeat: the quick brown fox jumps over the lazy dog<|im_end|>\n<|im_start|>assistant\n"
    reference = "zebra crossing tomorrow morning at nine"
    spec = make_spec(SMOL, spec="lookahead", lookahead=LookaheadConfig(w=1, n=4, g=2), references=[reference])
    spec.generate(prompt, max_tokens=2, temperature=0)
    (source,) = spec.engine.lanes[0].speculator.sources
    ref = spec.model.tokenize(reference, add_special=False, parse_special=False)
    assert [ref[1:4]] == [c for c, _, _ in source.pool.candidates([], ref[0], 1)]
    fox = spec.model.tokenize(" quick brown fox jumps", add_special=False, parse_special=False)
    assert fox[1:] in [c for c, _, _ in source.pool.candidates([], fox[0], 16)]


def test_parameters_that_cannot_fit_are_refused_before_loading(tmp_path):
    missing = str(tmp_path / "not-loaded.gguf")  # never opened: the check comes first
    fixed = SpecConfig(frozenset({"lookahead"}), frozenset({"lookahead"}))
    with pytest.raises(ConfigError, match="more than half"):
        LlamaSpec(ModelConfig(missing, n_ctx=256), settings={"lookahead": LookaheadConfig(15, 5, 20)}, spec=fixed,
                  progress=False)
    with pytest.raises(ConfigError, match="llama.cpp allows at most"):
        LlamaSpec(ModelConfig(missing, n_ctx=65536, n_batch=4096), settings={"lookahead": LookaheadConfig(250, 2, 10)},
                  progress=False)


def test_cli_lookahead(model_file):
    smol = str(model_file(SMOL))
    runner = CliRunner()
    args = ["generate", "-m", smol, "-p", PROMPTS[1], "-n", "24", "--temp", "0", "-t", str(THREADS)]
    plain = runner.invoke(cli, args)
    out = runner.invoke(cli, args + ["--lookahead", "--lookahead-w", "3", "--lookahead-n", "3",
                                     "--lookahead-g", "2", "--lookahead-fixed"])
    assert plain.exit_code == 0 and out.exit_code == 0, out.output
    assert "lookahead: 24 tokens" in out.stderr and "(lookahead " in out.stderr
    bad = runner.invoke(cli, args + ["--lookahead", "--lookahead-n", "1"])
    assert bad.exit_code != 0 and bad.stderr.strip() == "error: lookahead N must be >= 2, got 1"
    too_big = runner.invoke(cli, args + ["--lookahead", "-c", "256", "--lookahead-w", "40", "--lookahead-fixed"])
    assert too_big.exit_code != 0 and len(too_big.stderr.strip().splitlines()) == 1
    assert "raise the context size" in too_big.stderr
