"""Robustness on real models: one object from many threads, streams closed by another generation,
chats longer than the context, every input checked before any work, signals, a terminal chat."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict

import psutil
import pytest

from llamaspec import LlamaSpec, LlamaspecError, ModelConfig, PromptError

from llamaspec.planning import costs
from llamaspec.planning.costs import REFERENCE_CPU, CostCurve
from llamaspec.errors import StreamClosedError

from conftest import QWEN_DRAFT, SMOL, THREADS, assert_one_line_error, run
from checks import assert_kv_invariant, console_script


A, B = "Once upon a time", "def fibonacci(n):"  # different first tokens: no cached prefix to share


def test_one_object_from_two_threads_gives_the_texts_of_sequential_calls(make_spec):
    spec = make_spec(SMOL, spec="none", n_ctx=512)
    expected = {p: spec.generate(p, max_tokens=48, temperature=0).text for p in (A, B)}
    got, errors = {A: [], B: []}, []

    def worker(prompt):
        try:
            for _ in range(3):
                got[prompt].append(spec.generate(prompt, max_tokens=48, temperature=0).text)
        except Exception as e:  # pragma: no cover - the test fails below
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(p,)) for p in (A, B)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and all(got[p] == [expected[p]] * 3 for p in (A, B))
    assert_kv_invariant(spec)


def test_a_stream_closed_by_another_generation_raises_when_resumed(make_spec):
    spec = make_spec(SMOL, n_ctx=512)
    first = spec.stream(A, max_tokens=40, temperature=0)
    next(first)
    other = spec.generate(B, max_tokens=8, temperature=0)
    assert other.stop_reason == "length"
    with pytest.raises(StreamClosedError, match="another generation started"):
        next(first)
    assert first.result is not None and first.result.stop_reason == "interrupted"
    assert_kv_invariant(spec)
    assert spec.generate(B, max_tokens=8, temperature=0).text == other.text


def test_a_closed_object_refuses_every_call(make_spec):
    spec = make_spec(SMOL, spec="none", n_ctx=256)
    spec.close()
    for call in (lambda: spec.generate(A), lambda: spec.tokenize(A), spec.reset):
        with pytest.raises(LlamaspecError, match="closed"):
            call()


def test_a_chat_longer_than_the_context_drops_its_oldest_turns_and_goes_on(make_spec):
    """Asked not to trim, a chat past the context is one clear error; trimmed, it drops its oldest
    turns and answers, and the next turn is answered too (the chat ends there)."""
    spec = make_spec(SMOL, spec="none", n_ctx=512)
    messages = [{"role": "system", "content": "You are a storyteller."}]
    dropped, after = 0, 0
    for i in range(12):  # about 80 tokens a turn: past the 512 by the seventh
        if dropped:
            after += 1
            if after > 1:  # the turn that first dropped, and the next, answered
                break
        messages.append({"role": "user", "content": f"Continue the story, part {i + 1}."})
        try:
            result = spec.chat(messages, trim=False, max_tokens=64, temperature=0)
            assert result.dropped_turns == 0
        except PromptError as e:  # asked not to trim: one clear error, and nothing lost
            assert "does not fit the 512-token context" in str(e)
            result = spec.chat(messages, max_tokens=64, temperature=0)
            assert result.dropped_turns > 0
            dropped += result.dropped_turns
            starts = [j for j, m in enumerate(messages) if m["role"] == "user"]
            messages = messages[:1] + messages[starts[result.dropped_turns]:]
        messages.append({"role": "assistant", "content": result.text})
        assert messages[0]["role"] == "system" and result.text
    assert dropped > 0 and after > 1  # it went on past the context, losing only its oldest turns


def test_a_reply_that_fills_the_context_says_so(make_spec):
    spec = make_spec(SMOL, spec="none", n_ctx=256)
    result = spec.generate("Count: 1, 2, 3,", max_tokens=-1, temperature=0)
    assert result.stop_reason == "context" and "stopped: the context is full" in result.stats.summary()


def test_seed_minus_one_draws_a_seed_and_reports_it(smol):
    out = run("generate", "-m", smol, "-p", A, "-n", "8", "--seed", "-1", "--json")
    assert out.exit_code == 0, out.stderr
    seed = json.loads(out.stdout)["stats"]["seed"]
    again = run("generate", "-m", smol, "-p", A, "-n", "8", "--seed", str(seed), "--json")
    assert json.loads(again.stdout)["text"] == json.loads(out.stdout)["text"]
    text = run("generate", "-m", smol, "-p", A, "-n", "8", "--seed", "-1")
    assert ", seed " in text.stderr


@pytest.fixture
def not_utf8(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("Caf\xe9 cr\xe8me".encode("latin-1"))
    return path


@pytest.mark.parametrize("where", ["file", "reference", "stdin", "argument"])
def test_text_that_is_not_utf8_is_one_line_naming_where(smol, not_utf8, where):
    args = {"file": ["-f", str(not_utf8)], "reference": ["-p", A, "--reference", str(not_utf8)],
            "stdin": [], "argument": ["-p", os.fsdecode(not_utf8.read_bytes())]}[where]
    result = run("generate", "-m", smol, "-n", "4", *args, input=not_utf8.read_bytes() if where == "stdin" else None)
    fragment = {"file": f"prompt file {not_utf8} is not UTF-8 text (byte 0xe9 at offset 3)",
                "reference": f"reference {not_utf8} is not UTF-8", "stdin": "stdin is not UTF-8",
                "argument": "the prompt (-p) is not valid UTF-8 text"}[where]
    assert_one_line_error(result, fragment)


@pytest.mark.parametrize("path, fragment", [("/nonexistent/dir/dyn.bin", "no directory /nonexistent/dir"),
                                            ("/proc/sys/dyn.bin", "permission denied")])
def test_an_unwritable_dynamic_cache_is_refused_before_any_model_loads(tmp_path, path, fragment):
    missing_model = str(tmp_path / "never-loaded.gguf")
    result = run("generate", "-m", missing_model, "-p", A, "--lookup-cache-dynamic", path)
    assert_one_line_error(result, f"cannot write the dynamic n-gram cache {path}: {fragment}")


@pytest.mark.parametrize("args, fragment", [
    (["-n", "-5"], "must be >= -1"),
    (["--temp", "inf"], "temperature must be a finite number"),
    (["--temp", "nan"], "temperature must be a finite number"),
    (["-c", "16"], "context size must be at least 256"),
    (["--seed", "-7"], "seed must be >= 0 (or -1: random)"),
])
def test_out_of_range_numbers_are_one_line(smol, args, fragment):
    assert_one_line_error(run("generate", "-m", smol, "-p", A, *args), fragment)


def test_more_threads_than_cores_and_gpu_layers_without_a_gpu_warn_once(smol):
    result = run("generate", "-m", smol, "-p", A, "-n", "2", "-t", str(4 * (os.cpu_count() or 1)), "-ngl", "-1",
                 "--spec", "none")  # no cost curve to measure for that many threads
    assert result.exit_code == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2 and "threads on" in warnings[0] and "without GPU support" in warnings[1]


def test_the_first_cost_measurement_says_what_it_does(smol, tmp_path):
    result = run("generate", "-m", smol, "-p", A, "-n", "2", "-t", str(THREADS), "--cache-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert "measuring decode costs of SmolLM2-135M-Instruct.Q4_1 (once)" in result.stderr
    assert (tmp_path / "costs.json").is_file()


def test_a_draft_measured_slower_than_its_target_is_measured_again(model_file, smol_quant, pool, tmp_path,
                                                                    monkeypatch):
    """The draft's cached token cost (5 s) exceeds its target's (1 s), though its file is the
    smaller (SmolLM2 made Q2_K, drafting for SmolLM2): it was measured on a busy machine. Loading
    the pair measures the draft again (not the target) and caches the new curve, unless it is
    still implausible."""
    target, draft = model_file(SMOL), smol_quant("Q2_K")
    assert draft.stat().st_size < target.stat().st_size
    cache = tmp_path / "costs.json"

    def plant(*entries) -> None:
        cache.write_text(json.dumps({costs._key(path, THREADS, "cpu"): asdict(CostCurve(REFERENCE_CPU.relative, ms,
                                                                                       THREADS, "cpu"))
                                     for path, ms in entries}))

    def load() -> None:
        with LlamaSpec(ModelConfig(str(target), n_ctx=2048, n_threads=THREADS),
                       ModelConfig(str(draft), n_ctx=2048, n_threads=THREADS), cache_dir=tmp_path, progress=False,
                       pool=pool):
            pass

    measured = []
    real_measure = costs.measure
    busy = CostCurve(REFERENCE_CPU.relative, 3000.0, THREADS, "cpu")  # the machine is still busy
    monkeypatch.setattr(costs, "measure", lambda ctx, **kw: measured.append(ctx.model.path) or busy)
    plant((target, 1000.0))  # the draft never measured: measured once, implausible, not cached
    load()
    assert measured == [draft] and costs.cached_curve(draft, THREADS, cache) is None
    measured.clear()
    plant((target, 1000.0), (draft, 5000.0))
    load()
    assert measured == [draft] and costs.cached_curve(draft, THREADS, cache).ms_per_token == 5000.0  # not cached

    monkeypatch.setattr(costs, "measure", lambda ctx, **kw: measured.append(ctx.model.path) or real_measure(ctx, **kw))
    load()
    assert measured == [draft, draft]
    assert costs.cached_curve(draft, THREADS, cache).ms_per_token < 1000.0  # measured here: cached
    assert costs.cached_curve(target, THREADS, cache).ms_per_token == 1000.0
    load()
    assert measured == [draft, draft]  # now plausible: used as cached


def test_q4_k_weights_decode_a_verify_batch_in_a_fresh_process(model_file):
    """In a process of its own, so a crash fails this test alone: llama.cpp's AMX kernels crash on
    Q4_K weights (both Qwen files) in the first decode; llamaspec loads them without repacking then."""
    code = ("import sys; from pathlib import Path; from llamaspec.llama.binding import Context, Model; "
            "c = Context(Model(Path(sys.argv[1])), n_ctx=256, n_threads=2); "
            "c.eval(list(range(100, 116)), logits='all'); print(int(c.logits(16).argmax(axis=1).size))")
    done = subprocess.run([sys.executable, "-c", code, str(model_file(QWEN_DRAFT))], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.strip() == "16"


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_generate_json_prints_the_partial_result(smol, sig, code):
    proc = subprocess.Popen([console_script(), "generate", "-m", smol, "-p", "Count from one to ten thousand:",
                             "-n", "-1", "-c", "4096", "--temp", "0", "-t", str(THREADS), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(6)  # loaded and generating (a 4096-token context takes far longer to fill)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    result = json.loads(out)
    assert result["stop_reason"] == "interrupted" and result["tokens"] and result["text"]
    assert "Traceback" not in err


def test_a_signal_during_generate_samples_prints_each_sample_as_far_as_it_got(smol):
    # plain decoding: every batch has one shape, so these samples are the same text in every run
    # (under the planner, whose batches follow live timings, a draw at a near-tie can end one early)
    proc = subprocess.Popen([console_script(), "generate", "-m", smol, "-p", "Count from one to ten thousand:",
                             "-n", "-1", "-c", "4096", "--temp", "0.05", "--seed", "1", "--samples", "3", "-t",
                             str(THREADS), "--spec", "none", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    time.sleep(6)  # loaded and generating (near-greedy, these samples go on until the context is full, over 30 s)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    samples = json.loads(out)["samples"]
    assert [s["stop_reason"] for s in samples] == ["interrupted"] * 3
    assert all(s["tokens"] and s["text"] for s in samples)
    assert "Traceback" not in err


class Terminal:
    """``llamaspec chat`` on a pseudo-terminal: what a person at a terminal does, and sees."""

    def __init__(self, args):
        env = {**os.environ, "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1", "COLUMNS": "120", "LINES": "40"}
        self.pid, self.master = pty.fork()  # the terminal is the child's controlling one: Ctrl-C is SIGINT
        if self.pid == 0:  # pragma: no cover - the child
            os.execve(console_script(), [console_script(), "chat", *args], env)
        self.seen = ""
        self.code = None

    def expect(self, text, timeout=120.0, count=1):
        deadline = time.monotonic() + timeout
        while self.seen.count(text) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"never saw {text!r}; saw: {self.seen[-2000:]!r}"
            ready, _, _ = select.select([self.master], [], [], min(left, 1.0))
            if ready:
                try:
                    data = os.read(self.master, 65536)
                except OSError:
                    data = b""
                self.seen += re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", data.decode("utf-8", "replace"))

    def send(self, data: str, pause=0.3):
        os.write(self.master, data.encode())
        time.sleep(pause)

    def wait(self, timeout=60.0):
        deadline = time.monotonic() + timeout
        while self.code is None and time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
            else:
                time.sleep(0.1)
        return self.code

    def close(self):
        if self.code is None:
            os.kill(self.pid, signal.SIGKILL)
            self.wait()
        os.close(self.master)


def test_chat_at_a_terminal_edits_lines_keeps_history_takes_pastes_whole_and_survives_ctrl_c(smol):
    term = Terminal(["-m", smol, "-t", str(THREADS), "-n", "600", "--temp", "0"])
    try:
        term.expect("Ctrl-D quits")
        term.send("/hlp")
        term.send("\x1b[D\x1b[D")  # two steps left: between "/h" and "lp"
        term.send("e\r")  # "/help", edited in place
        term.expect("/reset  forget the conversation")
        term.send("\x1b[A")  # history: the last line again
        term.send("\r")
        term.expect("/reset  forget the conversation", count=2)
        term.send("this line is never sent")
        term.send("\x03")  # Ctrl-C at the prompt clears the line
        term.send("/stats\r")
        term.expect("(no reply yet)")  # nothing was sent to the model, the session goes on
        term.send("\x1b[200~Reply with one word.\nJust one.\nOnly one word.\x1b[201~")  # pasted: one message
        term.send("\r")
        term.expect("auto: ")
        time.sleep(1)
        assert term.seen.count("auto: ") == 1  # one reply to the three pasted lines
        term.send("Write a very long story about a dragon who guards a library.\r")
        term.expect(" the ")  # the reply is streaming
        term.send("\x03")  # Ctrl-C stops the reply
        term.expect("[stopped]")
        term.send("/stats\r")
        term.expect("stop reason: interrupted")
        term.send("\x04")  # Ctrl-D quits
        assert term.wait() == 0
    finally:
        term.close()


def test_chat_from_a_pipe_joins_lines_ending_in_a_backslash_and_answers_commands_itself(smol):
    session = "/help\nFirst line,\\\nsecond line.\n/unknown\n/stats\n/exit\n"
    result = run("chat", "-m", smol, "-n", "8", "--temp", "0", input=session)
    assert result.exit_code == 0, result.stderr
    assert "/reset  forget the conversation" in result.stderr
    assert result.stderr.count("auto: ") == 2  # one reply (the joined lines) and /stats
    assert "unknown command /unknown; /help lists them" in result.stderr


def test_chat_keeps_its_session_when_the_context_is_full(smol):
    turns = "".join(f"Tell me more, part {i}.\n" for i in range(6)) + "/exit\n"  # full by the third
    result = run("chat", "-m", smol, "-c", "256", "-n", "100", "--temp", "0", input=turns)
    assert result.exit_code == 0, result.stderr
    assert "(the conversation no longer fit the context: left out its" in result.stderr
    assert result.stderr.count("auto: ") == 6
    assert "error" not in result.stderr


# --- every input that is read is bounded; no traceback for any user input -------------------------

def _exit_rusage(args):
    """Run the llamaspec command; (seconds, its largest resident MB seen every 5 ms, stderr). (The
    kernel's peak for a child counts the test process's pages it was forked with.)"""
    t0 = time.monotonic()
    proc = subprocess.Popen([console_script(), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    watched = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            peak = max(peak, watched.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.005)
    err = proc.communicate()[1].decode()
    assert proc.returncode != 0, err
    return time.monotonic() - t0, peak / 2**20, err


def test_a_2_gb_prompt_file_is_refused_before_it_is_read(smol, tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:  # sparse: 2 GB that take no disk
        f.truncate(2 << 30)
    seconds, peak_mb, err = _exit_rusage(["generate", "-m", smol, "-f", str(big)])
    assert err.startswith("error: prompt file") and "2,147,483,648 bytes; at most 1,048,576" in err, err
    assert seconds < 10 and peak_mb < 500, (seconds, peak_mb)  # the interpreter's start included
    t0 = time.monotonic()
    assert_one_line_error(run("generate", "-m", smol, "-f", str(big)), "2,147,483,648 bytes")
    assert time.monotonic() - t0 < 2


@pytest.mark.parametrize("flag", ["--reference", "--lookup-cache-static", "-f", "--grammar-file", "-j"])
def test_a_device_is_never_read(smol, flag):
    t0 = time.monotonic()
    args = ["-p", A] if flag != "-f" else []
    assert_one_line_error(run("generate", "-m", smol, *args, flag, "/dev/zero", "-n", "2"),
                          "/dev/zero is not a regular file")
    assert time.monotonic() - t0 < 2


def test_stdin_longer_than_the_context_can_hold_is_refused_after_that_many_bytes(smol):
    result = run("generate", "-m", smol, "-c", "256", input=b"word " * 20000)
    assert_one_line_error(result, "the prompt on stdin is longer than 65,536 bytes")


def test_a_python_prompt_too_long_for_the_context_is_refused_before_tokenizing(make_spec):
    spec = make_spec(SMOL, n_ctx=256, spec="none")
    t0 = time.monotonic()
    with pytest.raises(PromptError, match="100,000,000 bytes: more than a context of 256 tokens"):
        spec.generate("x" * 100_000_000, max_tokens=2)
    with pytest.raises(PromptError, match="the user message is"):
        spec.chat([{"role": "user", "content": "y" * 100_000_000}], max_tokens=2)
    assert time.monotonic() - t0 < 5
    # None where llama-cpp-python takes None: until a stop or the context's end; no stop strings
    result = spec.generate(A, max_tokens=None, stop=None, temperature=0)
    assert result.stop_reason in ("stop", "context") and len(result.tokens) > 16


def test_a_read_only_cache_and_a_model_list_that_is_not_utf8_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMASPEC_CACHE", "/proc/sys")  # a directory no one may write, root included
    result = run("models", "fetch", SMOL)
    assert_one_line_error(result, "cannot write to the model cache /proc/sys: ")
    assert result.stderr.rstrip().endswith("; point LLAMASPEC_CACHE or --cache-dir at a writable directory")
    model_list = tmp_path / "models.txt"
    model_list.write_bytes("[caf\xe9]\nfile = x.gguf\n".encode("latin-1"))
    monkeypatch.setenv("LLAMASPEC_MODELS", str(model_list))
    assert_one_line_error(run("models", "list"), f"model list {model_list} is not UTF-8 text (byte 0xe9")


def test_a_context_beyond_the_training_context_warns(smol):
    result = run("generate", "-m", smol, "-p", A, "-n", "2", "-c", "16384", "--spec", "none")
    assert result.exit_code == 0, result.stderr
    assert "warning: the context (16384 tokens) exceeds the 8192 SmolLM2-135M-Instruct.Q4_1.gguf was trained on" \
        in result.stderr


def test_chat_replies_to_the_end_not_to_256_tokens(smol):
    ask = "Write a long story about a dragon, at least 1000 words.\n/exit\n"
    result = run("chat", "-m", smol, "-c", "1024", "--temp", "0", input=ask)
    assert result.exit_code == 0, result.stderr
    n = int(re.search(r"auto: (\d+) tokens", result.stderr).group(1))
    assert n > 256, result.stderr
