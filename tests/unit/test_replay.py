"""The model-free replay harness and the copy-oracle bound, on synthetic texts and on the
target's real recorded answers to the bench suite (tests/data/answers.json), to fourteen more
prompts (tests/data/more_answers.json) and to sixteen prompts used in no fit of the priors
(tests/data/held_out_answers.json)."""

from __future__ import annotations


import pytest

from llamaspec.planning.costs import REFERENCE_CPU, CostCurve
from llamaspec.measure.replay import copy_oracle, replay, speculator

from conftest import ANSWERS

LINEAR = CostCurve([float(n) for n in range(1, 33)], 30.0, 2, "cpu")  # verifying never pays


def test_copy_oracle_on_texts_whose_answer_is_known():
    prompt = list(range(1, 21))
    assert copy_oracle(prompt, prompt, CostCurve.flat().cost) == 19.0  # one step verifies the whole copy
    assert copy_oracle(prompt, prompt, LINEAR.cost) == 1.0
    assert copy_oracle(prompt, list(range(100, 140)), CostCurve.flat().cost) == 1.0  # nothing to copy
    # a repeat of the answer itself counts: 7 steps for new tokens (the first is the prompt's),
    # then 8 copied + 1 in one step, then the last 7 copied (its extra token past the end)
    answer = list(range(50, 58)) * 3
    assert copy_oracle([1], answer, CostCurve.flat().cost) == pytest.approx(23 / 9)


def test_replay_counts_and_cost():
    answer = [1, 2, 3, 4, 5, 6, 7, 8] * 8
    stats = replay(answer[:8], answer[8:], speculator(CostCurve.flat(), ("lookup",)))
    assert stats.n_tokens == len(answer) - 8 - 1  # the first token is the prompt's
    assert stats.n_accept <= stats.n_drafted and stats.n_accept == stats.n_tokens - stats.n_steps
    assert stats.speedup > 5 and stats.sources["lookup"].accepted == stats.n_accept
    plain = replay(answer[:8], answer[8:], speculator(REFERENCE_CPU, ()))
    assert plain.speedup == 1.0 and plain.n_drafted == 0


def test_a_flat_curve_verifies_more_than_a_steep_one():
    item = ANSWERS["code_edit"]
    flat = replay(item["prompt"], item["answer"], speculator(CostCurve.flat()))
    steep = replay(item["prompt"], item["answer"], speculator(REFERENCE_CPU))
    assert flat.n_drafted > 2 * steep.n_drafted and flat.n_steps < steep.n_steps


def test_perfect_estimates_reach_the_bound_on_a_plain_copy():
    prompt = list(range(1, 21))
    perfect = replay(prompt, prompt, speculator(CostCurve.flat(), ("lookup",)), perfect=True)
    assert perfect.speedup == copy_oracle(prompt, prompt, CostCurve.flat().cost) == 19.0
    assert perfect.n_steps == 1 and perfect.n_accept == perfect.n_drafted == 18
    # where verifying never pays, knowing the answer does not make it pay
    assert replay(prompt, prompt, speculator(LINEAR, ("lookup",)), perfect=True).n_drafted == 0


def test_a_timed_replay_charges_each_step_the_host_s_time_its_planning_took(monkeypatch):
    """``timed``: a step whose planning took 3 ms on a curve of 1 ms decodes costs 3 decodes more."""
    import time
    from llamaspec.planning.speculator import Speculator
    answer = [1, 2, 3, 4, 5, 6, 7, 8] * 4
    curve = CostCurve([float(n) for n in range(1, 33)], 1.0, 2, "cpu")  # nothing verified: plain steps
    plan = Speculator.plan

    def slow(self, *args, **kwargs):
        time.sleep(0.003)
        return plan(self, *args, **kwargs)
    monkeypatch.setattr(Speculator, "plan", slow)
    untimed = replay(answer[:8], answer[8:], speculator(curve, ()))
    timed = replay(answer[:8], answer[8:], speculator(curve, ()), timed=True)
    assert untimed.cost == untimed.n_steps
    assert 3 * timed.n_steps <= timed.cost - untimed.cost < 10 * timed.n_steps


def test_the_copy_oracle_copies_from_other_texts_too():
    """Runs the answer takes from a text other than the prompt (a reference, the prompt's escaped
    view) count, at any position of it."""
    answer = [1, *range(100, 120)]
    assert copy_oracle([1], answer, CostCurve.flat().cost) == 1.0
    # one step verifies the 20 tokens after the first, all found in the other text
    assert copy_oracle([1], answer, CostCurve.flat().cost, others=[[7, *range(100, 120), 8]]) == 20.0
