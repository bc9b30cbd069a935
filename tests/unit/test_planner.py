"""The planner on synthetic cost curves (flat: an ideal GPU; steep: a small CPU; non-monotone: no
model) and on one measured on an H200 (tests/data/gpu_curve.json, by scripts/gpu_check.sh)."""

import json
from dataclasses import replace

import numpy as np
import pytest

from llamaspec.sources.base import Candidate, Window
from llamaspec.planning.costs import REFERENCE_CPU, CostCurve, CostModel
from llamaspec.planning.planner import Limits, Planner, _nodes as plan_nodes
from llamaspec.sources import default_registry
from llamaspec.sampling import Distribution

from conftest import DATA

ROOMY = Limits(max_depth=64, max_rows=512, room=1000, max_leaves=8)
GPU = CostCurve([1.0] * 32, 30.0, 2, "gpu")  # verifying n tokens costs what one does
# SmolLM2-135M on an H200, decodes replayed as captured CUDA graphs: one row 1.36 ms, 2-8 rows
# 1.06-1.36 times that, 9-16 rows 2.3-2.6, 32 rows 3.2; a change of row count 2.66 more
H200 = CostCurve(**json.loads((DATA / "gpu_curve.json").read_text())["curve"])


def _nodes(candidates, rates):
    """The planning trie, with the built-in sources' shadowing."""
    return plan_nodes(candidates, rates, default_registry().shadowed())


def curve(xs, ys, ms=30.0):
    return CostCurve([float(c) for c in np.interp(np.arange(1, 33), xs, ys)], ms, 2, "cpu")


def cand(tokens, source="lookup"):
    return Candidate(tuple(tokens), source, (0,) * len(tokens))


def choose(costs, cands, rate, window=None, limits=ROOMY, fixed=frozenset(), reached=1.0):
    """The planner's choice when every token is accepted with ``rate`` and steps so far reached
    ``reached`` tokens per unit of cost."""
    planner = Planner(CostModel(costs), fixed)
    planner.learn(reached * 100, 100.0)
    return planner.choose(cands, [[rate] * len(c.tokens) for c in cands], window, limits)


def test_a_flat_curve_verifies_long_drafts_and_wide_tries():
    cands = [cand(range(1, 21)), cand([1, 2, 30, 31]), cand([40, 41])]
    choice = choose(GPU, cands, 0.6)
    assert choice.lengths == (20, 4, 2)  # everything: a row costs nothing
    assert choice.expected > 2 and choice.cost == pytest.approx(1.0)


@pytest.mark.parametrize("rate, lengths", [(0.6, (4, 3, 2)), (0.8, (7, 2, 0)), (0.9, (27, 4, 2))])
def test_the_measured_gpu_curve_verifies_up_to_the_eighth_row_or_long_and_wide(rate, lengths):
    """Replayed, 2 to 8 rows cost 1.06-1.36 single-token decodes there, 9 rows 2.3, 32 rows 3.2:
    a step with no shape to keep verifies up to the 8th row, or long and wide."""
    cands = [cand(range(1, 31)), cand([1, 2, 30, 31]), cand([40, 41])]
    assert choose(H200, cands, rate).lengths == lengths


def test_a_steep_curve_verifies_short_drafts_or_none():
    cands = [cand(range(1, 21))]
    assert choose(REFERENCE_CPU, cands, 0.3).lengths == (0,)  # a plain step
    short = choose(REFERENCE_CPU, cands, 0.8).lengths[0]
    assert 1 <= short <= 3
    assert choose(REFERENCE_CPU, cands, 0.98, reached=2.0).lengths[0] == 15  # 16 rows cost less than 12 here
    assert choose(REFERENCE_CPU, cands, 0.98, reached=1.0).lengths[0] == 20  # at plain's price, every row pays


def test_lookups_estimate_stands_where_lookahead_proposes_the_same_tokens():
    """Lookahead's pool copies the text lookup reads: where both propose a token, lookup's
    estimate counts (it knows the copy is about to be edited), not the higher of the two."""
    copy = [cand([5, 6, 7], "lookup"), cand([5, 6, 7], "lookahead")]
    _, prob, _, _ = _nodes(copy, [[0.9, 0.2, 0.9], [0.95, 0.95, 0.95]])
    assert prob[1:] == pytest.approx([0.9, 0.18, 0.162])
    planner = Planner(CostModel(REFERENCE_CPU))
    assert planner.choose(copy, [[0.9, 0.2, 0.9], [0.95, 0.95, 0.95]], None, ROOMY).lengths[0] == 1
    # what lookahead proposes alone keeps its own estimate
    _, prob, _, _ = _nodes([cand([5, 6], "lookup"), cand([5, 8], "lookahead")], [[0.9, 0.2], [0.95, 0.7]])
    assert sorted(prob[1:]) == pytest.approx([0.18, 0.95 * 0.7, 0.9])  # its chain


