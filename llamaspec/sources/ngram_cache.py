"""llama-lookup's n-gram caches as a draft source (the caches themselves, llama.cpp's files and
drafting rule: ``llama/ngram.py``).

Three caches, as llama-lookup drafts from them: *context* (this text, built as it grows),
*dynamic* (earlier generations, kept in a file between runs: ``--lookup-cache-dynamic``) and
*static* (2-grams of a corpus: ``--lookup-cache-static``, made by ``llamaspec lookup create``
or ``llama-lookup-create``). The source runs wherever lookup runs and a cache file is given.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np

from .base import FORCED, FORCED_PRIOR, Budget, Candidate, Proposal, Source
from .lookup import OPTIONS as LOOKUP_OPTIONS, LookupConfig
from .registry import Hooks, Option, Plugin, Resources
from ..config import ModelConfig, SamplingConfig
from ..errors import CacheFormatError, ConfigError
from ..llama.ngram import NgramCache, draft_from_caches
from ..sequences import appended


@dataclass(frozen=True)
class CacheConfig:
    """The n-gram cache files (``static``: read only; ``dynamic``: updated after every
    generation, created if missing), with lookup's n-gram sizes and candidate length."""

    static: Optional[str] = None
    dynamic: Optional[str] = None
    ngram_min: int = LookupConfig.ngram_min
    ngram_max: int = LookupConfig.ngram_max
    draft_max: int = LookupConfig.draft_max

    def __post_init__(self) -> None:
        LookupConfig(self.ngram_min, self.ngram_max, self.draft_max)  # the same checks


class NgramCaches:
    """llama-lookup's three caches, kept in step with a generation.

    - context: n-grams of the tokens of this session (prompt and output), built as they come;
    - dynamic: loaded from a file (empty if missing); the n-grams of each finished generation
      are added and the file is rewritten, so it learns across runs;
    - static: loaded from a file made from a corpus (``llamaspec lookup create`` or
      ``llama-lookup-create``); it validates candidates, it is never written.

    Several texts decoded at once (lanes, threads) each follow their own ``session()``: its own
    context cache, the same static and dynamic caches, the dynamic one read and written under
    one lock.
    """

    def __init__(self, ngram_min: int, ngram_max: int, static: NgramCache, dynamic: NgramCache,
                 dynamic_path: Optional[Path] = None, lock: Optional[threading.Lock] = None) -> None:
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.static, self.dynamic, self.dynamic_path = static, dynamic, dynamic_path
        self._lock = lock if lock is not None else threading.Lock()
        self.context = NgramCache()
        self._followed: List[int] = []  # the tokens the context cache holds
        self._finished: List[int] = []  # the tokens already added to the dynamic cache

    @classmethod
    def open(cls, cfg: CacheConfig) -> "NgramCaches":
        """Load the caches ``cfg`` names."""
        static = NgramCache.load(cfg.static) if cfg.static else NgramCache()
        dynamic_path = Path(cfg.dynamic) if cfg.dynamic else None
        if dynamic_path is not None:
            check_writable(dynamic_path, "the dynamic n-gram cache")
        dynamic = NgramCache.load(dynamic_path, missing_ok=True) if dynamic_path else NgramCache()
        return cls(cfg.ngram_min, cfg.ngram_max, static, dynamic, dynamic_path)

    def session(self) -> "NgramCaches":
        """The same static and dynamic caches, for another text: an empty context cache."""
        return NgramCaches(self.ngram_min, self.ngram_max, self.static, self.dynamic, self.dynamic_path, self._lock)

    def validate_vocab(self, n_vocab: int) -> None:
        """CacheFormatError unless every token of both files fits a vocabulary of ``n_vocab``."""
        self.static.validate_vocab(n_vocab)
        self.dynamic.validate_vocab(n_vocab)

    def follow(self, tokens: Sequence[int]) -> None:
        """Add the n-grams of what was appended to the context cache (rebuild after a rewrite)."""
        n_new = appended(self._followed, tokens)
        if n_new is None:
            self.context, n_new = NgramCache(), len(tokens)
            self._followed = []
        self.context.update(tokens, self.ngram_min, self.ngram_max, n_new)
        self._followed += tokens[len(tokens) - n_new:]

    def draft(self, tokens: Sequence[int], max_len: int) -> List[int]:
        if len(tokens) < 2:
            return []
        with self._lock:
            return draft_from_caches(tokens, tokens[-1], max_len, self.ngram_min, self.ngram_max,
                                     self.context, self.dynamic, self.static)

    def finish(self, tokens: Sequence[int]) -> None:
        """A generation ended: add its new n-grams to the dynamic cache and save it."""
        if self.dynamic_path is None:
            return
        n_new = appended(self._finished, tokens)
        self._finished = list(tokens)
        try:
            with self._lock:
                self.dynamic.update(tokens, self.ngram_min, self.ngram_max, len(tokens) if n_new is None else n_new)
                self.dynamic.save(self.dynamic_path)
        except OSError as e:
            raise CacheFormatError(f"cannot save the dynamic n-gram cache {self.dynamic_path}: "
                                   f"{e.strerror or e}") from None



