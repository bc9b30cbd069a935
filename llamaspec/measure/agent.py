"""``llamaspec agent-bench``: a recorded coding-agent conversation replayed against any server
that speaks OpenAI's chat completions or Anthropic's Messages API, turn by turn, as an agent
would send it, with the times the client sees and the figures the server reports.

An agent's requests are unlike a chat's: each one resends the whole conversation (files read,
edits made), so a server's speed there is mostly how much of the prompt it reads again (its
prefix cache) and how fast it writes replies that copy what it read (an edit's old and new
text). The transcript (``llamaspec/data/agent_transcript.json``) is Anthropic's request shape,
``{"system", "tools", "messages"}``, with ``turn_kinds`` beside them: one of ``KINDS`` for each
assistant message. Request k holds the recorded history before the k-th assistant message, never
the model's own earlier replies, so every server and model is asked the same prompts.

Every request is streamed and timed on the client: the time to the first generated text (the
prefill, plus the network) and the decode speed after it, over the output tokens the server's
usage counts. Beside them, what the server reports where it does: prompt tokens read and reused
(OpenAI's ``usage.prompt_tokens_details.cached_tokens``, Anthropic's
``usage.cache_read_input_tokens``, llama-server's ``timings``: ``prompt_n``, ``cache_n``,
``prompt_ms``, ``predicted_per_second``, ``draft_n``, ``draft_n_accepted``).

Only the standard library's http.client is used, so the core install needs nothing more.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import statistics
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Dict, Generator, Iterator, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from ..errors import ConfigError, LlamaspecError, shown
from .report import format_columns

TRANSCRIPT = Path(__file__).resolve().parent.parent / "data" / "agent_transcript.json"
APIS = ("chat", "messages")
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}
KINDS = ("read", "edit", "answer")
# max_tokens without --max-tokens: the recorded reply's characters at this many a token, which
# over-counts every common tokenizer on code and JSON (the margin), plus room for the template's
# own tokens around each call (its tags and JSON keys) and for a few words more than recorded.
CHARS_PER_TOKEN = 3.0
CALL_TOKENS = 16
EXTRA_TOKENS = 32
# Tokens that arrive within this many seconds of the first came in one piece: a server that
# holds text back (a tool call until it is whole) gives no decode time the client can see.
ONE_PIECE = 0.001
Message = Dict[str, Any]


class ServerError(LlamaspecError):
    """The server cannot be reached, answered with an error, or does not speak the API asked."""


# --- the transcript ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Transcript:
    """A recorded conversation in Anthropic's request shape and the kind of each assistant turn."""

    system: str
    tools: List[Dict[str, Any]]
    messages: List[Message]
    kinds: List[str]

    @staticmethod
    def load(path: Optional[Path] = None) -> "Transcript":
        """The shipped transcript, or one of the same shape (ConfigError for what is malformed)."""
        where = Path(path) if path is not None else TRANSCRIPT
        try:
            data = json.loads(where.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read the transcript {where}: {e}") from None
        return Transcript.of(data, str(where))

    @staticmethod
    def of(data: Any, where: str = "the transcript") -> "Transcript":
        problem = transcript_problem(data)
        if problem is not None:
            raise ConfigError(f"{where}: {problem}")
        return Transcript(data.get("system", ""), list(data.get("tools", [])), list(data["messages"]),
                          list(data["turn_kinds"]))

    @property
    def turns(self) -> List[int]:
        """The index in ``messages`` of each assistant message."""
        return [i for i, m in enumerate(self.messages) if m["role"] == "assistant"]

    def history(self, turn: int) -> List[Message]:
        """What request ``turn`` (0-based) sends: the recorded messages before that assistant turn."""
        return self.messages[:self.turns[turn]]

    def reply(self, turn: int) -> Message:
        return self.messages[self.turns[turn]]


def transcript_problem(data: Any) -> Optional[str]:
    """What makes ``data`` no transcript, or None: the messages alternate user and assistant
    from a user message, every tool_use is answered by exactly one tool_result in the next
    message and no tool_result answers nothing, and there is one known kind per assistant turn."""
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list) or not data["messages"]:
        return 'it needs "messages", a list of messages'
    messages = data["messages"]
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") != ("user", "assistant")[i % 2]:
            return f"message {i} is not a {('user', 'assistant')[i % 2]} message (they alternate from a user's)"
        if not isinstance(m.get("content"), (str, list)):
            return f"message {i} has no content (text or a list of blocks)"
    for i, m in enumerate(messages):
        if m["role"] == "user":
            calls = [b.get("id") for b in blocks(messages[i - 1]) if b.get("type") == "tool_use"] if i else []
            answers = [b.get("tool_use_id") for b in blocks(m) if b.get("type") == "tool_result"]
            if sorted(map(str, calls)) != sorted(map(str, answers)) or len(set(answers)) != len(answers):
                return f"message {i} does not answer each tool call before it by exactly one tool_result"
        elif i + 1 == len(messages) and any(b.get("type") == "tool_use" for b in blocks(m)):
            return f"the tool calls of message {i}, the last, are not answered"
    assistants = sum(1 for m in messages if m["role"] == "assistant")
    kinds = data.get("turn_kinds")
    if not isinstance(kinds, list) or len(kinds) != assistants or any(k not in KINDS for k in kinds):
        return f'"turn_kinds" must name one of {", ".join(KINDS)} for each of the {assistants} assistant messages'
    if not isinstance(data.get("tools", []), list) or any(not isinstance(t, dict) or "name" not in t
                                                          for t in data.get("tools", [])):
        return '"tools" must be a list of tools, each with a name'
    return None