def test_draft_heads_do_not_raise_what_lookup_copies():
    """Where draft heads guess a token lookup copies, lookup's estimate counts: a copied run's
    rates are lookup's to know (the 1.5B's heads, rated by their own, took code_edit from 1.64x
    to 1.40x plain on a 2-core CPU, its steps cut short of where the copy went on)."""
    copy = [cand([5, 6, 7], "lookup"), cand([5, 6], "heads")]
    _, prob, _, _ = _nodes(copy, [[0.9, 0.5, 0.9], [0.95, 0.95]])
    assert prob[1:] == pytest.approx([0.9, 0.45, 0.405])


def test_a_non_monotone_curve_is_searched_whole():
    dip = curve([1, 2, 8, 12, 16, 32], [1, 1.9, 8, 9, 5, 12])  # 16 rows far cheaper than 9 .. 15
    assert choose(dip, [cand(range(1, 31))], 0.97, reached=2.5).lengths == (15,)


def test_siblings_exclude_each_other():
    cands = [cand([1, 2]), cand([3, 4])]
    parent, prob, depth, support = _nodes(cands, [[0.9, 0.9], [0.9, 0.9]])
    first = [v for v in range(1, len(parent)) if parent[v] == 0]
    assert sorted(round(prob[v], 6) for v in first) == [0.1, 0.9]  # the second gets what the first leaves
    # a node two candidates share takes the better chain, not a product of both
    parent, prob, _, _ = _nodes([cand([1, 2]), cand([1, 3])], [[0.5, 0.9], [0.8, 0.5]])
    assert prob[1] == pytest.approx(0.8)


def test_a_sampled_draft_is_planned_on_its_own_branch():
    q = Distribution.point(1)
    draft = Candidate((1, 2), "draft", (9, 9), (q, q))
    parent, _, _, support = _nodes([cand([1, 2]), draft], [[0.5, 0.5], [0.9, 0.9]])
    assert len(parent) == 5  # root, the lookup's two nodes, the draft's own two


def test_limits_are_kept():
    cands = [cand(range(1, 21)), cand([1, 30]), cand([40]), cand([50])]
    assert sum(choose(GPU, cands, 0.6, limits=Limits(64, 4, 1000)).lengths) <= 3 + 1  # 3 rows besides the root
    assert max(choose(GPU, cands, 0.6, limits=Limits(2, 512, 1000)).lengths) == 2
    one = choose(GPU, cands, 0.6, limits=Limits(64, 512, 1000, max_leaves=1))
    assert one.lengths == (20, 1, 0, 0)  # one branch only (the second shares its first token)


def test_a_fixed_source_is_verified_whole_and_its_rider_always_rides():
    window = Window(((5, 1, (0,), True),) * 11, 4, 0.0)
    choice = choose(REFERENCE_CPU, [cand([1, 2, 3], "lookahead"), cand([9, 8], "lookup")], 0.1, window,
                    fixed=frozenset({"lookahead"}))
    assert choice.lengths[0] == 3 and choice.ride


def test_a_rider_rides_when_it_pays():
    window = Window(((5, 1, (0,), True),) * 11, 4, 0.1)
    assert choose(GPU, [], 0.5, window).ride
    assert not choose(REFERENCE_CPU, [], 0.5, window).ride


def test_the_draft_model_is_asked_on_a_flat_curve_and_idle_on_a_steep_one():
    gpu = Planner(CostModel(GPU, {"draft": CostCurve([1.0] * 32, 6.0, 2, "gpu")}))  # a draft token costs 0.2
    budget, _ = gpu.ask("draft", 0.8, 0, 16, [], [], None, ROOMY)
    assert budget is not None and budget.max_len == 16 and budget.stop_below == pytest.approx(0.2)
    cpu = Planner(CostModel(REFERENCE_CPU, {"draft": CostCurve(REFERENCE_CPU.relative, 18.0, 2, "cpu")}))
    budget, why = cpu.ask("draft", 0.9, 0, 16, [], [], None, ROOMY)
    assert budget is None
    assert why.startswith("draft idle: a drafted token costs 0.60 of a target token") and "expected at" in why


