"""The cost model: measured curves, refined online from the wall time of every decode (no model)."""

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
    """Measured behind 256 and 1024 cached tokens (the numbers of a 2-core Xeon): a decode's
    milliseconds follow the length linearly, between the two and beyond, so a batch of 16 costs
    more single-token decodes behind a long text."""
    curve = CostCurve([1.0] * 15 + [3.8] * 17, 60.0, 2, "cpu", 256, [1.0] * 15 + [4.3] * 17, 63.0, 1024)
    assert curve.cost(16) == 3.8 and curve.cost(16, 256) == pytest.approx(3.8)
    assert curve.cost(16, 1024) == pytest.approx(4.3)
    assert curve.ms(16, 640) == pytest.approx((3.8 * 60 + 4.3 * 63) / 2)  # half way
    assert curve.ms(1, 1792) == pytest.approx(66.0) and curve.ms(16, 1792) == pytest.approx(2 * 4.3 * 63 - 3.8 * 60)
    m = CostModel(curve)
    assert m.verify(16) == pytest.approx(3.8)  # no length given: as measured
    assert m.verify(16, 1024) == pytest.approx(4.3)
    assert m.verify(16, 1024 + CostModel.LENGTH_STEP - 1) == pytest.approx(4.3)  # lengths count in steps
    assert m.verify(16, 2048) > 4.3 and m.verify(16, 256) == pytest.approx(3.8)
    # the refinement measures against the cost at the decode's length: a 16-row decode that takes
    # what the curve says there changes nothing
    m.observe("target", 1, curve.ms(1, 2048) / 1000, 2048)
    m.observe("target", 16, curve.ms(16, 2048) / 1000, 2048)
    assert m.ms("target", 16, 2048) == pytest.approx(curve.ms(16, 2048))
