"""The verify loop on real models: KV invariant, stops, multi-turn reuse, sampling, memory."""

from __future__ import annotations

import collections

import numpy as np
import psutil
import pytest
from scipy.stats import chisquare

from llamaspec import PromptError, SamplingConfig, VocabMismatchError
from llamaspec.sampling import transform

from conftest import PROMPTS, QWEN, ROOT, SMOL, chatml
from checks import assert_kv_invariant, generate_checked


@pytest.fixture(scope="module")
def smol_pair(module_spec, smol_quant):
    """SmolLM2 with a draft that disagrees with it (itself made Q2_K), verified every step: the
    draft's cache is cut back where its tokens are rejected."""
    return module_spec(SMOL, str(smol_quant("Q2_K")), spec="draft", fixed=("draft",), draft_max=8, draft_p_min=0.5)


@pytest.mark.parametrize("fixture", ["smol_auto", "smol_pair"])  # each source alone: test_sources.py
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_kv_invariant_after_every_step(request, fixture, temperature):
    spec = request.getfixturevalue(fixture)
    (result,) = generate_checked(spec, spec.tokenize(PROMPTS[2]), max_tokens=48, temperature=temperature, seed=1)
    stats = result.stats
    assert stats.n_predict == 48 and stats.n_accept <= stats.n_drafted
    if fixture == "smol_pair":
        assert 0 < stats.n_accept < stats.n_drafted


def test_the_decode_time_starts_after_the_call_that_read_the_prompt(smol_auto):
    """t_prompt runs to the first call's end, t_decode from there: the decode speed counts the
    tokens after that call, as llama-server's predicted_per_second does."""
    stats = smol_auto.generate(smol_auto.tokenize(PROMPTS[2]), max_tokens=24, temperature=0).stats
    assert stats.n_first == 1 and stats.n_predict == 24 and stats.t_prompt > 0 and stats.t_decode > 0
    assert stats.decode_tps == pytest.approx(23 / stats.t_decode)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_an_engine_that_overlaps_decodes_the_same_text_with_the_caches_in_step(smol_pair, temperature):
    """On a GPU each step queues the next decode before it returns (llama_decode does not wait
    for it there); on a CPU it would only delay the tokens, so here it is forced on: the same
    plans (the draft verified whole every step), the same tokens, and between steps each cache
    holds its text and then only the queued decode's rows; exactly its text once the text ends."""
    prompt = smol_pair.tokenize(PROMPTS[2])
    (alone,) = generate_checked(smol_pair, prompt, max_tokens=48, temperature=temperature, seed=1)
    smol_pair.engine.overlap = True
    try:
        (overlapped,) = generate_checked(smol_pair, prompt, max_tokens=48, temperature=temperature, seed=1)
        assert not smol_pair.engine.queued
        assert_kv_invariant(smol_pair)
    finally:
        smol_pair.engine.overlap = False
    assert overlapped.tokens == alone.tokens and overlapped.stats.n_target_calls == alone.stats.n_target_calls
    assert overlapped.stats.n_accept == alone.stats.n_accept > 0