def blocks(message: Message) -> List[Dict[str, Any]]:
    """A message's content blocks (text content as one text block)."""
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def reply_chars(message: Message) -> int:
    """The characters a model writes for this reply: its text, each call's name and arguments."""
    return sum(len(b.get("text", "")) if b.get("type") == "text" else
               len(b.get("name", "")) + len(json.dumps(b.get("input", {}), ensure_ascii=False))
               for b in blocks(message))


def reply_budget(message: Message) -> int:
    """max_tokens for a recorded reply: room for all of it in any common tokenizer."""
    calls = sum(1 for b in blocks(message) if b.get("type") == "tool_use")
    return math.ceil(reply_chars(message) / CHARS_PER_TOKEN) + CALL_TOKENS * calls + EXTRA_TOKENS


# --- OpenAI's shape -----------------------------------------------------------------------------

def openai_tools(tools: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                              "parameters": t.get("input_schema", {"type": "object"})}}
            for t in tools]


def openai_messages(system: str, messages: Sequence[Message]) -> List[Message]:
    """Anthropic's messages as OpenAI's chat: the system message first, an assistant's calls as
    ``tool_calls`` (arguments as JSON text), each tool_result as a ``tool`` message (they follow
    the calls, before any text of the same user message)."""
    out: List[Message] = [{"role": "system", "content": system}] if system else []
    for m in messages:
        out += _openai_assistant(m) if m["role"] == "assistant" else _openai_user(m)
    return out


def _openai_assistant(message: Message) -> List[Message]:
    text = "".join(b.get("text", "") for b in blocks(message) if b.get("type") == "text")
    calls = [{"id": b["id"], "type": "function",
              "function": {"name": b["name"], "arguments": json.dumps(b.get("input", {}), ensure_ascii=False)}}
             for b in blocks(message) if b.get("type") == "tool_use"]
    reply: Message = {"role": "assistant", "content": text or (None if calls else "")}
    return [{**reply, "tool_calls": calls} if calls else reply]


def _openai_user(message: Message) -> List[Message]:
    results = [{"role": "tool", "tool_call_id": b["tool_use_id"], "content": _result_text(b.get("content", ""))}
               for b in blocks(message) if b.get("type") == "tool_result"]
    text = "".join(b.get("text", "") for b in blocks(message) if b.get("type") == "text")
    return results + ([{"role": "user", "content": text}] if text or not results else [])


def _result_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return str(content)


def request_body(api: str, transcript: Transcript, turn: int, model: str, max_tokens: int) -> Dict[str, Any]:
    """The streamed, greedy request of one turn in the API's shape."""
    history = transcript.history(turn)
    if api == "messages":
        body: Dict[str, Any] = {"model": model, "max_tokens": max_tokens, "system": transcript.system,
                                "messages": history, "tools": transcript.tools}
    else:
        body = {"model": model, "max_tokens": max_tokens, "messages": openai_messages(transcript.system, history),
                "tools": openai_tools(transcript.tools), "stream_options": {"include_usage": True}}
    return {**body, "temperature": 0, "stream": True}


# --- one streamed request ---------------------------------------------------------------------

