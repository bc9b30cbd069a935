"""Grammars compiled first where a failure cannot take the caller with it, and within a time limit.

    compiler = Compiler(vocabulary)              # the model's (token texts, end tokens), or None
    compiled = compiler.compile("lark", text)    # llguidance's grammar; GrammarError (it crashed,
                                                 # ran out of time or memory) or Refused (the
                                                 # engine's own message, worded by the caller)
    matcher = on_large_stack(lambda: LLMatcher(tokenizer, compiled, limits=limits()))
    compiler.close()

The grammar engine (llguidance) is native code: a grammar nested deeply enough overflows its
stack and ends the process (an object of thousands of optional properties did, from one
request), and GBNF's conversion to its syntax takes seconds for some texts (a long chain of
rules; docs/results.md, "Grammar limits and costs").
So every grammar is compiled first by a worker process (``worker.py``) on a thread of
WORKER_STACK_MB, with at most WORKER_MEMORY_MB, and given COMPILE_SECONDS: a crash, a timeout
or an error there is a GrammarError here, and the worker is started again for the next grammar.
Only what compiled there is compiled here, on a thread of twice that stack. Grammars are
compiled one at a time; each takes its own time limit from when its turn comes.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, TypeVar

from ..errors import GrammarError, LlamaspecError
from .finite import finite

# Seconds a grammar may take to compile (in the worker; here it then takes about as long).
COMPILE_SECONDS = 1.0
# Seconds the worker may take to start (Python, llguidance, the tokenizer), with room for a busy machine.
START_SECONDS = 60.0
WORKER_STACK_MB = 256  # a chain of about 90,000 rules
CALLER_STACK_MB = 2 * WORKER_STACK_MB
WORKER_MEMORY_MB = 4096
# The grammar engine's limits (llguidance's ParserLimits): rows of up to 10,000 items (an anyOf
# of 2,000 objects, 2,500 optional properties), 200,000 items a token's mask (its default 50,000
# stopped 2,500 optional properties); no parser state in the messages.
LIMITS: Dict[str, Any] = {"max_items_in_row": 10_000, "step_max_items": 200_000, "verbose_errors": False}

Vocabulary = Tuple[Sequence[bytes], Sequence[int]]
T = TypeVar("T")


def limits() -> Any:
    from llguidance import LLParserLimits
    return LLParserLimits(**LIMITS)


def on_large_stack(work: Callable[[], T]) -> T:
    """``work()`` on a thread of CALLER_STACK_MB (the caller waits): compiling a grammar that
    compiled in the worker cannot overflow it."""
    out: Dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = work()
        except BaseException as e:  # raised in the caller's thread below
            out["error"] = e

    with _stack_lock:
        previous = threading.stack_size(CALLER_STACK_MB << 20)
        try:
            thread = threading.Thread(target=run, name="llamaspec-grammar", daemon=True)
            thread.start()
        finally:
            threading.stack_size(previous)
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


_stack_lock = threading.Lock()  # threading.stack_size is the process's: set and reset in turn


class Refused(Exception):
    """The grammar engine refused a grammar: its own ``message`` (``problem`` words it) and the
    ``stage`` that did, "gbnf" (the conversion) or "compile"; or "finite": it allows no finite
    text (``finite.py``)."""

    def __init__(self, message: str, stage: str) -> None:
        super().__init__(message)
        self.message, self.stage = message, stage


class Compiler:
    """A worker process that compiles grammars first (see the module's text). ``vocabulary``:
    the model's token texts and end tokens (a function that gives them, asked when the worker
    starts), so that the worker compiles as the matcher will; None: it validates the grammar
    alone (a check before any model loads). ``seconds``: each grammar's time limit;
    ``stack_mb``: the worker's stack (at most WORKER_STACK_MB: this process compiles on twice that)."""

    def __init__(self, vocabulary: Optional[Callable[[], Vocabulary]] = None,
                 seconds: float = COMPILE_SECONDS, stack_mb: int = WORKER_STACK_MB) -> None:
        self.seconds, self.stack_mb = seconds, stack_mb
        self._vocabulary = vocabulary
        self._process: Optional[subprocess.Popen] = None
        self._lock = threading.Lock()
        self._closed = False

    def compile(self, syntax: str, text: str) -> str:
        """llguidance's compiled grammar of ``text`` (``syntax``: "lark" or "gbnf"). GrammarError
        where the engine crashed or ran out of time or memory on it; Refused with its message
        where it refused it, or (stage "finite") where the grammar allows no finite text, which
        the engine compiles and then follows until its text outgrows its limits."""
        request = pickle.dumps({"syntax": syntax, "text": text, "limits": LIMITS})
        with self._lock:
            if self._closed:
                raise LlamaspecError("this grammar compiler is closed")
            process = self._started()
            try:
                _write(process, request)
                reply = _read(process, time.monotonic() + self.seconds)
            except TimeoutError:
                self._stop(kill=True)
                raise GrammarError(f"compiling it took more than {self.seconds:g} s (the limit); simplify it") from None
            except EOFError:
                code = self._stop()
                raise GrammarError(f"the grammar engine crashed compiling it ({_signal(code)}: likely nested too "
                                   f"deeply or too large); simplify it") from None
        answer = json.loads(reply)
        if "grammar" in answer:
            if not finite(answer.get("lark", text)):  # here, out of the worker's time: it is linear
                raise Refused("no finite text", "finite")
            return answer["grammar"]
        if answer["stage"] == "memory":
            raise GrammarError(f"compiling it needs more than {WORKER_MEMORY_MB} MB; simplify it")
        raise Refused(answer["error"], answer["stage"])

    def _started(self) -> subprocess.Popen:
        if self._process is not None and self._process.poll() is None:
            return self._process
        worker = Path(__file__).with_name("worker.py")
        process = subprocess.Popen([sys.executable, "-I", str(worker), str(self.stack_mb), str(WORKER_MEMORY_MB)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   start_new_session=True)  # Ctrl-C at a terminal is the caller's to handle
        self._process = process
        try:
            _write(process, pickle.dumps(self._vocabulary() if self._vocabulary is not None else None))
            json.loads(_read(process, time.monotonic() + START_SECONDS))
        except (TimeoutError, EOFError, OSError, ValueError):
            code = self._stop()
            raise LlamaspecError(f"the grammar compiler's process did not start ({_signal(code)})") from None
        return process

    def _stop(self, kill: bool = False) -> Optional[int]:
        """End the worker (the next grammar starts another; ``kill``: now, as one still
        compiling); its exit code."""
        process, self._process = self._process, None
        if process is None:
            return None
        if kill:
            process.kill()
        for pipe in (process.stdin, process.stdout):
            try:
                pipe.close()  # type: ignore[union-attr]
            except OSError:
                pass
        try:
            return process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._stop()

    def __enter__(self) -> "Compiler":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write(process: subprocess.Popen, data: bytes) -> None:
    try:
        process.stdin.write(struct.pack("<I", len(data)) + data)  # type: ignore[union-attr]
        process.stdin.flush()  # type: ignore[union-attr]
    except (BrokenPipeError, ValueError):
        raise EOFError from None


def _read(process: subprocess.Popen, deadline: float) -> bytes:
    """One message from the worker by ``deadline`` (TimeoutError), EOFError if it ended."""
    fd = process.stdout.fileno()  # type: ignore[union-attr]
    head = _read_exactly(fd, 4, deadline)
    return _read_exactly(fd, struct.unpack("<I", head)[0], deadline)


def _read_exactly(fd: int, size: int, deadline: float) -> bytes:
    parts, left = [], size
    while left:
        wait = deadline - time.monotonic()
        if wait <= 0 or not select.select([fd], [], [], wait)[0]:
            raise TimeoutError
        part = os.read(fd, min(left, 1 << 20))
        if not part:
            raise EOFError
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _signal(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            return f"{signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


# --- the engine's messages, one actionable line each -----------------------------------------

MAX_PROBLEM = 200  # characters of the engine's problem a message keeps (with its place: under 300)


REWORDED = [  # the engine's words for a grammar too big to follow, and ours
    (r"Current row has (\d+) items; max is (\d+).*",
     r"it allows too many alternatives at one place (\1 parser items; at most \2); simplify it"),
    (r"Too many items \(limit (\d+); mask\).*",
     r"following it takes more than \1 parser items for one token; simplify it"),
    (r"NoExtensionBias.*", "it allows no text at all"),
    (r"initial lexer configuration \(grammar\) too big \(limit for this grammar: (\d+)\).*",
     r"its lexer is too big (more than \1 units of the engine's fuel); simplify it"),
]


def problem(text: str) -> Tuple[str, int]:
    """The engine's message as one short line, and the grammar line it names (0: none). A regex
    error keeps the pattern and what is wrong with it; the grammar excerpts and parser state
    the engine appends are dropped."""
    line = 0
    found = re.match(r"at (\d+)\(\d+\): ", text)
    if found:
        line, text = int(found.group(1)), text[found.end():]
    text = text.replace("failed to compile JSON schema: ", "")
    lines = [ln for ln in text.split("\n") if ln.strip()]
    kept = []
    for ln in lines:
        if re.match(r"\s*\d+ \| ", ln) or ln.strip().startswith("<"):  # a grammar excerpt, a state dump
            break
        kept.append(ln)
    if kept and kept[0].startswith("regex parse error:"):
        pattern = kept[1].strip() if len(kept) > 1 else ""
        why = next((ln[len("error: "):] for ln in kept if ln.startswith("error: ")), "")
        short = pattern if len(pattern) <= 60 else pattern[:57] + "..."
        return f"the regex {short!r} does not parse: {why}", line
    text = " ".join(" ".join(kept).split()) or " ".join(text.split())
    text = re.sub(r"^(Parser Error|parser error): ", "", text)
    for pattern, ours in REWORDED:
        if re.match(pattern, text):
            text = re.sub(pattern, ours, text)
            break
    return (text if len(text) <= MAX_PROBLEM else text[:MAX_PROBLEM - 3] + "..."), line
