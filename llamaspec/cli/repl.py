"""The terminal chat of ``llamaspec chat``: reading messages, local commands, streaming replies.

At a terminal, input is read with prompt_toolkit: line editing, history (up and down arrows),
pasted text as one message (bracketed paste), Alt-Enter for a new line, Ctrl-C clears the line,
Ctrl-D quits. From a pipe, each line is a message. Either way a line ending in a backslash
goes on on the next line.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Callable, List, Optional, TextIO

import click

from ..api import LlamaSpec
from ..llama.chat import Message, drop_oldest_turns, new_messages
from ..errors import LlamaspecError
from ..engine.generation import PLAIN, Chunk, Result

# The background colour (xterm's 256) of each built-in source's tokens; a plugin's is one of
# SPARE, by its name. Plain tokens keep the terminal's own colours.
COLOURS = {"lookup": 153, "draft": 223, "lookahead": 151, "heads": 225, "grammar": 252, "consensus": 229,
           "cache": 159}
SPARE = (217, 187, 195, 182, 230)
RESET = "\x1b[0m"

HELP = """\
/help   this text
/stats  the last reply in detail: per source, why a source sat idle, by depth
/reset  forget the conversation
/exit   quit (so does Ctrl-D)
Enter sends. Alt-Enter (or Esc, then Enter) starts a new line, and so does a line ending in a
backslash; pasted text is one message. Ctrl-C stops a reply, or clears the line being typed."""
COMMANDS = ("/help", "/stats", "/reset", "/exit", "/quit")


class Reader:
    """Messages typed at a terminal or read from a pipe; None at the end of input."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.session = None
        if stream.isatty():
            from prompt_toolkit import PromptSession
            from prompt_toolkit.history import InMemoryHistory
            from prompt_toolkit.key_binding import KeyBindings

            keys = KeyBindings()

            @keys.add("escape", "enter")
            def _newline(event) -> None:  # type: ignore[no-untyped-def]
                event.current_buffer.insert_text("\n")

            @keys.add("enter")
            def _send(event) -> None:  # type: ignore[no-untyped-def]
                buffer = event.current_buffer
                if buffer.text.endswith("\\"):
                    buffer.delete_before_cursor(1)
                    buffer.insert_text("\n")
                else:
                    buffer.validate_and_handle()

            self.session = PromptSession(history=InMemoryHistory(), key_bindings=keys, multiline=True,
                                         prompt_continuation=lambda width, line, soft: ". ".rjust(width))

    def read(self) -> Optional[str]:
        """The next message; KeyboardInterrupt when Ctrl-C clears the line being typed."""
        if self.session is not None:
            try:
                return self.session.prompt("> ")
            except EOFError:
                return None
        lines: List[str] = []
        while True:
            raw = self.stream.buffer.readline() if hasattr(self.stream, "buffer") else self.stream.readline()
            if not raw:
                return "\n".join(lines) if lines else None
            line = raw.decode("utf-8", errors="surrogateescape") if isinstance(raw, bytes) else raw
            line = line.rstrip("\n").rstrip("\r")
            if line.endswith("\\"):
                lines.append(line[:-1])
                continue
            return "\n".join(lines + [line])


def colours_wanted(asked: bool, out: TextIO) -> bool:
    """Whether to colour text by source: asked for (``--color-sources``), ``out`` a terminal, and
    no ``NO_COLOR`` set (no-color.org: set and not empty)."""
    return asked and out.isatty() and not os.environ.get("NO_COLOR")