@dataclass
class Streamed:
    """What the client saw of one streamed answer: seconds from sending the request to the
    first and the last event carrying generated text (None: none came), and the figures the
    server reported (None where it did not)."""

    first: Optional[float] = None
    last: Optional[float] = None
    prompt_tokens: Optional[int] = None
    cached_tokens: Optional[int] = None
    output_tokens: Optional[int] = None
    timings: Dict[str, float] = field(default_factory=dict)
    events: int = 0

    def generated(self, at: float) -> None:
        self.first = at if self.first is None else self.first
        self.last = at


class Endpoint:
    """A server's base URL (``http://host:port``; a trailing ``/v1`` is allowed) and its key."""

    def __init__(self, url: str, api_key: Optional[str] = None, timeout: float = 600.0) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        try:
            port = parts.port
        except ValueError:
            port = -1
        if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
            raise ConfigError(f"--url {shown(url)} is not an http:// or https:// URL")
        self.url = url
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname, port
        self.prefix = parts.path.rstrip("/").removesuffix("/v1")
        self.api_key = api_key
        self.timeout = timeout

    def stream(self, path: str, body: Dict[str, Any]) -> Generator[Tuple[float, str, str], None, None]:
        """POSTs ``body`` and yields each server-sent event as it arrives: (seconds since the
        request was sent, event name, data)."""
        where = f"{self.url.rstrip('/')}{path}"
        conn = (http.client.HTTPSConnection if self.https else http.client.HTTPConnection)(
            self.host, self.port, timeout=self.timeout)
        try:
            t0 = time.perf_counter()
            try:
                conn.request("POST", self.prefix + path, json.dumps(body).encode(), self._headers())
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                raise ServerError(f"cannot reach {where}: {_reason(e)}") from None
            if not 200 <= response.status < 300:
                raise ServerError(f"{where} answered {response.status}: {_error_message(response)}")
            kind = response.getheader("content-type", "")
            if "text/event-stream" not in kind:
                raise ServerError(f"{where} answered {shown(kind or 'no content-type')}, not a stream of "
                                  "server-sent events: does it speak this API?")
            try:
                for name, data in _events(response):
                    yield time.perf_counter() - t0, name, data
            except (OSError, http.client.HTTPException) as e:
                raise ServerError(f"{where} broke off its answer: {_reason(e)}") from None
        finally:
            conn.close()

    def _headers(self) -> Dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                   "anthropic-version": "2023-06-01"}
        if self.api_key:
            headers.update({"Authorization": f"Bearer {self.api_key}", "x-api-key": self.api_key})
        return headers


def _reason(e: BaseException) -> str:
    if isinstance(e, socket.timeout):
        return "no answer in time (--timeout)"
    return str(getattr(e, "strerror", None) or e) or type(e).__name__


def _error_message(response: http.client.HTTPResponse) -> str:
    """An error answer's message: OpenAI's and Anthropic's ``error.message``, else its text."""
    text = response.read(4096).decode("utf-8", errors="replace")
    try:
        error = json.loads(text).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    return " ".join(str(message or text or response.reason).split())[:300]


def _events(response: http.client.HTTPResponse) -> Iterator[Tuple[str, str]]:
    """Server-sent events as (event name, data), each as soon as its blank line arrives."""
    name, data = "", []
    while True:
        raw = response.readline()
        if not raw:
            break
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if data:
                yield name, "\n".join(data)
            name, data = "", []
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
        elif line.startswith("event:"):
            name = line[6:].strip()
    if data:
        yield name, "\n".join(data)


def read_chat(events: Iterator[Tuple[float, str, str]]) -> Streamed:
    """An OpenAI chat completion's stream: generated text in the choices' deltas, the usage in
    the last chunk (include_usage), llama-server's timings in the chunk that ends the choice."""
    seen = Streamed()
    for at, _, data in events:
        if data.strip() == "[DONE]":
            break
        chunk = _json(data)
        seen.events += 1
        if "error" in chunk:
            raise ServerError(f"the server failed during its answer: {_streamed_error(chunk)}")
        if any(_generates(choice.get("delta") or {}) for choice in chunk.get("choices") or []):
            seen.generated(at)
        usage = chunk.get("usage") or {}
        if usage:
            seen.prompt_tokens = usage.get("prompt_tokens", seen.prompt_tokens)
            seen.output_tokens = usage.get("completion_tokens", seen.output_tokens)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            seen.cached_tokens = cached if cached is not None else seen.cached_tokens
        if isinstance(chunk.get("timings"), dict):
            seen.timings = chunk["timings"]
    return _spoke(seen, "chat")


def _generates(delta: Dict[str, Any]) -> bool:
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))