@pytest.mark.parametrize("token, asked", [(0.05, True), (0.2, True), (0.5, True), (1.0, False)])
def test_the_draft_model_is_asked_on_the_measured_gpu_curve_when_its_tokens_are_cheap(token, asked):
    """A draft whose token costs half its target's drafts there; one that costs what its
    target's does (SmolLM2 drafting for itself on the H200) stays idle."""
    planner = Planner(CostModel(H200, {"draft": CostCurve(H200.relative, token * H200.ms_per_token, 16, H200.backend)}))
    budget, why = planner.ask("draft", 0.9, 0, 16, [], [], None, ROOMY)
    assert (budget is not None and budget.max_len == 16) == asked, why


def test_the_price_of_a_row_is_the_rate_already_reached():
    planner = Planner(CostModel(REFERENCE_CPU))
    assert planner.rate == 1.0
    planner.learn(10, 5.0)
    assert planner.rate == pytest.approx(2.0)
    cands = [cand(range(1, 21))]
    rates = [[0.8] * 20]
    cheap = Planner(CostModel(REFERENCE_CPU)).choose(cands, rates, None, ROOMY)
    assert planner.choose(cands, rates, None, ROOMY).lengths[0] <= cheap.lengths[0]
    planner.learn(0, 1000.0)
    assert planner.rate == 1.0  # never below plain decoding's


def test_a_token_after_which_the_copy_ends_is_worth_a_decode():
    """At the price of 2 tokens per unit of cost, a likely token inside a copy that goes on does
    not pay for its row (the next step copies it at that rate), but one after which the copy
    ends does: the target's token after it, which no source offers, comes as this step's bonus
    instead of taking a plain step of its own."""
    def verified(rates):
        planner = Planner(CostModel(REFERENCE_CPU))
        planner.learn(200, 100.0)
        return planner.choose([cand([5, 6])], [rates], None, ROOMY)

    goes_on, ends = verified([0.95, 0.95]), verified([0.95, 0.1])
    assert goes_on.lengths == (0,)
    assert ends.lengths == (1,)
    assert ends.expected == pytest.approx(1.95) and ends.value == pytest.approx(1 + 2 * 0.95)


def test_calibration_follows_what_verified_steps_accepted():
    """Verified candidates that are accepted less than rated (the planner verifies the ones rated
    best, so their ratings run high) make it verify less; copies that go on longer than the
    per-token ratings multiply out to make it verify more; plain steps bring it back."""
    cands = [cand(range(1, 9))]
    rates = [[0.85] * 8]
    planner = Planner(CostModel(REFERENCE_CPU))
    assert planner.calibration == 1.0
    before = planner.choose(cands, rates, None, ROOMY).lengths[0]
    assert 1 <= before < 8
    for _ in range(30):
        planner.learn(1, 2.0, estimated=1.5)  # verified, rated 1.5 tokens, none accepted
    assert planner.calibration < 0.4
    assert planner.choose(cands, rates, None, ROOMY).lengths[0] < before
    for _ in range(60):
        planner.learn(1, 1.0)  # plain steps
    assert 0.8 < planner.calibration < 1.0
    longer, rated = Planner(CostModel(REFERENCE_CPU)), Planner(CostModel(REFERENCE_CPU))
    for _ in range(30):
        longer.learn(9, 5.0, estimated=4.0)  # 8 accepted where 4 were rated
        rated.learn(9, 5.0, estimated=8.0)  # as rated: the same rate reached
    assert longer.calibration > 1.5 and rated.calibration == pytest.approx(1.0, abs=0.01)
    assert longer.choose(cands, rates, None, ROOMY).lengths[0] > rated.choose(cands, rates, None, ROOMY).lengths[0]


class Unbounded(Planner):
    """A planner that always builds and scans the trie (no bound)."""

    def _may_pay(self, rates, window, limits, added):
        return True