def check_writable(path: Path, what: str) -> None:
    """ConfigError unless ``path`` can be written (its directory exists and is writable, and the
    file, if there, is writable): checked before any model is loaded, not after a generation."""
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise ConfigError(f"cannot write {what} {path}: no directory {directory}")
    if not os.access(directory, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"cannot write {what} {path}: permission denied")


class CacheSource(Source):
    """llama-lookup's n-gram caches as a draft source: one candidate per step, drafted with
    llama.cpp's rule. Evidence: the token's position in the draft (0, 1, LAST_POSITION and on)."""

    name = "cache"
    past_forced = True

    def __init__(self, caches: NgramCaches, max_len: int = 31) -> None:
        self.caches = caches
        self.max_len = max_len

    def propose(self, tokens: Sequence[int], budget: Budget, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        self.caches.follow(tokens)
        draft = self.caches.draft(tokens, min(budget.max_len, self.max_len))
        if not draft:
            return Proposal()
        return Proposal((Candidate(tuple(draft), self.name, tuple(min(i, LAST_POSITION) for i in range(len(draft)))),))

    def finish(self, tokens: Sequence[int]) -> None:
        self.caches.finish(tokens)


# Evidence: positions in the draft from LAST_POSITION on share one key.
LAST_POSITION = 2


class CacheHooks(Hooks):
    """The files are read before any model loads, their vocabulary checked once the target is."""

    loads = "an n-gram cache file (--lookup-cache-static or --lookup-cache-dynamic)"

    def check(self, config: CacheConfig) -> Optional[NgramCaches]:
        return NgramCaches.open(config) if config.static or config.dynamic else None

    def available(self, config: CacheConfig, draft: Optional[ModelConfig]) -> bool:
        return bool(config.static or config.dynamic)

    def load(self, config: CacheConfig, resources: Resources, caches: NgramCaches) -> NgramCaches:
        caches.validate_vocab(resources.target.n_vocab)
        return caches


PLUGIN = Plugin(
    name="cache", describe="llama.cpp's n-gram cache files (llama-lookup's)",
    config=CacheConfig(), options=LOOKUP_OPTIONS + (
        Option("lookup_cache_static", "static", "Static n-gram cache (llama-lookup-create / `llamaspec lookup create`).",
               flag="--lookup-cache-static", path=True),
        Option("lookup_cache_dynamic", "dynamic", "Dynamic n-gram cache, updated after every generation "
               "(created if missing).", flag="--lookup-cache-dynamic", path=True)),
    hooks=CacheHooks(),
    build=lambda setup, text: CacheSource(setup.loaded.session(), setup.config.draft_max),
    priors={0: 0.25, 1: 0.3, 2: 0.35, FORCED: FORCED_PRIOR}, overall=0.3, joins="lookup")
