"""The exceptions llamaspec raises for problems a user can fix.

Every error meant for a user derives from :class:`LlamaspecError`; its message is one
line that says what is wrong and with what. The CLI prints that line and exits non-zero.
"""

from __future__ import annotations


class LlamaspecError(Exception):
    """Base class of every user-facing llamaspec error."""


class ConfigError(LlamaspecError, ValueError):
    """A parameter is out of range or parameters contradict each other."""


class GrammarError(ConfigError):
    """A JSON schema or grammar that does not parse, or that the text cannot follow."""


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
