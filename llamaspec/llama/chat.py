"""Chat messages to prompt text with the model's own template (llama-cpp-python's Jinja2 formatter)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from .binding import Model
from ..errors import ConfigError, PromptError

Message = Dict[str, Any]
PROBE = "llamaspec_probe_function"


class ChatTemplate:
    """The chat template stored in a GGUF file, rendered with the generation prompt appended."""

    def __init__(self, model: Model) -> None:
        template = model.chat_template()
        if not template:
            raise ConfigError(f"{model.path.name} has no chat template; use plain generation instead")
        self._format = Jinja2ChatFormatter(
            template=template,
            eos_token=model.piece(model.eos).decode("utf-8", errors="replace"),
            bos_token=model.piece(model.bos).decode("utf-8", errors="replace"),
            add_generation_prompt=True,
        )
        self.name = model.path.name
        self._renders_tools: Optional[bool] = None

    def render(self, messages: Sequence[Message], tools: Optional[Sequence[Any]] = None) -> str:
        """The prompt text, special tokens included (tokenize it without adding BOS); ``tools``:
        OpenAI's tool definitions, which templates with tool support tell the model of."""
        check_messages(messages)
        return self._format(messages=list(messages), tools=list(tools) if tools else None).prompt

    @property
    def renders_tools(self) -> bool:
        """Whether the template tells the model of tools (a probe tool's name shows in its prompt)."""
        if self._renders_tools is None:
            probe = {"type": "function", "function": {"name": PROBE, "description": "A probe.",
                                                      "parameters": {"type": "object", "properties": {}}}}
            self._renders_tools = PROBE in self.render([{"role": "user", "content": "hi"}], [probe])
        return self._renders_tools


def check_messages(messages: Sequence[Message]) -> None:
    if not messages:
        raise PromptError("no messages")
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise PromptError(f"a message needs 'role' and 'content': {m!r}")
    if not any(str(m["content"]).strip() for m in messages if m["role"] == "user"):
        raise PromptError("the user message is empty")


def new_messages(system: str = "") -> List[Message]:
    return [{"role": "system", "content": system}] if system else []


def turns(messages: Sequence[Message]) -> List[int]:
    """Where each turn starts: the index of every user message after the leading system ones."""
    return [i for i, m in enumerate(messages) if m.get("role") == "user"]


def drop_oldest_turns(messages: Sequence[Message], n: int) -> List[Message]:
    """``messages`` without its ``n`` oldest turns (a user message and what follows it up to the
    next user message); system messages before the first turn always stay."""
    starts = turns(messages)
    if n <= 0 or not starts:
        return list(messages)
    cut = starts[n] if n < len(starts) else len(messages)
    return list(messages[:starts[0]]) + list(messages[cut:])


def fit(messages: Sequence[Message], count: Callable[[Sequence[Message]], int], room: int) -> Tuple[List[Message], int]:
    """The messages with as few of the oldest turns dropped as makes ``count`` (their prompt's
    tokens) at most ``room``, and how many turns were dropped. The last turn always stays:
    PromptError when even it (with the system messages) does not fit."""
    n_turns = len(turns(messages))
    for dropped in range(max(n_turns, 1)):
        kept = drop_oldest_turns(messages, dropped)
        n = count(kept)
        if n <= room:
            return kept, dropped
    raise PromptError(f"the last message needs {n} tokens with the system message, but only {room} fit in the "
                      f"context with room for the reply; raise the context size (-c) or shorten the message")
