"""The agreement measures on plain arrays: per-position comparison, tokens per step, speed-ups,
verdicts."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import entropy

from llamaspec.measure.agreement import QUANT_VERDICTS, verdict
from llamaspec.config import SamplingConfig
from llamaspec.planning.costs import CostCurve, CostModel
from llamaspec.measure.divergence import compare, full_runs, speedups, tokens_per_step

PLAIN_SOFTMAX = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


def softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_identical_models_agree_everywhere_with_no_divergence():
    logits = np.random.default_rng(0).normal(size=(40, 50)).astype(np.float32)
    nxt = np.arange(40) % 50
    m = compare(logits, logits.copy(), nxt, SamplingConfig())
    assert m.agree.all() and np.allclose(m.accept, 1) and np.allclose(m.kl, 0, atol=1e-12)
    assert np.allclose(m.nll_p, m.nll_q)


def test_measures_match_their_definitions():
    rng = np.random.default_rng(1)
    p_logits = rng.normal(scale=2, size=(70, 30)).astype(np.float32)  # more rows than one block
    q_logits = (p_logits + rng.normal(scale=1.5, size=p_logits.shape)).astype(np.float32)
    nxt = rng.integers(0, 30, size=70)
    m = compare(p_logits, q_logits, nxt, PLAIN_SOFTMAX)
    p, q = softmax(p_logits.astype(np.float64)), softmax(q_logits.astype(np.float64))
    assert np.array_equal(m.agree, p.argmax(1) == q.argmax(1)) and 0.2 < m.agree.mean() < 0.9
    assert np.allclose(m.accept, np.minimum(p, q).sum(1))  # the probability speculative sampling accepts
    assert np.allclose(m.kl, [entropy(p[i], q[i]) for i in range(70)])
    assert np.allclose(m.nll_p, -np.log(p[np.arange(70), nxt]))
    greedy = compare(p_logits, q_logits, nxt, SamplingConfig(temperature=0))
    assert np.array_equal(greedy.accept, greedy.agree.astype(float))


def test_sampler_settings_change_the_expected_acceptance():
    rng = np.random.default_rng(2)
    p_logits = rng.normal(scale=3, size=(20, 100)).astype(np.float32)
    q_logits = (p_logits + rng.normal(size=p_logits.shape)).astype(np.float32)
    hot = compare(p_logits, q_logits, np.zeros(20, int), PLAIN_SOFTMAX).accept.mean()
    cold = compare(p_logits, q_logits, np.zeros(20, int), SamplingConfig(temperature=0.3, top_k=0, top_p=1,
                                                                          min_p=0)).accept.mean()
    assert cold != pytest.approx(hot, abs=0.01)


def test_vocabularies_of_different_sizes_compare_their_common_tokens():
    logits = np.random.default_rng(3).normal(size=(5, 20)).astype(np.float32)
    padded = np.concatenate([logits, np.full((5, 4), -30, np.float32)], axis=1)
    assert compare(logits, padded, np.zeros(5, int), SamplingConfig()).agree.all()


def test_tokens_per_step_follows_runs_of_acceptance():
    a = np.array([1.0, 1.0, 0.0, 1.0])
    full = full_runs([a], k_max=3)
    assert full == pytest.approx([0.75, 0.25, 0.0])  # runs of 1, 2, 3 accepted from starts 0..3
    # k=1: mean a = 0.75; k=2: starts 0..3 accept 2, 1, 0, 1 (a draft stops at the stream's end)
    assert tokens_per_step(full) == pytest.approx([1.75, 2.0, 2.0])
    both = tokens_per_step(full_runs([a, np.array([0.5, 0.5])], k_max=2))
    assert both[1] == pytest.approx(1 + (2 + 1 + 0 + 1 + (0.5 + 0.25) + 0.5) / 6)


def test_speedups_divide_tokens_by_the_cost_of_a_step():
    flat = CostModel(CostCurve([1.0] * 32, 10.0, 1, "cpu"), {"draft": CostCurve([1.0] * 32, 2.0, 1, "cpu")})
    full = np.array([0.9, 0.8, 0.7])
    per_step = 1 + np.cumsum(full)
    k = np.arange(1, 4)
    # a flat draft curve: catching up on one more token costs nothing; a draft token costs 0.2
    assert speedups(full, flat) == pytest.approx(per_step / (1 + 0.2 * k))
    draft = CostCurve([1.0, 1.5] + [2.0] * 30, 2.0, 1, "cpu")  # two rows cost 1.5 of one
    steep = CostModel(CostCurve([1.0, 1.5, 2.0, 2.5] + [3.0] * 28, 10.0, 1, "cpu"), {"draft": draft})
    # after a fully accepted step the first draft decode reads two rows: 0.1 more
    expected = per_step / (np.array([1.5, 2.0, 2.5]) + 0.2 * k + full * 0.1)
    assert speedups(full, steep) == pytest.approx(expected)


def test_verdicts_judge_a_quant_by_agreement_and_a_draft_by_speed():
    floors = [floor for floor, _ in QUANT_VERDICTS]
    assert floors == sorted(floors, reverse=True) and floors[-1] == 0
    assert verdict(0.97, 0.8, 1, same_model=True) == "agrees like a healthy quant"
    assert "broken" in verdict(0.70, 0.8, 1, same_model=True)
    assert verdict(0.70, 1.3, 3, same_model=False).startswith("pays as a draft here: 1.30x")
    assert "does not pay" in verdict(0.97, 0.9, 1, same_model=False)
