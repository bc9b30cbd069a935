"""How each API frames a stream's chunks as server-sent events: OpenAI's ``data:`` lines ending
with ``[DONE]`` (llama-server's native endpoints: the same lines, no ``[DONE]``), or the typed
events of Anthropic's Messages and OpenAI's Responses APIs (``event: <type>`` before each
``data:``)."""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, FrozenSet, List, Protocol


class Events(Protocol):
    """How an API frames its stream's chunks as server-sent events."""

    def frame(self, chunks: List[Dict[str, Any]]) -> str:
        """The events of these chunks."""

    def end(self) -> str:
        """What follows the last chunk."""

    def failed(self, message: str) -> str:
        """The event of an error after the stream started."""

    def ended(self) -> bool:
        """Whether the events ``frame`` gave so far hold the stream's last, so that a client may
        leave once they are sent (otherwise the last is what ``end`` gives)."""


class OpenAIEvents:
    """OpenAI's (and llama-server's): each chunk a ``data:`` line; with ``stream_options``'
    include_usage a last chunk with no choices and the usage; then ``data: [DONE]``."""

    def __init__(self, body: Any) -> None:
        options = getattr(body, "stream_options", None)
        self.include_usage = bool(options and options.include_usage)
        self.usage, self.last = None, None

    def frame(self, chunks: List[Dict[str, Any]]) -> str:
        for chunk in chunks:
            self.usage, self.last = chunk.pop("usage", self.usage), chunk
        return "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks)

    def end(self) -> str:
        tail = ""
        if self.include_usage and self.last is not None:
            head = {key: self.last[key] for key in ("id", "object", "created", "model")}
            tail = f"data: {json.dumps({**head, 'choices': [], 'usage': self.usage})}\n\n"
        return tail + "data: [DONE]\n\n"

    def ended(self) -> bool:
        return False  # the last event is end()'s

    def failed(self, message: str) -> str:
        body = {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
        return f"data: {json.dumps(body)}\n\n"


class NativeEvents(OpenAIEvents):
    """llama-server's native endpoints' (/completion, /infill): OpenAI's ``data:`` lines and
    error, but nothing after the last chunk (llama-server sends no ``[DONE]`` there; the last
    chunk says ``"stop": true``)."""

    def end(self) -> str:
        return ""


class TypedEvents:
    """Anthropic's and the Responses API's: each event named by its chunk's ``type``
    (``event: message_start``, then its ``data:``); nothing after the last; an error is an
    ``error`` event whose data ``failure(message)`` gives."""

    def __init__(self, failure: Callable[[str], Dict[str, Any]], last: FrozenSet[str]) -> None:
        self.failure = failure
        self.last = last  # the types of the event that ends a stream
        self._ended = False

    def frame(self, chunks: List[Dict[str, Any]]) -> str:
        self._ended = self._ended or any(chunk["type"] in self.last for chunk in chunks)
        return "".join(f"event: {chunk['type']}\ndata: {json.dumps(chunk)}\n\n" for chunk in chunks)

    def end(self) -> str:
        return ""

    def ended(self) -> bool:
        return self._ended

    def failed(self, message: str) -> str:
        return f"event: error\ndata: {json.dumps(self.failure(message))}\n\n"