@pytest.mark.parametrize("seed", range(40))
def test_the_bound_never_changes_a_choice(seed):
    """Skipping the trie where the bound says nothing can beat a plain step chooses what the full
    scan chooses, on random candidates, estimates, windows and curves (steep, flat, with a dip)."""
    rng = np.random.default_rng(seed)
    costs = [REFERENCE_CPU, GPU, curve([1, 2, 8, 12, 16, 32], [1, 1.9, 8, 9, 5, 12]),
             curve([1, 2, 32], [1, 1.8, 40])][seed % 4]
    cands = [cand(rng.integers(0, 4, rng.integers(1, 12)), ("lookup", "lookahead")[int(rng.integers(0, 2))])
             for _ in range(rng.integers(1, 5))]
    rates = [list(rng.uniform(0.0, 1.0, len(c.tokens)) ** rng.uniform(0.3, 4)) for c in cands]
    window = Window(((7, 1, (0,), True),) * int(rng.integers(1, 4)), 1, float(rng.uniform(0, 2))) if seed % 3 == 0 else None
    limits = Limits(max_depth=int(rng.integers(1, 12)), max_rows=int(rng.integers(2, 20)), room=100,
                    base_rows=int(rng.integers(0, 3)))
    reached, estimated = float(rng.uniform(1, 2)), float(rng.uniform(0, 50)) if seed % 2 else 0.0
    choices = []
    for planner in (Planner(CostModel(costs)), Unbounded(CostModel(costs))):
        planner.learn(reached * 100, 100.0, estimated)  # a calibration away from 1 when estimated
        choices.append(planner.choose(cands, rates, window, limits))
    assert choices[0] == choices[1]


def test_no_more_rows_than_the_curve_measured_unless_a_source_is_verified_whole():
    cands = [cand(range(1, 41)), cand(range(100, 120))]
    assert sum(choose(GPU, cands, 0.99).lengths) == 31  # the pending token and 31: the curve's 32 rows
    assert choose(GPU, cands, 0.99, fixed=frozenset({"lookup"})).lengths == (40, 20)


def test_a_token_estimated_below_the_cheapest_row_is_not_worth_one():
    """stop_below: the cheapest mean of the rows a plan may add to a plain step, over the
    calibration; 0 for fixed sources. Where a change of row count costs, the rows' own cost."""
    steep = Planner(CostModel(curve([1, 32], [1, 32])))  # a row costs a decode whatever the batch
    assert steep.stop_below(ROOMY) == pytest.approx(1.0)
    dearer = Planner(CostModel(curve([1, 2, 4, 32], [1, 1.8, 2.5, 32])))  # 4 rows: 0.5 a row added
    assert dearer.stop_below(ROOMY) == pytest.approx(0.5)
    assert dearer.stop_below(Limits(max_depth=8, max_rows=2, room=100)) == pytest.approx(0.8)  # 1 row added at most
    dearer.learn(2, 1.0, estimated=8.0)  # estimates twice what was accepted, before the prior's 8
    assert dearer.stop_below(ROOMY) == pytest.approx(0.5 / dearer.calibration) and dearer.calibration < 1
    assert Planner(CostModel(curve([1, 32], [1, 32])), frozenset({"lookup"})).stop_below(ROOMY) == 0.0
    at_one = Limits(max_depth=8, max_rows=8, room=100, shape=1, switch=3.0)
    own = Planner(CostModel(H200)).stop_below(Limits(max_depth=8, max_rows=8, room=100))
    assert Planner(CostModel(H200)).stop_below(at_one) == pytest.approx(own) and own < 0.1


def test_row_costs_kept_between_steps_are_the_cost_model_s():
    """The planner keeps what n rows add from step to step; what it keeps is what it would compute
    afresh: after the cost model recomputes its verify costs (decodes measured slower), behind a
    longer text (another length step), and with rows of other sequences in the decode."""
    deep = CostCurve([float(c) for c in np.interp(np.arange(1, 33), [1, 32], [1, 8])], 30.0, 2, "cpu",
                     deep=[float(c) for c in np.interp(np.arange(1, 33), [1, 32], [1, 4])], deep_ms_per_token=60.0,
                     deep_context=4096)
    costs = CostModel(deep)
    planner = Planner(costs)
    short = Limits(max_depth=8, max_rows=16, room=1000, length=100)
    seen = [planner._added(short, 6)]  # a step before
    for limits in (short, replace(short, base_rows=2), replace(short, length=3000)):
        kept = planner._added(limits, 6)
        assert kept == Planner(costs)._added(limits, 6)
        seen.append(kept)
    for _ in range(CostModel.REFRESH):  # 6 rows three times slower than measured, one row as measured
        costs.observe(CostModel.TARGET, 6, 3 * deep.ms(6, 100) / 1000, 100)
        costs.observe(CostModel.TARGET, 1, deep.ms(1, 100) / 1000, 100)
    slower = planner._added(short, 6)
    assert slower == Planner(costs)._added(short, 6) and slower > seen[0]
    assert len(set(seen)) == 3  # the three differ
