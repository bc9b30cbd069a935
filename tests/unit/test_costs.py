"""The cost model: measured curves, refined online from the wall time of every decode (no model)."""

import numpy as np
import pytest

from llamaspec.planning.costs import REFERENCE_CPU, CostCurve, CostModel


def test_costs_relative_to_one_target_token():
    draft = CostCurve(REFERENCE_CPU.relative, 18.0, 2, "cpu")  # 0.6 of a target token
    m = CostModel(REFERENCE_CPU, {"draft": draft})
    assert m.verify(1) == 1.0 and m.verify(16) == pytest.approx(6.74)
    assert m.token("draft") == pytest.approx(0.6)
    # drafting 3 tokens after a catch-up of 10: one decode of 11 rows, then two of one
    assert m.proposing("draft", 3, 10) == pytest.approx((18.0 * REFERENCE_CPU.cost(11) + 2 * 18.0) / 30.0)
    assert m.units(0.030) == pytest.approx(1.0)


def test_a_curve_measured_on_a_busy_machine_is_corrected_by_what_decodes_take():
    m = CostModel(REFERENCE_CPU)
    for _ in range(60):  # the machine is idle now: single tokens take 15 ms, 16 rows 45 ms (3x, not 6.74x)
        m.observe("target", 1, 0.015)
        m.observe("target", 16, 0.045)
    assert m.verify(16) == pytest.approx(3.0, rel=0.05)
    assert m.ms("target", 1) == pytest.approx(15.0, rel=0.05)
    # a size never seen follows the machine's overall drift
    assert m.ms("target", 8) < REFERENCE_CPU.ms(8)


def test_no_size_costs_less_behind_a_longer_text():
    """The 2-core Xeon's curve (`llamaspec profile`): 3 and 14 rows measured dearer than 4 and 16
    behind 256 tokens, the deep sizes (1, 2, 4, 8, 16, 32) smooth. Drawn size by size through the
    two depths and beyond, 3 rows behind 3,400 tokens came to 1.06 single decodes (measured
    there: 2.3) and 14 rows to 3.0 (6.5): the planner bet 14 rows as if they cost 3. Beyond the
    deeper measurement no size grows less than one row does (nor than the fitted line)."""
    xeon = CostCurve([float(c) for c in np.interp(np.arange(1, 33), [1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32],
                                                  [1.0, 1.524, 1.931, 1.774, 2.637, 3.216, 3.812, 4.004, 4.551,
                                                   4.007, 5.367, 6.248, 7.11, 6.995])], 64.0, 2, "cpu", 256,
                     [float(c) for c in np.interp(np.arange(1, 33), [1, 2, 4, 8, 16, 32],
                                                  [1.0, 1.512, 1.798, 3.29, 4.333, 7.643])], 70.7, 1024)
    for n in range(1, 33):
        assert xeon.ms(n, 1024) < xeon.ms(n, 2048) < xeon.ms(n, 3400), n
        assert xeon.ms(n, 3400) - xeon.ms(n, 1024) >= 0.9 * (xeon.ms(1, 3400) - xeon.ms(1, 1024)), n
    assert xeon.cost(3, 3400) > xeon.cost(2, 3400) > 1.4 and xeon.cost(14, 3400) > 4.5


def test_flat_curves_are_not_refined():
    m = CostModel(CostCurve.flat())
    m.observe("target", 8, 1.0)
    assert m.verify(8) == 1.0


def test_verify_costs_follow_the_observations_every_refresh():
    m = CostModel(REFERENCE_CPU)
    before = m.verify(16)
    for i in range(CostModel.REFRESH // 2):
        assert m.verify(16) == before  # recomputed only every REFRESH decodes of the target
        m.observe("target", 1, 0.030)
        m.observe("target", 16, 0.090)  # 16 rows at 3x one token's 30 ms
    assert m.verify(16) < before


def test_costs_follow_the_length_of_the_text():
    """Measured behind 256 and 1024 cached tokens: between the two each size follows its own
    readings, beyond them at least the line a + b * n ms a cached token fitted over the sizes
    (here the sizes grew exactly so), so a batch of 16 costs more single-token decodes behind a
    long text."""
    shallow = [1.0] * 15 + [3.8] * 17  # one token 60 ms
    deep_ms = [60.0 * shallow[n - 1] + 768 * (0.002 + 0.004 * n) for n in range(1, 33)]
    curve = CostCurve(shallow, 60.0, 2, "cpu", 256, [ms / deep_ms[0] for ms in deep_ms], deep_ms[0], 1024)
    assert curve.growth() == pytest.approx((0.002, 0.004))
    assert curve.cost(16) == 3.8 and curve.cost(16, 256) == pytest.approx(3.8)
    assert curve.ms(16, 1024) == pytest.approx(deep_ms[15]) and curve.cost(16, 1024) > 4.0
    assert curve.ms(16, 640) == pytest.approx((3.8 * 60 + deep_ms[15]) / 2)  # half way
    assert curve.ms(1, 1792) == pytest.approx(60 + 1536 * 0.006)
    m = CostModel(curve)
    at_1024 = curve.cost(16, 1024)
    assert m.verify(16) == pytest.approx(3.8)  # no length given: as measured
    assert m.verify(16, 1024) == pytest.approx(at_1024)
    assert m.verify(16, 1024 + CostModel.LENGTH_STEP - 1) == pytest.approx(at_1024)  # lengths count in steps
    assert m.verify(16, 2048) > at_1024 and m.verify(16, 256) == pytest.approx(3.8)
    # the refinement measures against the cost at the decode's length: a 16-row decode that takes
    # what the curve says there changes nothing
    m.observe("target", 1, curve.ms(1, 2048) / 1000, 2048)
    m.observe("target", 16, curve.ms(16, 2048) / 1000, 2048)
    assert m.ms("target", 16, 2048) == pytest.approx(curve.ms(16, 2048))