def read_messages(events: Iterator[Tuple[float, str, str]]) -> Streamed:
    """An Anthropic Messages stream: the prompt's tokens in message_start's usage (input_tokens
    read, cache_read_input_tokens reused), generated text in content blocks, the output tokens
    in message_delta's usage; a ``timings`` object where a server adds one."""
    seen = Streamed()
    for at, name, data in events:
        event = _json(data)
        seen.events += 1
        kind = event.get("type", name)
        if kind == "error":
            raise ServerError(f"the server failed during its answer: {_streamed_error(event)}")
        if kind == "message_start":
            _anthropic_usage(seen, (event.get("message") or {}).get("usage") or {})
        elif kind == "message_delta":
            _anthropic_usage(seen, event.get("usage") or {})
        elif kind == "content_block_start" and (event.get("content_block") or {}).get("type") == "tool_use":
            seen.generated(at)
        elif kind == "content_block_delta" and _delta_text(event.get("delta") or {}):
            seen.generated(at)
        if isinstance(event.get("timings"), dict):
            seen.timings = event["timings"]
        if kind == "message_stop":
            break
    return _spoke(seen, "messages")


def _anthropic_usage(seen: Streamed, usage: Dict[str, Any]) -> None:
    """Anthropic counts the prompt in parts: input_tokens (read now) and the cache's reads and writes."""
    if "input_tokens" in usage or "cache_read_input_tokens" in usage:
        cached = usage.get("cache_read_input_tokens") or 0
        seen.cached_tokens = cached
        seen.prompt_tokens = (usage.get("input_tokens") or 0) + cached + (usage.get("cache_creation_input_tokens") or 0)
    if usage.get("output_tokens"):
        seen.output_tokens = usage["output_tokens"]


def _delta_text(delta: Dict[str, Any]) -> str:
    return delta.get("text") or delta.get("partial_json") or delta.get("thinking") or ""


def _json(data: str) -> Dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        raise ServerError(f"the stream holds an event that is not JSON: {shown(data)}") from None
    if not isinstance(value, dict):
        raise ServerError(f"the stream holds an event that is not a JSON object: {shown(data)}")
    return value


def _streamed_error(event: Dict[str, Any]) -> str:
    error = event.get("error")
    return str(error.get("message", error) if isinstance(error, dict) else error)


def _spoke(seen: Streamed, api: str) -> Streamed:
    if seen.events == 0:
        raise ServerError(f"the server's stream held no events of the {api} API: does it speak it?")
    return seen


READERS: Dict[str, Callable[[Iterator[Tuple[float, str, str]]], Streamed]] = {
    "chat": read_chat, "messages": read_messages}


# --- turns and the report ---------------------------------------------------------------------

@dataclass
class Turn:
    """One assistant turn's request. Client side: ``prefill_s`` (to the first generated text)
    and ``decode_tps`` (output tokens after the first over the time after it; None where they
    came in one piece). Server side, None where it did not say: ``read_tokens`` (evaluated now),
    ``reused_tokens`` (from its cache), its own ``server_prefill_s`` and ``server_decode_tps``,
    ``server_decode_s`` (its decode time, which compares across servers whatever tokens each
    counts: llama-server's usage counts the end-of-generation token, llamaspec's does not),
    ``drafted`` and ``accepted`` tokens. ``new_tokens``: this prompt's tokens less the previous
    turn's prompt (the recorded reply to it and the messages after), what a server that keeps
    the previous prompt must read at least; None for the first turn."""

    turn: int
    kind: str
    max_tokens: int
    prompt_tokens: Optional[int]
    read_tokens: Optional[int]
    reused_tokens: Optional[int]
    new_tokens: Optional[int]
    prefill_s: Optional[float]
    output_tokens: Optional[int]
    decode_tps: Optional[float]
    server_prefill_s: Optional[float]
    server_decode_tps: Optional[float]
    server_decode_s: Optional[float]
    drafted: Optional[int]
    accepted: Optional[int]


def turn_of(number: int, kind: str, max_tokens: int, seen: Streamed, previous_prompt: Optional[int]) -> Turn:
    """A turn's figures from what its stream showed: llama-server's timings first (they count
    what was read and reused exactly), the usage's counts where they are missing."""
    timings = seen.timings
    read, reused = _int(timings.get("prompt_n")), _int(timings.get("cache_n"), seen.cached_tokens)
    prompt = seen.prompt_tokens
    if prompt is None and read is not None and reused is not None:
        prompt = read + reused
    if read is None and reused is not None and prompt is not None:
        read = prompt - reused
    if reused is None and read is not None and prompt is not None:
        reused = prompt - read
    new = prompt - previous_prompt if prompt is not None and previous_prompt else None
    output = _int(seen.output_tokens, timings.get("predicted_n"))
    return Turn(number, kind, max_tokens, prompt, read, reused, new, seen.first, output, decode_speed(seen, output),
                _seconds(timings.get("prompt_ms")), _float(timings.get("predicted_per_second")),
                _seconds(timings.get("predicted_ms")),
                _int(timings.get("draft_n")), _int(timings.get("draft_n_accepted")))