def test_the_host_time_script_decodes_a_recorded_answer_over_a_null_decode():
    """benchmarks/host_time.py (the host's time a step, as beside a GPU) runs the 0.5B's engine over
    a decode that answers as the recorded target did: the text is the answer, with and without
    the next decode queued, and the host's time is a positive fraction of a step."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "host_time.py"), "--answers", "open_chat",
                           "--spec", "none,lookup", "--repeats", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert [(r[1], r[3]) for r in rows] == [("none", "off"), ("none", "on"), ("lookup", "off"), ("lookup", "on")]
    for r in rows:  # lookup may copy a few tokens: 256 decodes or fewer
        assert r[-1] == "equal" and int(r[5]) <= 256 and 0 < float(r[r.index("host") + 1]) < 5, r
    assert rows[0][5] == rows[1][5] == "256"


def test_abandoned_stream_leaves_caches_consistent(smol_self):
    before = smol_self.generate(PROMPTS[0], max_tokens=16, temperature=0).tokens
    chunks = smol_self.stream(PROMPTS[0], max_tokens=64, temperature=0)
    for _, _ in zip(range(3), chunks):
        pass
    chunks.close()
    assert_kv_invariant(smol_self)
    assert len(smol_self.engine.lanes[0].tokens) > len(smol_self.tokenize(PROMPTS[0]))
    # the caches now hold part of a reply; the next generation must not be disturbed by it
    assert smol_self.generate(PROMPTS[0], max_tokens=16, temperature=0).tokens == before


def test_max_tokens(smol_self):
    result = smol_self.generate(PROMPTS[0], max_tokens=7, temperature=0)
    assert len(result.tokens) == 7 and result.stop_reason == "length"
    assert result.stats.n_predict == 7


def test_end_of_generation(smol_self):
    result = smol_self.generate(chatml("Say hello."), max_tokens=200, temperature=0)
    assert result.stop_reason == "stop" and len(result.tokens) < 200
    assert "<|im_end|>" not in result.text and result.text.strip()
    assert_kv_invariant(smol_self)


def test_stop_string_cuts_text_and_streams_no_partial_stop(smol_self):
    full = smol_self.generate(PROMPTS[0], max_tokens=64, temperature=0)
    words = full.text.split(" ")
    stop = " ".join(words[4:6])  # a stop string in the middle of the output
    start = full.text.index(stop)
    chunks = list(smol_self.stream(PROMPTS[0], max_tokens=64, temperature=0, stop=[stop]))
    result = chunks[-1].result
    assert result.stop_reason == "stop"
    assert result.text == full.text[:start]
    assert "".join(c.text for c in chunks) == result.text
    assert_kv_invariant(smol_self)


def test_full_context_stops_with_its_own_reason(make_spec):
    spec = make_spec(SMOL, SMOL, n_ctx=256, spec="lookup,draft", fixed=("draft",), draft_max=4, draft_p_min=0.0)
    prompt = spec.tokenize("1, 2, 3, 4, 5, 6, 7, 8, 9, 10,")
    result = spec.generate(prompt, max_tokens=-1, temperature=0)
    assert result.stop_reason == "context" and spec.ctx.n_ctx == 256
    assert len(prompt) + len(result.tokens) == 256 + 1  # the last token is emitted, never evaluated
    assert spec.generate(prompt, max_tokens=8, temperature=0).stop_reason == "length"
    assert_kv_invariant(spec)


def test_prompt_errors(make_spec, smol_self):
    spec = make_spec(SMOL, n_ctx=256)
    with pytest.raises(PromptError, match=f"context holds {spec.ctx.n_ctx}"):
        spec.generate("word " * 400)
    with pytest.raises(PromptError, match="empty"):
        smol_self.generate("")


def test_second_chat_turn_evaluates_only_new_tokens(smol_pair):
    pair = smol_pair  # a draft model's cache too
    pair.reset()
    messages = [{"role": "user", "content": "Name three prime numbers."}]
    first = pair.chat(messages, max_tokens=32, temperature=0)
    assert first.stats.n_prompt_eval == first.stats.n_prompt  # the whole prompt, in one go
    messages += [{"role": "assistant", "content": first.text},
                 {"role": "user", "content": "And three more?"}]
    second = pair.chat(messages, max_tokens=16, temperature=0)
    new_turn = pair.tokenize("<|im_end|>\n<|im_start|>user\nAnd three more?<|im_end|>\n"
                             "<|im_start|>assistant\n", add_special=False)
    assert second.stats.n_prompt_eval <= len(new_turn) + 1
    assert second.stats.n_prompt > first.stats.n_prompt
    assert_kv_invariant(pair)


def test_vocab_mismatch_names_first_differing_token(make_spec):
    with pytest.raises(VocabMismatchError, match=r"first differing token \d+"):
        make_spec(QWEN, SMOL)


def test_speculative_sampling_matches_target_distribution(make_spec, smol_plain, smol_quant):
    """The first two tokens, the second through a verified draft (SmolLM2 quantized to Q2_K: a
    real model that disagrees with its target), are distributed as the target's exact
    p(x1) p(x2 | x1) (the first comes from the prompt's own decode)."""
    spec = make_spec(SMOL, str(smol_quant("Q2_K")), spec="draft", fixed=("draft",), draft_max=2, draft_p_min=0.0)
    prompt = spec.tokenize(chatml("Write a long poem about animals."))
    options = dict(temperature=1.5, top_k=4, top_p=1.0, min_p=0.0)
    sampling = SamplingConfig(**options)

    def exact(*batches):  # the rows the engine computes: the prompt in one batch, then one more token
        smol_plain.reset()
        for batch in batches:
            smol_plain.ctx.eval(batch, logits="last")
        return transform(smol_plain.ctx.logits_ith(-1), sampling)
    p1 = exact(prompt)
    p2 = {int(x): exact(prompt, [int(x)]) for x in p1.ids}
    n = 400
    counts = collections.Counter()
    rejected = 0
    for seed in range(n):
        r = spec.generate(prompt, max_tokens=3, seed=seed, **options)  # room to draft after the first token
        assert r.stats.n_drafted >= 1 and len(r.tokens) >= 2
        rejected += r.stats.n_accept < r.stats.n_drafted
        counts[tuple(r.tokens[:2])] += 1
    assert rejected > 20, "the draft must disagree with the target for this test to mean anything"
    cells = [(a, b) for a in p2 for b in p2[a].ids.tolist()]
    expected = np.array([p1.prob(a) * p2[a].prob(b) for a, b in cells]) * n
    observed = np.array([counts[cell] for cell in cells])
    assert observed.sum() == n
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    assert chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3


def test_fifty_generations_do_not_leak(smol_self):
    process = psutil.Process()

    def run(times):
        for i in range(times):
            smol_self.generate(PROMPTS[0], max_tokens=8, temperature=0.7, seed=i)

    run(10)
    before = process.memory_info().rss
    run(50)
    growth = process.memory_info().rss - before
    assert growth < 16 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over 50 generations"


def test_failed_decode_raises_our_error(smol_plain):
    from llamaspec import DecodeError
    smol_plain.generate(PROMPTS[0], max_tokens=4, temperature=0)
    ctx = smol_plain.ctx
    held = ctx.pos_max(0)  # the last text's, on lane 0
    with pytest.raises(DecodeError, match="llama_decode failed"):
        ctx.decode_rows([(smol_plain.model.n_vocab + 10, held + 1, (0,), True)])  # a token id outside the vocabulary
    assert ctx.pos_max(0) == held
    assert_kv_invariant(smol_plain)
    assert len(smol_plain.generate(PROMPTS[0], max_tokens=4, temperature=0).tokens) == 4