class Painter:
    """Streamed text coloured by each token's source (its background; plain tokens as they are),
    when ``on``; the text as it is otherwise."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def text(self, chunk: Chunk) -> str:
        """A chunk's text, each token's part of it coloured by its source."""
        if not self.on or "".join(chunk.pieces) != chunk.text:  # a tail held back for a stop string
            return chunk.text
        return "".join(paint(piece, source) for piece, source in zip(chunk.pieces, chunk.sources))

    def legend(self, result: Result) -> str:
        """One line after a reply: each source's colour and its count of the reply's tokens."""
        counts = Counter(result.sources)
        total = max(len(result.sources), 1)
        return "sources: " + "  ".join(f"{paint(name, name)} {n} ({100 * n / total:.0f}%)"
                                       for name, n in counts.most_common())


def paint(text: str, source: str) -> str:
    """``text`` on the background of ``source`` (its colour ends at each line's end)."""
    if source == PLAIN or not text:
        return text
    code = COLOURS.get(source, SPARE[sum(map(ord, source)) % len(SPARE)])
    start = f"\x1b[48;5;{code}m\x1b[30m"
    return "\n".join(start + line + RESET if line else line for line in text.split("\n"))


def run_chat(spec: LlamaSpec, gen: dict, system: str, show_stats: bool, stream: Optional[TextIO] = None,
             painter: Painter = Painter(False)) -> None:
    """The chat loop: until /exit, Ctrl-D or the end of input (``stream``, default stdin); each
    reply coloured by ``painter``, with its legend when it colours."""
    reader = Reader(stream if stream is not None else sys.stdin)
    messages = new_messages(system)
    last: Optional[Result] = None
    say: Callable[[str], None] = lambda text: click.echo(text, err=True)  # noqa: E731
    say(f"llamaspec chat: {spec.model.path.name}"
        + (f" + draft {spec.draft_model.path.name}" if spec.draft_model else "")
        + ". /help lists the commands; Ctrl-C stops a reply, Ctrl-D quits.")
    while True:
        try:
            text = reader.read()
        except KeyboardInterrupt:
            continue  # the line was cleared
        if text is None:
            say("")
            return
        command = text.strip()
        if not command:
            continue
        if command in ("/exit", "/quit"):
            return
        if command == "/help":
            say(HELP)
            continue
        if command == "/reset":
            messages = new_messages(system)
            spec.reset()
            say("(conversation cleared)")
            continue
        if command == "/stats":
            say(stats_report(last) if last else "(no reply yet)")
            continue
        if command.startswith("/") and len(command.split()) == 1:
            say(f"unknown command {command}; /help lists them")
            continue
        try:
            result = _turn(spec, messages + [{"role": "user", "content": text}], gen, painter)
        except LlamaspecError as e:  # the session goes on
            say(f"error: {e}")
            continue
        last = result
        if result.dropped_turns:
            messages = drop_oldest_turns(messages, result.dropped_turns)
            say(f"(the conversation no longer fit the context: left out its {result.dropped_turns} oldest turn"
                f"{'s' if result.dropped_turns > 1 else ''})")
        messages += [{"role": "user", "content": text}, {"role": "assistant", "content": result.text}]
        if painter.on:
            say(painter.legend(result))
        if show_stats:
            say(click.style(result.stats.summary(), dim=True))


def _turn(spec: LlamaSpec, messages: List[Message], gen: dict, painter: Painter) -> Result:
    """Stream one reply; Ctrl-C ends it early and keeps what was said."""
    chunks = spec.chat_stream(messages, **gen)
    try:
        for chunk in chunks:
            click.echo(painter.text(chunk), nl=False)
    except KeyboardInterrupt:
        chunks.close()
        click.echo(" [stopped]", nl=False)
    click.echo()
    assert chunks.result is not None
    return chunks.result


def stats_report(result: Result) -> str:
    s = result.stats
    lines = [s.summary(), f"stop reason: {result.stop_reason}, target calls: {s.n_target_calls}, "
             f"prompt {s.t_prompt:.2f} s, decode {s.t_decode:.2f} s (planning {s.t_plan:.2f} s, "
             f"of which drafting {s.t_draft:.2f} s)"]
    for name, src in sorted(s.sources.items()):
        lines.append(f"{name}: {src.drafted} tokens verified in {src.steps} steps, {src.accepted} accepted")
    lines += [why for _, why in sorted(s.idle.items())]
    if s.drafted_by_pos:
        by_pos = " ".join(f"{a}/{d}" for a, d in zip(s.accepted_by_pos, s.drafted_by_pos))
        lines.append(f"accepted/verified by depth: {by_pos}")
    return "\n".join(lines)
