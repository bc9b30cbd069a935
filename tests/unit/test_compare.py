"""llamaspec compare: the parser of llama.cpp's summary lines on the programs' real output
(tests/data/llama_cpp), and the command end to end on SmolLM2 against the real programs where
they are built, with missing and failing programs reported, not fatal."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llamaspec.llama.binding import weight_repacking
from llamaspec.measure import compare
from llamaspec.measure.compare import (PROGRAMS, Side, agreement, find_program, generated_text, parse_summary)

from conftest import DATA

OUTPUTS = DATA / "llama_cpp"  # what llama.cpp's programs printed
PROMPT = (OUTPUTS / "prompt.txt").read_text(encoding="utf-8")[:-1]  # llama.cpp drops the file's last newline
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
    side = parse_summary((OUTPUTS / f"{program}.stderr").read_text(encoding="utf-8"))
    side.text = generated_text((OUTPUTS / f"{program}.stdout").read_text(encoding="utf-8"), PROMPT, strategy)
    assert side == expected
    assert PROGRAMS[strategy] == program
    assert agreement(ANSWER, side.text) == "same"


def test_parse_missing_and_undefined_values():
    assert parse_summary("") == Side()
    side = parse_summary("n_drafted    = 0\nn_accept     = 0\naccept       = -nan%\n")
    assert (side.n_drafted, side.n_accept, side.accept) == (0, 0, None)
    # llama-lookahead's perf line has an infinite rate; its "decoded" line is the one that counts
    lookahead = (OUTPUTS / "llama-lookahead.stderr").read_text(encoding="utf-8")
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


def test_find_program(tmp_path, monkeypatch):
    program = tmp_path / "llama-lookup"
    program.write_text("#!/bin/sh\n")
    assert find_program("llama-lookup", tmp_path) is None  # not executable
    program.chmod(0o755)
    assert find_program("llama-lookup", tmp_path) == program
    assert find_program("llama-lookup", tmp_path / "elsewhere") is None  # --bin-dir: only there
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    assert find_program("llama-lookup") == program