def decode_speed(seen: Streamed, output: Optional[int]) -> Optional[float]:
    """The ``output`` tokens after the first over the seconds from the first to the last generated text."""
    if seen.first is None or seen.last is None or output is None or output < 2:
        return None
    span = seen.last - seen.first
    return (output - 1) / span if span >= ONE_PIECE else None


def _int(*values: Any) -> Optional[int]:
    return next((int(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)), None)


def _float(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _seconds(ms: Any) -> Optional[float]:
    value = _float(ms)
    return value / 1000 if value is not None else None


@dataclass
class Totals:
    """Over every turn (each turn's median): decode speed on the edit turns and on all turns
    (output tokens after the first over their decode time, client side; the server's own where
    it reported timings), the prefill seconds, and tokens read after the first turn against the
    new tokens of those turns (a server that reuses its cache perfectly reads about as many)."""

    edit_decode_tps: Optional[float]
    decode_tps: Optional[float]
    server_edit_decode_tps: Optional[float]
    server_decode_tps: Optional[float]
    prefill_s: Optional[float]
    read_after_first: Optional[int]
    new_after_first: Optional[int]
    output_tokens: Optional[int]


@dataclass
class AgentReport:
    url: str
    api: str
    model: str
    repeat: int
    transcript: str
    turns: List[Turn]
    totals: Totals
    runs: List[List[Turn]] = field(default_factory=list)

    def table(self) -> str:
        """The per-turn table and the totals, as the CLI prints them."""
        head = ("turn", "kind", "prompt", "read", "reused", "new", "prefill s", "out", "decode t/s",
                "srv prefill s", "srv t/s", "srv decode s", "accepted/drafted")
        cells = [head] + [(str(t.turn), t.kind, _n(t.prompt_tokens), _n(t.read_tokens), _n(t.reused_tokens),
                           _n(t.new_tokens), _f(t.prefill_s, 2), _n(t.output_tokens), _f(t.decode_tps, 1),
                           _f(t.server_prefill_s, 2), _f(t.server_decode_tps, 1), _f(t.server_decode_s, 2),
                           f"{t.accepted}/{t.drafted}" if t.drafted is not None else "-") for t in self.turns]
        s = self.totals
        median = f"medians of {self.repeat} runs, " if self.repeat > 1 else ""
        count = f"{len(self.turns)} turn{'s' if len(self.turns) > 1 else ''}"
        lines = [f"{self.api} API at {self.url}, model {self.model!r}: {count} ({median}"
                 "client-side times; srv: the server's own timings)", *format_columns(cells, left=(1,)),
                 f"decode t/s: {_f(s.edit_decode_tps, 1)} on edit turns, {_f(s.decode_tps, 1)} on all "
                 f"(server's: {_f(s.server_edit_decode_tps, 1)}, {_f(s.server_decode_tps, 1)}); "
                 f"prefill: {_f(s.prefill_s, 2)} s in all",
                 f"prompt tokens read after the first turn: {_n(s.read_after_first)}, new in those turns: "
                 f"{_n(s.new_after_first)}"]
        if any(t.decode_tps is None and (t.output_tokens or 0) > 1 for t in self.turns):
            lines.append("decode t/s '-': the turn's text came in one piece (a server that holds a tool call "
                         "back until it is whole); the server's own figure is in srv t/s where it reports one")
        return "\n".join(lines)

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def _n(value: Optional[int]) -> str:
    return "-" if value is None else str(value)


def _f(value: Optional[float], digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def medians(runs: Sequence[Sequence[Turn]]) -> List[Turn]:
    """Each turn's median over runs, figure by figure (a figure missing from a run is left out)."""
    out = []
    for same in zip(*runs):
        values: Dict[str, Any] = {}
        for f in fields(Turn):
            got = [getattr(t, f.name) for t in same if getattr(t, f.name) is not None]
            if f.name in ("turn", "kind", "max_tokens"):
                values[f.name] = getattr(same[0], f.name)
            elif not got:
                values[f.name] = None
            else:
                middle = statistics.median(got)
                values[f.name] = round(middle) if all(isinstance(v, int) for v in got) else middle
        out.append(Turn(**values))
    return out


def totals(turns: Sequence[Turn]) -> Totals:
    edits = [t for t in turns if t.kind == "edit"]
    after_first = turns[1:]
    return Totals(_speed(edits, "decode_tps"), _speed(turns, "decode_tps"), _speed(edits, "server_decode_tps"),
                  _speed(turns, "server_decode_tps"), _sum(t.prefill_s for t in turns),
                  _sum(t.read_tokens for t in after_first) if after_first else None,
                  _sum(t.new_tokens for t in after_first) if after_first else None,
                  _sum(t.output_tokens for t in turns))


def _speed(turns: Sequence[Turn], which: str) -> Optional[float]:
    """Tokens over time where each turn's speed is known: the tokens after the first, over
    the seconds they took at that speed."""
    timed = [(t.output_tokens - 1, getattr(t, which)) for t in turns
             if getattr(t, which) and t.output_tokens and t.output_tokens > 1]
    if not timed:
        return None
    return sum(n for n, _ in timed) / sum(n / speed for n, speed in timed)


def _sum(values: Any) -> Any:
    values = list(values)
    return None if not values or any(v is None for v in values) else sum(values)


# --- the run ----------------------------------------------------------------------------------

@dataclass
class AgentBench:
    """What to replay, where, and how. ``max_tokens``: every turn's, instead of each recorded
    reply's budget (``reply_budget``); ``turns``: the first so many assistant turns."""

    url: str
    api: str = "chat"
    api_key: Optional[str] = None
    model: str = "default"
    turns: Optional[int] = None
    repeat: int = 1
    max_tokens: Optional[int] = None
    timeout: float = 600.0
    transcript: Optional[Path] = None

    def check(self, transcript: Transcript) -> None:
        if self.api not in APIS:
            raise ConfigError(f"--api must be one of {', '.join(APIS)}, not {shown(self.api)}")
        if self.turns is not None and not 1 <= self.turns <= len(transcript.turns):
            raise ConfigError(f"--turns must be 1 to {len(transcript.turns)} (the transcript's assistant turns)")
        if self.repeat < 1:
            raise ConfigError("--repeat must be at least 1")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError("--max-tokens must be at least 1")
        if self.timeout <= 0:
            raise ConfigError("--timeout must be positive")


def run_agent_bench(bench: AgentBench, on_turn: Optional[Callable[[int, Turn], None]] = None) -> AgentReport:
    """Replays the transcript's first ``bench.turns`` assistant turns ``bench.repeat`` times,
    in order, each turn one streamed greedy request; ``on_turn(run, turn)`` after each."""
    transcript = Transcript.load(bench.transcript)
    bench.check(transcript)
    endpoint = Endpoint(bench.url, bench.api_key, bench.timeout)
    count = bench.turns or len(transcript.turns)
    runs = []
    for run in range(bench.repeat):
        turns: List[Turn] = []
        for k in range(count):
            turns.append(ask(endpoint, bench, transcript, k, turns[-1].prompt_tokens if turns else None))
            if on_turn is not None:
                on_turn(run, turns[-1])
        runs.append(turns)
    chosen = medians(runs) if bench.repeat > 1 else runs[0]
    return AgentReport(bench.url, bench.api, bench.model, bench.repeat, str(bench.transcript or TRANSCRIPT.name),
                       chosen, totals(chosen), runs if bench.repeat > 1 else [])


def ask(endpoint: Endpoint, bench: AgentBench, transcript: Transcript, k: int, previous_prompt: Optional[int]) -> Turn:
    """Turn ``k`` (0-based) as one streamed request."""
    budget = bench.max_tokens or reply_budget(transcript.reply(k))
    body = request_body(bench.api, transcript, k, bench.model, budget)
    events = endpoint.stream(PATHS[bench.api], body)
    try:
        seen = READERS[bench.api](events)
    finally:
        events.close()  # the connection, whether the stream was read to its end or not
    return turn_of(k + 1, transcript.kinds[k], budget, seen, previous_prompt)


__all__ = ["APIS", "AgentBench", "AgentReport", "KINDS", "ServerError", "TRANSCRIPT", "Totals", "Transcript", "Turn",
           "openai_messages", "openai_tools", "read_chat", "read_messages", "reply_budget", "request_body",
           "run_agent_bench", "transcript_problem"]
