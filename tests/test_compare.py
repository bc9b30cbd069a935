"""llamaspec compare: the parser of llama.cpp's summary lines on the programs' real output
(tests/data/llama_cpp), and the command end to end on SmolLM2 against the real programs where
they are built, with missing and failing programs reported, not fatal."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from llamaspec.llama.binding import weight_repacking
from llamaspec.measure import compare
from llamaspec.measure.compare import (PROGRAMS, CompareReport, Side, agreement, find_program, generated_text,
                                     parse_summary)
from llamaspec.measure.report import validate


def validate_report(report):
    validate(report, CompareReport)

from conftest import assert_one_line_error, run

DATA = Path(__file__).parent / "data" / "llama_cpp"
PROMPT = (DATA / "prompt.txt").read_text(encoding="utf-8")[:-1]  # llama.cpp drops the file's last newline
ANSWER = "The quick brown fox jumps over lazy dog."

CAPTURED = {
    "plain": ("llama-completion",
              Side(decode_tps=58.71, prompt_tps=104.82, n_decoded=9, text=ANSWER)),
    "draft": ("llama-speculative-simple",
              Side(decode_tps=21.327, prompt_tps=68.52, n_decoded=10, n_drafted=16, n_accept=8, accept=50.0,
                   text=ANSWER)),
    "lookup": ("llama-lookup",
               Side(decode_tps=61.101, prompt_tps=186.331, n_decoded=12, n_drafted=16, n_accept=4, accept=25.0,
                    text=ANSWER + "<|im_end|>\n<|im_end|>")),
    "lookahead": ("llama-lookahead",  # its accepted n-gram tokens are coloured on stdout
                  Side(decode_tps=2.985, prompt_tps=112.868, n_decoded=9, n_accept=1, text=ANSWER + "<|im_end|>")),
}


@pytest.mark.parametrize("strategy", CAPTURED)
def test_parse_real_program_output(strategy):
    program, expected = CAPTURED[strategy]
    side = parse_summary((DATA / f"{program}.stderr").read_text(encoding="utf-8"))
    side.text = generated_text((DATA / f"{program}.stdout").read_text(encoding="utf-8"), PROMPT, strategy)
    assert side == expected
    assert PROGRAMS[strategy] == program
    assert agreement(ANSWER, side.text) == "same"


def test_parse_missing_and_undefined_values():
    assert parse_summary("") == Side()
    side = parse_summary("n_drafted    = 0\nn_accept     = 0\naccept       = -nan%\n")
    assert (side.n_drafted, side.n_accept, side.accept) == (0, 0, None)
    # llama-lookahead's perf line has an infinite rate; its "decoded" line is the one that counts
    lookahead = (DATA / "llama-lookahead.stderr").read_text(encoding="utf-8")
    assert "inf tokens per second" in lookahead and parse_summary(lookahead).decode_tps == 2.985


def test_generated_text_when_the_echo_differs_from_the_prompt():
    # a tokenizer that adds a space before the first word echoes " " + prompt: found by its tail
    out = "\n\n<s> " + PROMPT + "Hello there.\n\n\n\n"
    assert generated_text(out, PROMPT, "draft") == "Hello there."
    assert generated_text("\n\nsomething else\n\n\n\n", PROMPT, "lookup") == ""
    assert generated_text("Hi. [end of text]\n\n\n", PROMPT, "plain") == "Hi."
    assert generated_text("Hi there\n\n", PROMPT, "plain") == "Hi there"


def test_agreement():
    assert agreement("abc", "abc") == "same"
    assert agreement("abc", "abcdef<|im_end|>") == "same"  # llama.cpp ran past -n or printed the end token
    assert agreement("abcdef", "abc") == "same"
    assert agreement("abXdef", "abcdef") == "differs at char 2"
    assert agreement("", "abc") == "no text to compare"


def test_command_lines_carry_the_same_settings(tmp_path):
    settings = compare.matched(compare.BenchSettings("m.gguf", "d.gguf", n_predict=32, n_ctx=1024, n_gpu_layers_draft=-1,
                                                     sources=dict(draft_max=6, draft_min=1, draft_p_min=0.5)))
    lookahead = tuple(settings.setting(f"lookahead_{k}") for k in "wng")
    assert settings.setting("lookup_draft_max") == 6 and lookahead == (15, 5, 15) and settings.fixed == ("lookahead",)
    model, draft, prompt = Path("m.gguf"), Path("d.gguf"), tmp_path / "p.txt"
    common = ["-m", "m.gguf", "-f", str(prompt), "-n", "32", "-c", "1024", "-t", "3", "--temp", "0", "-ngl", "0"]
    common += [] if weight_repacking() else ["--no-repack"]  # this build's AMX kernels are off in both
    expected = {
        "plain": common + ["-no-cnv", "--no-display-prompt"],
        "draft": common + ["-md", "d.gguf", "-td", "3", "--spec-type", "draft-simple", "--spec-draft-n-max", "6",
                           "--spec-draft-n-min", "1", "--spec-draft-p-min", "0.5", "-ngld", "all"],
        "lookup": common + ["--spec-draft-n-max", "6"],
        "lookahead": common,
    }
    for strategy, args in expected.items():
        assert compare.command(strategy, Path("prog"), model, draft, prompt, settings, 3) == ["prog"] + args


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


def test_find_program(tmp_path, monkeypatch):
    program = tmp_path / "llama-lookup"
    program.write_text("#!/bin/sh\n")
    assert find_program("llama-lookup", tmp_path) is None  # not executable
    program.chmod(0o755)
    assert find_program("llama-lookup", tmp_path) == program
    assert find_program("llama-lookup", tmp_path / "elsewhere") is None  # --bin-dir: only there
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    assert find_program("llama-lookup") == program
