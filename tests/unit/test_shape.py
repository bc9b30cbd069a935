"""Where a decode of another row count than the last one's costs more (a GPU's captured graphs):
a decode is padded to the last one's rows where that costs less than changing them, a step that
changes them is charged the switch, and a shape is left once keeping it has lost a switch's
worth. Planner, engine, replay and copy bound alike."""

from __future__ import annotations

import itertools

import pytest

from llamaspec.planning.costs import CostCurve, CostModel
from llamaspec.planning.planner import Limits, Planner
from llamaspec.planning.shape import Shape, decode
from llamaspec.sources.base import Candidate
from llamaspec.sources.lookup import LookupSource

from fakes import check_kv, copying_prompt, engine, greedy_text


# Replayed decodes of SmolLM2-135M on an H200 (scripts/gpu_graphs.py): 1 and 2 rows alike, 8
# rows 1.30 single decodes, 16 rows 2.35; a change of row count costs about 2.1 more.
STICKY = CostCurve([1.0, 1.0, 1.09, 1.18, 1.21, 1.24, 1.27, 1.30] + [2.35] * 8 + [2.95] * 16, 1.37, 16,
                   "CUDA0 (all layers)", switch=2.1)
ROOMY = Limits(max_depth=64, max_rows=64, room=1000, max_leaves=8)


def test_a_decode_is_padded_to_the_last_shape_where_that_costs_less_than_a_switch():
    verify = STICKY.cost
    assert decode(1, 8, 2.1, verify) == (8, pytest.approx(1.30))  # 1.30 < 1.00 + 2.1
    assert decode(1, 32, 1.0, verify) == (1, pytest.approx(2.0))  # 2.95 > 1.00 + 1.0: switch
    assert decode(12, 8, 2.1, verify) == (12, pytest.approx(2.35 + 2.1))  # more rows: switch
    assert decode(8, 8, 2.1, verify) == (8, pytest.approx(1.30))
    assert decode(1, 0, 2.1, verify) == (1, pytest.approx(1.0))  # none to keep: nothing to change
    assert decode(1, 8, 0.0, verify) == (1, pytest.approx(1.0))  # row counts cost nothing: as asked


def test_a_shape_is_kept_while_what_it_accepts_pays_for_it_and_left_once_it_has_lost_a_switch():
    shape = Shape(switch=2.1)
    shape.decoded(8, 5, STICKY.cost)  # a verify of 8 rows
    assert shape.kept == 8 and not shape.warm(8)  # the first of a shape runs unreplayed
    for _ in range(6):  # plain steps padded to 8: 0.30 more each, nothing accepted
        shape.decoded(8, 0, STICKY.cost)
        assert shape.kept == 8
    assert shape.warm(8) and not shape.warm(1)
    shape.decoded(8, 1, STICKY.cost)  # a step whose free rows accepted a token: paid for itself and more
    assert shape.loss == pytest.approx(6 * 0.30 + 0.30 - 1)
    for _ in range(4):
        shape.decoded(8, 0, STICKY.cost)
    assert shape.kept == 0  # 2.1 lost: the next decode takes its own rows
    shape.decoded(1, 0, STICKY.cost)
    assert shape.rows == 1 and shape.loss == 0 and shape.kept == 1
    free = Shape()
    free.decoded(8, 0, STICKY.cost)
    free.decoded(1, 0, STICKY.cost)
    assert free.warm(1) and free.loss == 0  # row counts cost nothing: every decode is warm


def cand(tokens):
    return Candidate(tuple(tokens), "lookup", (0,) * len(tokens))


def limits(**shape):
    return Limits(**{**ROOMY.__dict__, **shape})


