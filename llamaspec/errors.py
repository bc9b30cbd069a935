"""The exceptions llamaspec raises for problems a user can fix.

Every error meant for a user derives from :class:`LlamaspecError`; its message is one
line that says what is wrong and with what. The CLI prints that line and exits non-zero.
"""

from __future__ import annotations


import json
from typing import Any


def shown(value: Any, limit: int = 60, as_json: bool = False) -> str:
    """A value from the user as a message quotes it: a string's repr (``as_json``: its JSON, as a
    request spells it), else its JSON (or repr), cut to ``limit`` characters."""
    try:
        text = repr(value) if isinstance(value, str) and not as_json else json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class LlamaspecError(Exception):
    """Base class of every user-facing llamaspec error."""


class ConfigError(LlamaspecError, ValueError):
    """A parameter is out of range or parameters contradict each other. ``where``: the field of
    a request at fault, when there is one (``messages[2].content[0].type``): the message's first
    words, and the ``param`` of the server's error."""

    def __init__(self, problem: str = "", where: str = "") -> None:
        self.where = where
        super().__init__(f"{where}: {problem}" if where else problem)


class GrammarError(ConfigError):
    """A JSON schema or grammar that does not parse, cannot be compiled, or that the text cannot
    follow. ``where``: the part of the request at fault (a field, then the place in the schema:
    ``response_format.json_schema.schema.properties.a.enum``), the message's first words. The
    message is one line of at most MAX_MESSAGE characters (a deep place shown by its ends)."""

    MAX_MESSAGE = 300

    def __init__(self, problem: str, where: str = "") -> None:
        shown = where if len(where) <= 96 else _ends(where)
        message = " ".join(f"{shown}: {problem}".split() if where else problem.split())
        if len(message) > self.MAX_MESSAGE:
            message = message[:self.MAX_MESSAGE - 3] + "..."
        super().__init__(message)
        self.problem, self.where = problem, where

    def within(self, field: str) -> "GrammarError":
        """This error, found in the request's ``field``."""
        return GrammarError(self.problem, joined(field, self.where))


def joined(field: str, place: str) -> str:
    """A place in the value of ``field``: ``response_format.schema.properties.a``; after a
    command-line option, ``--json-schema at properties.a``."""
    if not field or not place:
        return field or place
    return f"{field} at {place}" if field.startswith("-") else f"{field}.{place}"


def _ends(where: str) -> str:
    """A long place (``a.b.c...``) by its first and last parts."""
    parts = where.split(".")
    if len(parts) < 3 or len(parts[0]) > 48 or len(parts[-1]) > 45:
        return f"{where[:48]}...{where[-45:]}"
    head, tail = parts[:1], parts[-1:]
    while len(".".join(head + parts[len(head):len(head) + 1])) <= 48 and len(head) + len(tail) < len(parts):
        head = parts[:len(head) + 1]
    while len(".".join(parts[-len(tail) - 1:])) <= 45 and len(head) + len(tail) < len(parts):
        tail = parts[-len(tail) - 1:]
    return f"{'.'.join(head)}...{'.'.join(tail)}"


class ModelError(LlamaspecError):
    """A model file is missing, is not GGUF, is truncated or failed to load."""


class UnknownModelError(ModelError):
    """A name is neither a file nor a model listed in models.txt."""


class FetchError(LlamaspecError):
    """A model could not be downloaded, assembled or verified."""


class VocabMismatchError(LlamaspecError):
    """The draft model's vocabulary differs from the target's."""


class PromptError(LlamaspecError):
    """The prompt is empty or does not fit in the context."""


class DecodeError(LlamaspecError):
    """llama.cpp refused an operation (a failed llama_decode, a refused cache removal)."""


class RemoteError(DecodeError):
    """An RPC server a model is placed on died or stopped answering: the generation it ended
    keeps what it had (``results``, where one was under way) and the model must be loaded again."""

    results: list = []


class StreamClosedError(LlamaspecError):
    """A stream was read after another generation on the same LlamaSpec closed it."""


class LlamaspecWarning(UserWarning):
    """Something works, but not as the user may expect (more threads than cores, -ngl on a
    CPU-only build); the CLI prints it as one line ``warning: ...``."""


class CacheFormatError(LlamaspecError):
    """A file is not an n-gram cache, or was made for another vocabulary."""
