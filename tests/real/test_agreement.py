"""llamaspec agreement on real models: SmolLM2's shipped Q4_1 against re-quantizations made here
with llama.cpp's own quantizer; the expected acceptance against real speculative sampling; the
CLI's table, JSON, --min-agreement and one-line errors."""

from __future__ import annotations

import json
import math

import pytest

import llamaspec
from llamaspec import SamplingConfig
from llamaspec.llama import models

from conftest import QWEN_DRAFT, THREADS, assert_one_line_error, run


@pytest.fixture(scope="module")
def quants(smol_quant):
    """SmolLM2 re-quantized: Q8_0 (nearly lossless over the Q4_1 it comes from), Q4_0, Q2_K."""
    return {kind: smol_quant(kind) for kind in ("Q8_0", "Q4_0", "Q2_K")}


@pytest.fixture(scope="module")
def work_cache():
    """The suite's cache (where the other tests keep the cost curves of SmolLM2 and of the same
    quantizations: each is measured once a run)."""
    return models.cache_dir()


@pytest.fixture(scope="module")
def report(smol, quants, work_cache):
    return llamaspec.agreement(smol, [str(quants[k]) for k in ("Q8_0", "Q4_0", "Q2_K")], n_tokens=96,
                               n_threads=THREADS, cache_dir=work_cache)


def test_a_near_lossless_quant_agrees_far_more_than_damaged_ones(report):
    q8, q4, q2 = report.candidates
    assert q8.n_tokens == q2.n_tokens > 300  # the suite's five prompts, the reference's answers
    assert q8.top1_agreement > 0.93 and q8.kl_mean < 0.02
    for bad in (q4, q2):
        assert bad.top1_agreement < q8.top1_agreement - 0.1 and bad.kl_mean > 5 * q8.kl_mean
        assert bad.perplexity > q8.perplexity
    assert q8.same_model and q8.verdict == "agrees like a healthy quant"
    assert q2.verdict != q8.verdict and "broken" in q2.verdict
    assert abs(q8.perplexity - report.reference_perplexity) < 0.05 * report.reference_perplexity


def test_tokens_per_step_and_predicted_speedup_are_consistent(report):
    for c in report.candidates:
        assert len(c.tokens_per_step) == len(c.speedups) == 16
        assert all(b >= a for a, b in zip(c.tokens_per_step, c.tokens_per_step[1:]))
        assert c.tokens_per_step[0] == pytest.approx(1 + c.expected_acceptance)
        assert c.predicted_speedup == max(c.speedups) and c.speedups[c.best_k - 1] == c.predicted_speedup


def test_expected_acceptance_matches_real_speculative_sampling(smol, quants, work_cache, pool):
    """One draft token a step, so every drafted token meets exactly one acceptance test, which
    passes with probability sum_x min(p'(x), q'(x)) at its position."""
    sampling = SamplingConfig(temperature=1.0)
    spec = llamaspec.LlamaSpec(llamaspec.ModelConfig(smol, n_threads=THREADS), llamaspec.ModelConfig(
        str(quants["Q2_K"]), n_threads=THREADS), settings=dict(draft_max=1, draft_min=1, draft_p_min=0.0),
        cache_dir=work_cache, progress=False, spec=llamaspec.SpecConfig(frozenset({"draft"}), frozenset({"draft"})),
        pool=pool)
    texts, drafted, accepted = [], 0, 0
    try:
        for seed, prompt in enumerate(["Once upon a time", "The best way to learn", "In 1850,", "My favourite"]):
            result = spec.generate(prompt, max_tokens=160, temperature=sampling.temperature, seed=seed)
            texts.append(prompt + result.text)
            drafted, accepted = drafted + result.stats.n_drafted, accepted + result.stats.n_accept
    finally:
        spec.close()
    measured = accepted / drafted
    expected = llamaspec.agreement(smol, [str(quants["Q2_K"])], texts=texts, sampling=sampling, n_threads=THREADS,
                                   cache_dir=work_cache).candidates[0].expected_acceptance
    error = math.sqrt(expected * (1 - expected) / drafted)  # a binomial's standard error
    assert drafted > 300 and abs(measured - expected) < 4 * error, (measured, expected, drafted)


def test_the_command_prints_a_table_writes_json_and_fails_below_min_agreement(smol, quants, work_cache, tmp_path):
    text = tmp_path / "story.txt"
    text.write_text("Once upon a time there was a small town by the sea. Every morning the fishermen went out "
                    "to sea, and every evening they came back with their boats full of fish.", encoding="utf-8")
    out = tmp_path / "agreement.json"
    result = run("agreement", "-m", smol, "-md", str(quants["Q8_0"]), "-md", str(quants["Q2_K"]), "-f", str(text),
                 "-t", str(THREADS), "--temp", "0", "--json", str(out), "--cache-dir", str(work_cache))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("reference ") and "accept (greedy)" in lines[1]
    assert "smol.Q8_0.gguf" in lines[2] and "healthy" in lines[2] and "smol.Q2_K.gguf" in lines[3]
    data = json.loads(out.read_text())
    assert data["reference"] == smol and [c["model"] for c in data["candidates"]] == [str(quants["Q8_0"]),
                                                                                      str(quants["Q2_K"])]
    for c in data["candidates"]:
        for key in ("top1_agreement", "expected_acceptance", "kl_mean", "kl_p99", "perplexity", "predicted_speedup"):
            assert isinstance(c[key], float)
        assert c["expected_acceptance"] == c["top1_agreement"]  # greedy
        assert isinstance(c["verdict"], str)
    low = run("agreement", "-m", smol, "-md", str(quants["Q2_K"]), "-f", str(text), "-t", str(THREADS),
              "--min-agreement", "0.95", "--cache-dir", str(work_cache))
    assert low.exit_code == 1 and "smol.Q2_K.gguf" in low.stdout
    assert low.stderr.strip().startswith("error: ") and "below --min-agreement 0.95" in low.stderr


def test_bad_input_is_a_one_line_error(smol, model_file, tmp_path, work_cache):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n", encoding="utf-8")
    base = ("agreement", "-m", smol, "-t", str(THREADS), "--cache-dir", str(work_cache))
    assert_one_line_error(run(*base, "-md", str(model_file(QWEN_DRAFT))), "cannot draft for")
    assert_one_line_error(run(*base, "-md", str(tmp_path / "missing.gguf")), "missing.gguf")
    assert_one_line_error(run(*base, "-md", smol, "-f", str(empty)), "text 1 is empty")
    assert_one_line_error(run(*base, "-md", smol, "-f", str(tmp_path / "nope.txt")), "nope.txt")
    assert_one_line_error(run(*base[:3]), "--candidate")
