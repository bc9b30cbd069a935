"""The CLI on real models: a good run, and one clear line for every bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


from conftest import QWEN, SMOL, assert_one_line_error, chatml, run


def test_generate_plain_auto_and_draft_same_greedy_text(smol):
    args = ["generate", "-m", smol, "-p", chatml("Say hello."), "-n", "12", "--temp", "0", "-t", "2"]
    plain = run(*args, "--spec", "none")
    auto = run(*args)
    spec = run(*args, "-md", smol, "--spec", "draft", "--spec-fixed", "draft", "--draft-max", "4")
    assert plain.exit_code == 0 and auto.exit_code == 0 and spec.exit_code == 0, plain.stderr + spec.stderr
    assert plain.stdout.strip() and plain.stdout == spec.stdout == auto.stdout
    assert "plain:" in plain.stderr and "auto:" in auto.stderr and "n_drafted" in spec.stderr


def test_generate_json_from_file_and_stdin(smol, tmp_path):
    f = tmp_path / "prompt.txt"
    f.write_text(chatml("Count to three."))
    from_file = run("generate", "-m", smol, "-f", str(f), "-n", "8", "--temp", "0", "--json")
    from_stdin = run("generate", "-m", smol, "-n", "8", "--temp", "0", "--json", input=f.read_text())
    assert from_file.exit_code == 0, from_file.stderr
    data = json.loads(from_file.stdout)
    assert set(data) == {"text", "tokens", "sources", "stop_reason", "stats"}
    assert len(data["tokens"]) <= 8 and len(data["sources"]) == len(data["tokens"]) and data["stats"]["n_predict"] >= len(data["tokens"])
    assert json.loads(from_stdin.stdout)["text"] == data["text"]


def test_generate_chat_flag(smol):
    result = run("generate", "-m", smol, "--chat", "-p", "Say hello.", "-n", "8", "--temp", "0", "--json")
    direct = run("generate", "-m", smol, "-p", chatml("Say hello.").replace(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n", ""), "-n", "8", "--temp", "0", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["text"].strip()
    assert direct.exit_code == 0


def test_chat_session_with_commands(smol):
    session = "Say hello.\n/stats\n/reset\nSay bye.\n/exit\n"
    result = run("chat", "-m", smol, "-n", "8", "--temp", "0", input=session)
    assert result.exit_code == 0, result.stderr
    assert "conversation cleared" in result.stderr
    assert "stop reason" in result.stderr  # the /stats report
    assert result.stderr.count("auto:") >= 3  # summaries after both replies + /stats


def test_chat_no_stats(smol):
    result = run("chat", "-m", smol, "-n", "4", "--temp", "0", "--no-stats", input="Hi\n")
    assert result.exit_code == 0 and "auto:" not in result.stderr


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, smol):
    d = tmp_path_factory.mktemp("bad")
    (d / "text.gguf").write_text("this is not a model\n")
    with open(smol, "rb") as src, open(d / "cut.gguf", "wb") as dst:
        dst.write(src.read(8 * 2**20))
    return d


@pytest.mark.parametrize("args, fragment", [
    (["-m", "/nonexistent/model.gguf", "-p", "hi"], "model file not found"),
    (["-m", "BAD/text.gguf", "-p", "hi"], "not a GGUF file"),
    (["-m", "BAD/cut.gguf", "-p", "hi"], "truncated"),
    (["-m", "no-such-model", "-p", "hi"], "unknown model 'no-such-model'"),
    (["-m", "SMOL", "-c", "256", "-p", "word " * 400], "context holds 256"),
    (["-m", "SMOL", "-p", ""], "prompt is empty"),
    (["-m", "SMOL", "-p", "   "], "prompt is empty"),
    (["-m", "SMOL", "-f", "/nonexistent/prompt.txt"], "cannot read prompt file"),
    (["-m", "SMOL", "-p", "hi", "--draft-max", "0"], "draft-max must be >= 1"),
    (["-m", "SMOL", "-p", "hi", "--temp", "-1"], "temperature must be a finite number >= 0"),
    (["-m", "SMOL", "-p", "hi", "--top-p", "0"], "top-p must be in (0, 1]"),
    (["-m", "SMOL", "-p", "hi", "--top-p", "1.5"], "top-p must be in (0, 1]"),
    (["-m", "SMOL", "-p", "hi", "--temp", "abc"], "abc"),
    (["-m", "SMOL", "-p", "hi", "--no-such-flag"], "no-such-flag"),
])
def test_bad_input_is_one_line(bad_files, smol, args, fragment):
    args = [a.replace("BAD", str(bad_files)) if a.startswith("BAD") else smol if a == "SMOL" else a
            for a in args]
    assert_one_line_error(run("generate", *args), fragment)


def test_vocab_mismatch_is_one_line(model_file, smol, tmp_path):
    """Refused before anything is measured: an empty cache holds no cost curve (nor a progress bar)."""
    result = run("generate", "-m", str(model_file(QWEN)), "-md", smol, "-p", "hi", "--cache-dir", str(tmp_path))
    assert_one_line_error(result, "first differing token")
    assert not (tmp_path / "costs.json").exists()


def test_models_commands(smol):
    listed = run("models", "list")
    assert listed.exit_code == 0 and SMOL in listed.stdout and "default target" in listed.stdout
    path = run("models", "path", SMOL)
    assert path.exit_code == 0 and Path(path.stdout.strip()) == Path(smol)
    assert_one_line_error(run("models", "path", "nope"), "unknown model 'nope'")
    assert_one_line_error(run("models", "fetch", "nope"), "unknown model 'nope'")


def console_script():
    exe = shutil.which("llamaspec") or str(Path(sys.executable).with_name("llamaspec"))
    assert Path(exe).exists(), "the llamaspec console script is not installed (pip install -e .)"
    return exe


def test_installed_console_script(smol, tmp_path):
    exe = console_script()
    bad = subprocess.run([exe, "generate", "-m", "no-such-model", "-p", "hi"], capture_output=True, text=True)
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: unknown model")
    for args, fragment in [(["-p", b"caf\xe9"], "the prompt (-p) is not valid UTF-8 text"),
                           (["-n", "-5"], "must be >= -1"), (["--seed", "-7"], "seed must be >= 0"),
                           (["--lookup-cache-dynamic", str(tmp_path / "no" / "dyn.bin")], "no directory")]:
        one = subprocess.run([exe, "generate", "-m", smol, *([] if "-p" in args else ["-p", "hi"]), *args],
                             capture_output=True)
        err = one.stderr.decode()
        assert one.returncode != 0 and err.count("\n") == 1 and err.startswith("error: ") and fragment in err, err
    good = subprocess.run([exe, "generate", "-m", smol, "-p", chatml("Say hello."), "-n", "6", "--temp", "0"],
                          capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip()
    module = subprocess.run([sys.executable, "-m", "llamaspec", "--help"], capture_output=True, text=True)
    assert module.returncode == 0 and "generate" in module.stdout


def test_chat_ctrl_c_stops_the_reply_and_keeps_the_session(smol):
    """SIGINT during a reply ends that reply only; the next question is answered."""
    import os
    import signal
    import time

    proc = subprocess.Popen([console_script(), "chat", "-m", smol, "-n", "2000", "--temp", "0", "-t", "2"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            bufsize=1)
    try:
        proc.stdin.write("Count from one to five hundred, in words, one number per line.\n")
        proc.stdin.flush()
        first = proc.stdout.read(40)  # the reply has started streaming
        assert first
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGINT)
        proc.stdin.write("Say hello.\n/exit\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "[stopped]" in out, err
    assert err.count("auto:") >= 1  # the second reply finished with its summary
