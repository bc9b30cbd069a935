"""The gate that stops asking the draft sources where asking costs more than it gains."""

from __future__ import annotations

from typing import List

from llamaspec.planning.gate import Gate

PLAIN = 1.0  # a plain step's planned cost


def run(gate: Gate, steps: int, accepted: int = 0, cost: float = PLAIN, time: float = 0.5,
        foresaw: bool = False) -> List[bool]:
    """``steps`` steps; each that asks gains ``accepted`` tokens for ``cost`` in ``time``."""
    asked = []
    for _ in range(steps):
        asked.append(gate.ask(PLAIN))
        gate.learn(accepted, cost, time, foresaw)
    return asked


def gaps(asked: List[bool]) -> List[int]:
    at = [i for i, a in enumerate(asked) if a]
    return [b - a for a, b in zip(at, at[1:])]


def test_asking_that_gains_nothing_is_spaced_out_doubling_up_to_max_wait():
    gate = Gate()
    asked = run(gate, 200, time=0.2)
    first_gap = next(i for i, g in enumerate(gaps(asked)) if g > 1)
    assert 5 <= first_gap <= 12  # the optimistic start outweighs 0.2 for a few steps
    assert gaps(asked)[first_gap:first_gap + 5] == [2, 4, 8, 16, 16]
    assert sum(asked) < 0.2 * len(asked)


def test_an_ask_that_pays_asks_every_step_again():
    gate = Gate()
    run(gate, 100)
    assert gate.wait == Gate.MAX_WAIT
    asked = run(gate, 20, accepted=4, cost=3.5)  # 4 tokens for 2.5 more than a plain step: 1.5 > 0.5
    assert asked[Gate.MAX_WAIT:] == [True] * (20 - Gate.MAX_WAIT)


def test_a_bet_that_loses_counts_against_asking():
    gate = Gate()
    asked = run(gate, 100, accepted=0, cost=3.5, time=0.1)  # each verify lost 2.5
    assert gate.gain < 0 and sum(asked) < 25


def test_candidates_that_foresaw_the_text_ask_once_more_without_resetting_the_wait():
    gate = Gate()
    run(gate, 100)
    wait = gate.wait
    while not gate.ask(PLAIN):
        gate.learn(0, PLAIN, 0.5)
    gate.learn(0, PLAIN, 0.5, foresaw=True)
    assert gate.ask(PLAIN) and gate.wait == wait  # the next step asks
    gate.learn(0, PLAIN, 0.5)
    assert run(gate, wait - 1) == [False] * (wait - 1)  # then the wait goes on


def test_no_time_measured_asks_every_step():
    gate = Gate()
    assert all(run(gate, 100, time=0.0))  # a replay charging nothing, an unmeasured cost curve


def test_the_first_ask_s_time_is_left_out():
    """It indexes the prompt: a cost once per text."""
    gate = Gate()
    gate.ask(PLAIN)
    gate.learn(0, PLAIN, 30.0)
    assert gate.time == 0.0 and gate.wait == 1
    gate.ask(PLAIN)
    gate.learn(0, PLAIN, 0.2)
    assert gate.time == 0.2


def test_the_gain_is_weighed_against_a_plain_step_under_the_limits_the_step_is_planned_with():
    """A lane's step is asked before the lanes before it lay out their rows and planned after:
    its plain cost then is the one its planned cost is weighed against."""
    gate = Gate()
    gate.ask(PLAIN)
    gate.plain(2 * PLAIN)  # the rows of the lanes before it make a row cost more
    gate.learn(0, 2 * PLAIN, 0.0)  # a plain step, planned under those limits: no gain, no loss
    assert gate.gain == Gate.DECAY * Gate.START_GAIN
    gate.ask(PLAIN)
    gate.learn(0, 2 * PLAIN, 0.0)  # the same step weighed against the plain cost it was asked with: a loss
    assert gate.gain < Gate.DECAY ** 2 * Gate.START_GAIN