def test_the_planner_counts_rows_up_to_the_last_shape_as_paid_and_another_shape_as_a_switch():
    """A 3-token candidate accepted 30% of the time: not worth a change from one row, worth
    verifying in the rows of the last decode's shape; rows past it cost the switch."""
    planner = Planner(CostModel(STICKY))
    cands, rates = [cand([5, 6, 7])], [[0.3] * 3]
    single = planner.choose(cands, rates, None, limits(shape=1, switch=2.1))
    assert single.lengths == (0,) and single.cost == pytest.approx(1.0)
    within = planner.choose(cands, rates, None, limits(shape=8, switch=2.1))
    assert within.lengths == (3,) and within.cost == pytest.approx(1.30)
    long = planner.choose([cand(range(10, 30))], [[0.95] * 20], None, limits(shape=8, switch=2.1))
    rows = 1 + sum(long.lengths)
    assert rows > 8 and long.cost == pytest.approx(STICKY.cost(rows) + 2.1)
    left = planner.choose(cands, rates, None, limits(shape=0, switch=2.1))  # a shape being left
    assert left.cost == pytest.approx(1.0)


def test_on_one_row_the_planner_says_what_a_wider_plan_would_score_more_without_the_switch():
    """The 3-token candidate accepted 30% of the time is not worth a change from one row: the plan
    stays plain, and says what verifying it would have scored more had the change cost nothing."""
    planner = Planner(CostModel(STICKY))
    cands, rates = [cand([5, 6, 7])], [[0.3] * 3]
    single = planner.choose(cands, rates, None, limits(shape=1, switch=2.1))
    free = planner.choose(cands, rates, None, limits(shape=0, switch=2.1))
    assert single.lengths == (0,) and free.lengths != (0,)
    assert single.forgone == pytest.approx(free.value - free.cost - (single.value - single.cost))
    assert free.forgone == 0  # not on one row: nothing forgone
    hopeless = planner.choose(cands, [[0.0] * 3], None, limits(shape=1, switch=2.1))
    assert hopeless.forgone == 0  # a plan no better without the switch forgoes nothing


def test_one_row_is_left_once_its_plans_have_forgone_a_switch_s_worth_of_late():
    """Rent or buy, entering: each single-row decode adds what its plan forwent, the sum decaying
    by FORGONE_DECAY a decode; once it reaches the switch, the next decode takes its own rows."""
    d = Shape.FORGONE_DECAY
    steady = 2.1 * (1 - d) * 1.05  # forgone each step: its decayed sum passes the switch in time
    shape = Shape(switch=2.1)
    shape.decoded(1, 0, STICKY.cost)
    steps = 0
    while shape.kept == 1:
        shape.decoded(1, 0, STICKY.cost, steady)
        steps += 1
        assert steps < 200
    assert shape.kept == 0 and shape.forgone >= 2.1
    shape.decoded(3, 1, STICKY.cost)  # entered: what was forgone is spent
    assert shape.rows == 3 and shape.forgone == 0 and shape.kept == 3
    rare = Shape(switch=2.1)
    rare.decoded(1, 0, STICKY.cost)
    for _ in range(500):  # too little a step: the decayed sum stays under the switch
        rare.decoded(1, 0, STICKY.cost, 2.1 * (1 - d) * 0.9)
    assert rare.kept == 1


def test_the_engine_pads_decodes_and_the_cache_holds_only_the_text():
    """On a fake target whose row counts cost: decodes keep their shape for several steps
    (padded on a scratch sequence emptied after each decode), the text is plain greedy's and
    every lane's cache holds exactly its text after every step."""
    prompt = copying_prompt()
    eng, ctx = engine([LookupSource()], curve=STICKY)
    text = []
    for step in eng.steps(prompt, max_new=60):
        text += step.tokens
        check_kv(ctx, eng.tokens)
        assert ctx.used_seqs() <= {0}
    assert text == greedy_text(prompt, len(text))
    decodes = ctx.decodes[1:]  # after the prompt's
    assert max(decodes) > 2
    assert max(len(list(g)) for _, g in itertools.groupby(decodes)) >= 3  # a shape kept for several steps
    flat, flat_ctx = engine([LookupSource()])  # row counts cost nothing: nothing padded
    list(flat.steps(prompt, max_new=60))
    assert 1 in flat_ctx.decodes[1:] or len(set(flat_ctx.decodes[1:])) > 3
