"""llamaspec bench and llamaspec profile on SmolLM2: the shipped suite, the report's fields and
JSON shape, the plot, the cost curve and its cache, and one clear line for bad input."""

from __future__ import annotations


import pytest


from llamaspec.measure.report import BenchReport, Row, check_shape, shape_of, validate
from llamaspec.measure.bench import rotated


def validate_report(report):
    validate(report, BenchReport)



def _row(**changes):
    row = {"prompt": "p", "strategy": "plain", "decode_tps": [1.0], "decode_tps_median": 1.0, "decode_tps_min": 1.0,
           "decode_tps_max": 1.0, "speedup": 1.0, "bound_share": 0.5, "accept": 0.0, "tokens_per_call": 1.0,
           "prompt_tps": 2.0, "n_predict": 8, "n_drafted": 0, "n_accept": 0, "n_target_calls": 8,
           "sources": {"lookup": {"drafted": 3, "accepted": 1, "steps": 2}}, "peak_rss_mb": 100.0, "output": "same",
           "grammar_ms_per_token": 0.0, "depth": 0.0, "rows": 0.0, "branches": 0.0,
           "python_share": 0.1, "asked": 1.0}
    row.update(changes)
    return row


def test_every_strategy_runs_once_in_every_place_of_the_order():
    names = ["plain", "lookup", "lookahead", "auto"]
    orders = [rotated(names, i) for i in range(len(names))]
    assert orders[0] == names
    for order in orders:
        assert sorted(order) == sorted(names)
    for place in range(len(names)):
        assert sorted(order[place] for order in orders) == sorted(names)


def test_validate_report_names_what_is_wrong():
    shape = shape_of(Row)
    check_shape(_row(), shape)
    check_shape(_row(speedup=2), shape)  # a float field takes an int
    bad = [(_row(output=None), "row.output: expected str"), (_row(n_predict=8.5), "row.n_predict: expected int"),
           (_row(decode_tps=[1.0, "x"]), r"row.decode_tps\[1\]: expected float"),
           (_row(n_accept=True), "row.n_accept: expected int"),
           (_row(sources={"lookup": {"drafted": 3}}), "row.sources.lookup: expected the keys")]
    for row, message in bad:
        with pytest.raises(ValueError, match=message):
            check_shape(row, shape, "row")
    missing = _row()
    del missing["peak_rss_mb"]
    with pytest.raises(ValueError, match="expected the keys"):
        check_shape(missing, shape, "row")
    with pytest.raises(ValueError, match="expected the keys"):
        check_shape(_row(extra=1), shape, "row")
    with pytest.raises(ValueError, match="report: expected the keys"):
        validate_report({"rows": []})
