"""llamaspec compare: the parser of llama.cpp's summary lines on the programs' real output
(tests/data/llama_cpp), and the command end to end on SmolLM2 against the real programs where
they are built, with missing and failing programs reported, not fatal."""

from __future__ import annotations

import json
import stat

import pytest

from llamaspec.measure.compare import (CompareReport, agreement, find_program)
from llamaspec.measure.report import validate


def validate_report(report):
    validate(report, CompareReport)

from conftest import assert_one_line_error, run


def test_compare_end_to_end(smol, tmp_path):
    """Against the programs on PATH or in scripts/build_llama_cpp.sh's default directory: those
    found must run and be parsed; those not found must be reported as missing."""
    out = tmp_path / "compare.json"
    strategies = ["plain", "draft", "lookup"]
    result = run("compare", "-m", smol, "-md", smol, "-t", "2", "-c", "1024", "-n", "12", "--draft-max", "4",
                 "--draft-p-min", "0", "--prompt-name", "open_chat", "--strategies", ",".join(strategies),
                 "--json", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    validate_report(report)
    assert [r["strategy"] for r in report["rows"]] == strategies and report["prompt"] == "open_chat"
    ran = 0
    for row in report["rows"]:
        ours = row["llamaspec"]
        assert ours["decode_tps"] > 0 and ours["prompt_tps"] > 0 and 0 < ours["n_decoded"] <= 12 and ours["text"]
        assert row["program"] in result.stdout
        if find_program(row["program"]) is None:
            assert row["status"] == "missing: build it with scripts/build_llama_cpp.sh" and row["llama_cpp"] is None
            assert row["status"] in result.stdout and row["ratio"] is None and row["command"] == []
            continue
        ran += 1
        theirs = row["llama_cpp"]
        assert row["status"] == "ok", row["status"]
        assert theirs["decode_tps"] > 0 and theirs["prompt_tps"] > 0 and theirs["text"]
        assert row["ratio"] == pytest.approx(ours["decode_tps"] / theirs["decode_tps"])
        # near-ties may legitimately differ (a verify batch is not one token at a time): the
        # verdict is reported, and must be the right one
        assert row["text"] == agreement(ours["text"], theirs["text"]) and row["text"] in result.stdout
        assert f"{row['ratio']:.2f}x" in result.stdout
        if row["strategy"] == "draft":  # --draft-p-min 0: their draft always proposes; ours when it pays
            assert theirs["n_drafted"] > 0 and theirs["accept"] is not None and ours["n_drafted"] >= 0
        elif row["strategy"] == "lookup":
            assert theirs["n_drafted"] is not None and theirs["n_accept"] is not None
        else:  # llama-completion prints no speculation counters
            assert theirs["n_drafted"] is None and ours["n_drafted"] == 0
    print(f"{ran} of {len(strategies)} llama.cpp programs found and compared")


def test_compare_reports_missing_and_failing_programs(smol, tmp_path):
    failing = tmp_path / "llama-completion"
    failing.write_text("#!/bin/sh\necho 'main: error: something went wrong' >&2\nexit 3\n")
    failing.chmod(failing.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "compare.json"
    result = run("compare", "-m", smol, "-t", "2", "-c", "1024", "-n", "4", "-p", "<|im_start|>user\nHi<|im_end|>\n",
                 "--strategies", "plain,lookup", "--bin-dir", str(tmp_path), "--json", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    validate_report(report)
    plain, lookup = report["rows"]
    assert plain["status"] == "failed (exit code 3): main: error: something went wrong"
    assert lookup["status"] == "missing: build it with scripts/build_llama_cpp.sh"
    for row in (plain, lookup):
        assert row["llama_cpp"] is None and row["llamaspec"]["decode_tps"] > 0 and row["status"] in result.stdout
    assert report["prompt"] == "given"


def test_compare_user_errors(smol):
    assert_one_line_error(run("compare", "-m", smol, "--strategies", "plain,auto"), "cannot compare strategy")
    assert_one_line_error(run("compare", "-m", smol, "--strategies", "draft"), "needs a draft model")
    assert_one_line_error(run("compare", "-m", smol, "-p", "x", "-f", "y"), "-p or -f, not both")
    assert_one_line_error(run("compare", "-m", smol, "--prompt-name", "nope"), "unknown prompt 'nope'")
    assert_one_line_error(run("compare", "-m", smol, "--repeat", "0"), "repeat must be >= 1")
