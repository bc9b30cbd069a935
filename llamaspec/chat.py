"""Chat messages to prompt text with the model's own template (llama-cpp-python's Jinja2 formatter)."""

from __future__ import annotations

from typing import Dict, List, Sequence

from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from ._llama import Model
from .errors import ConfigError, PromptError

Message = Dict[str, str]


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

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt text, special tokens included (tokenize it without adding BOS)."""
        check_messages(messages)
        return self._format(messages=list(messages)).prompt


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
