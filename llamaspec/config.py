"""Configuration dataclasses. Each validates itself and raises ConfigError on bad values."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Tuple

from .errors import ConfigError


def default_threads() -> int:
    """Cores this process may run on (llama.cpp's own default of 4 oversubscribes small machines)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class ModelConfig:
    """How to load one model and its context.

    ``path`` is a GGUF file or a model name from models.txt.
    """

    path: str
    n_ctx: int = 4096
    n_threads: Optional[int] = None  # None: every core this process may use
    n_gpu_layers: int = 0  # -1 offloads every layer (Metal/CUDA builds only)
    n_batch: int = 512

    def __post_init__(self) -> None:
        _check(bool(str(self.path).strip()), "model path is empty")
        _check(self.n_ctx >= 16, f"context size must be at least 16, got {self.n_ctx}")
        _check(self.n_threads is None or self.n_threads >= 1, f"threads must be >= 1, got {self.n_threads}")
        _check(self.n_gpu_layers >= -1, f"GPU layers must be >= -1, got {self.n_gpu_layers}")
        _check(self.n_batch >= 1, f"batch size must be >= 1, got {self.n_batch}")

    @property
    def threads(self) -> int:
        return self.n_threads or default_threads()


@dataclass(frozen=True)
class SamplingConfig:
    """Token selection. ``temperature == 0`` is greedy; the other filters then do nothing.

    Filters apply in llama.cpp's order: top-k, top-p, min-p, then temperature.
    ``top_k == 0``, ``top_p == 1`` and ``min_p == 0`` disable their filter.
    ``seed`` None draws a random seed.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: Optional[int] = None

    def __post_init__(self) -> None:
        _check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        _check(self.top_k >= 0, f"top-k must be >= 0, got {self.top_k}")
        _check(0 < self.top_p <= 1, f"top-p must be in (0, 1], got {self.top_p}")
        _check(0 <= self.min_p <= 1, f"min-p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class DraftConfig:
    """Draft-model speculation, with llama.cpp's names and defaults.

    The draft proposes up to ``draft_max`` tokens and stops early when its own
    probability for the next token falls below ``draft_p_min``; a proposal shorter
    than ``draft_min`` is dropped and the step decodes plainly.
    """

    draft_max: int = 16
    draft_min: int = 0
    draft_p_min: float = 0.75

    def __post_init__(self) -> None:
        _check(self.draft_max >= 1, f"draft-max must be >= 1, got {self.draft_max}")
        _check(0 <= self.draft_min <= self.draft_max,
               f"draft-min must be in [0, draft-max={self.draft_max}], got {self.draft_min}")
        _check(0 <= self.draft_p_min <= 1, f"draft-p-min must be in [0, 1], got {self.draft_p_min}")


@dataclass(frozen=True)
class GenerationConfig:
    """When to stop. ``max_tokens`` < 0 generates until a stop or a full context."""

    max_tokens: int = 256
    stop: Tuple[str, ...] = ()
    sampling: SamplingConfig = SamplingConfig()

    def __post_init__(self) -> None:
        _check(all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty")


@dataclass(frozen=True)
class LookupConfig:
    """Drafts copied from text already seen: the prompt and output (prompt lookup), reference
    documents, and llama.cpp-format n-gram caches.

    Matches are n-grams of ``ngram_min`` .. ``ngram_max`` tokens, longest first; ``policy``
    picks among several occurrences (see ``PromptLookup``). The number of drafted tokens
    verified per step is chosen from the measured verify cost, up to ``draft_max``.
    """

    ngram_min: int = 1
    ngram_max: int = 4
    policy: str = "longest"
    draft_max: int = 31
    cache_static: Optional[str] = None
    cache_dynamic: Optional[str] = None

    def __post_init__(self) -> None:
        _check(1 <= self.ngram_min <= self.ngram_max <= 4,
               f"lookup n-gram sizes must satisfy 1 <= min <= max <= 4, got {self.ngram_min}..{self.ngram_max}")
        _check(self.policy in ("longest", "recent", "frequent"),
               f"lookup policy must be longest, recent or frequent, got {self.policy!r}")
        _check(self.draft_max >= 1, f"lookup draft-max must be >= 1, got {self.draft_max}")


@dataclass(frozen=True)
class LookaheadConfig:
    """Lookahead decoding: a window of ``w`` columns by ``n - 1`` levels of Jacobi guesses,
    n-grams of ``n`` tokens, up to ``g`` candidates verified per step (see ``lookahead.py``).

    ``adaptive`` sizes each step from the measured cost curve (candidates cut to the length
    that pays, the window decoded only where it is nearly free); without it every step
    decodes the whole window and all candidates, as llama.cpp's llama-lookahead does.
    """

    w: int = 4
    n: int = 4
    g: int = 4
    adaptive: bool = True

    def __post_init__(self) -> None:
        _check(self.w >= 0, f"lookahead W must be >= 0, got {self.w}")
        _check(self.n >= 2, f"lookahead N must be >= 2, got {self.n}")
        _check(self.g >= 0, f"lookahead G must be >= 0, got {self.g}")
        _check(self.w + self.g >= 1, "lookahead needs a window (W >= 1) or candidates (G >= 1)")
