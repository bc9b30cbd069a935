"""Where a decode of another row count than the last one's costs more (a GPU's captured graphs):
a decode is padded to the last one's rows where that costs less than changing them, a step that
changes them is charged the switch, and a shape is left once keeping it has lost a switch's
worth. Planner, engine, replay and copy bound alike."""

from __future__ import annotations


import pytest

from llamaspec.measure.replay import copy_oracle, replay, speculator
from llamaspec.planning.costs import CostCurve


from conftest import ANSWERS

# Replayed decodes of SmolLM2-135M on an H200 (scripts/gpu_graphs.py): 1 and 2 rows alike, 8
# rows 1.30 single decodes, 16 rows 2.35; a change of row count costs about 2.1 more.
STICKY = CostCurve([1.0, 1.0, 1.09, 1.18, 1.21, 1.24, 1.27, 1.30] + [2.35] * 8 + [2.95] * 16, 1.37, 16,
                   "CUDA0 (all layers)", switch=2.1)


def test_replays_charge_every_change_of_shape_and_stay_below_the_copy_bound(qwen_vocab):
    """The copy bound with switches is below the one without, and the replay below it."""
    item = ANSWERS["code_edit"]
    free = CostCurve(STICKY.relative, STICKY.ms_per_token, 16, "CUDA0 (all layers)")
    bound = copy_oracle(item["prompt"], item["answer"], STICKY.cost, STICKY.switch)
    assert 1 < bound < copy_oracle(item["prompt"], item["answer"], free.cost)
    stats = replay(item["prompt"], item["answer"], speculator(STICKY, vocab=qwen_vocab))
    assert 1.5 < stats.speedup < bound
    prompt = list(range(1, 21))
    assert copy_oracle(prompt, prompt, STICKY.cost, STICKY.switch) == pytest.approx(19 / STICKY.cost(19))
