"""One generation: text out of an engine's steps, stops, statistics, and the stream a caller reads.

A stop (the end of generation, a stop string) inside a step keeps the tokens before it and cuts
the rest, in the text, the caches and the statistics. Every step gives one chunk, its text empty
while a partial stop string is held back, so the chunks' tokens add up to the result's.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import ContextManager, FrozenSet, Iterator, List, Optional, Protocol, Sequence, Union

import numpy as np

from ..config import GenerationConfig, SamplingConfig
from .engine import Engine, Step
from ..errors import LlamaspecError, StreamClosedError
from ..sampling import Uniforms
from .stats import Stats
from .text import TextStream

STOP_REASONS = ("stop", "length", "context", "interrupted")


@dataclass
class Result:
    """A generation. ``stop_reason``: "stop" (end of generation or a stop string), "length"
    (max_tokens reached), "context" (the context is full) or "interrupted" (the stream was
    closed before it ended). ``dropped_turns``: the oldest chat turns left out so that the
    conversation fits the context. ``warnings``: what went wrong after the text was complete
    (saving a dynamic n-gram cache)."""

    text: str
    tokens: List[int]
    stop_reason: str
    stats: Stats
    dropped_turns: int = 0
    warnings: List[str] = field(default_factory=list)


@dataclass
class Chunk:
    """Text accepted in one step; ``from_draft`` of ``tokens`` were drafted and accepted.
    The last chunk of a stream carries the ``result``."""

    text: str
    tokens: List[int] = field(default_factory=list)
    from_draft: int = 0
    result: Optional[Result] = None


class Vocabulary(Protocol):
    @property
    def eog_tokens(self) -> FrozenSet[int]: ...

    def piece(self, token: int) -> bytes: ...


class Stream:
    """The chunks of one generation, as they come. ``close()`` ends it early and leaves the
    caches consistent; ``result`` is its Result once it ended, finished or not (closed early:
    stop reason "interrupted"). Each read holds ``lock``, so a stream can be read from any
    thread while other calls on its LlamaSpec wait; a stream closed because another
    generation started (``reason``) raises StreamClosedError when read again."""

    def __init__(self, engine: Engine, vocab: Vocabulary, prompt: List[int], config: GenerationConfig,
                 strategy: str = "plain", lock: Optional[ContextManager] = None, dropped_turns: int = 0) -> None:
        self.result: Optional[Result] = None
        self._lock = lock if lock is not None else contextlib.nullcontext()
        self._closed: Optional[str] = None
        self._chunks = self._run(engine, vocab, prompt, config, strategy, dropped_turns)

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> Chunk:
        with self._lock:
            if self._closed:
                raise StreamClosedError(self._closed)
            return next(self._chunks)

    def close(self, reason: str = "") -> None:
        """End the generation now (its result: what was generated so far). With ``reason``,
        reading on raises StreamClosedError(reason) instead of stopping quietly."""
        with self._lock:
            self._chunks.close()
            if reason and (self.result is None or self.result.stop_reason == "interrupted"):
                self._closed = reason

    @property
    def done(self) -> bool:
        return self.result is not None

    def _run(self, engine: Engine, vocab: Vocabulary, prompt: List[int], config: GenerationConfig,
             strategy: str, dropped_turns: int) -> Iterator[Chunk]:
        stats = Stats(strategy=strategy)
        t0 = time.perf_counter()
        stats.n_prompt_eval = engine.prefill(prompt)
        stats.n_prompt, stats.t_prompt = len(prompt), time.perf_counter() - t0
        seed = seed_of(config.sampling)
        stats.seed = None if config.sampling.greedy else seed
        rng = np.random.default_rng(seed)
        collector = Collector(vocab, config, stats)
        max_new = config.max_tokens if config.max_tokens >= 0 else engine.target.n_ctx
        contexts = engine.contexts()
        busy0 = sum(c.t_llama for c in contexts)
        steps = engine.steps(config.sampling, rng, max_new, Uniforms(seed))
        try:
            for step in steps:
                chunk, kept = collector.take(step)
                if kept < len(step.tokens):  # drop what the step accepted past the stop
                    engine.rewind(len(engine.tokens) - len(step.tokens) + kept)
                yield chunk
                if collector.stop_reason == "stop":
                    break
            else:
                collector.stop_reason = "context" if len(engine.tokens) > engine.target.n_ctx else "length"
        finally:
            steps.close()
            stats.t_llama = sum(c.t_llama for c in contexts) - busy0
            self.result = collector.result(dropped_turns)
            try:
                engine.finish()
            except LlamaspecError as e:  # the text is complete: report, do not lose it
                self.result.warnings.append(str(e))
        yield collector.tail()


class Collector:
    """The text of one generation, step by step: tokens up to the end of generation or a stop
    string, the text safe to show, and the statistics. ``stop_reason`` stays "interrupted"
    until the caller or a stop says otherwise."""

    def __init__(self, vocab: Vocabulary, config: GenerationConfig, stats: Stats) -> None:
        self.vocab, self.stats = vocab, stats
        self.text = TextStream(config.stop)
        self.tokens: List[int] = []
        self.stop_reason = "interrupted"
        self._t0 = time.perf_counter()
        self._result: Optional[Result] = None

    def clock(self) -> None:
        """Time the decoding from now (the prompt was read since the collector was made)."""
        self._t0 = time.perf_counter()

    def take(self, step: Step) -> "tuple[Chunk, int]":
        """The chunk of one step and how many of its tokens count (fewer when it stopped)."""
        piece, kept, taken = "", 0, []
        for token in step.tokens:
            kept += 1
            if token in self.vocab.eog_tokens:
                self.stop_reason = "stop"
                break
            self.tokens.append(token)
            taken.append(token)
            piece += self.text.push(self.vocab.piece(token))
            if self.text.stopped:
                self.stop_reason = "stop"
                break
        self.stats.record_step(step, kept)
        return Chunk(piece, taken, min(step.n_accepted, len(taken))), kept

    def result(self, dropped_turns: int = 0) -> Result:
        """The generation as it stands: its decode time ends now."""
        self.stats.t_decode = time.perf_counter() - self._t0
        self.stats.stop_reason = self.stop_reason
        self._result = Result(self.text.released, self.tokens, self.stop_reason, self.stats, dropped_turns)
        return self._result

    def tail(self) -> Chunk:
        """The last chunk: what was held back for a stop string that never came, and the result."""
        assert self._result is not None
        tail = self.text.flush()
        self._result.text = self.text.text
        return Chunk(tail, [], 0, self._result)


def seed_of(sampling: SamplingConfig) -> int:
    """The seed a generation samples with: the configured one, else one drawn at random."""
    return sampling.seed if sampling.seed is not None else random_seed()


def random_seed() -> int:
    """A seed drawn from the operating system's entropy."""
    return int(np.random.SeedSequence().entropy % 2**31)


_SAMPLING = SamplingConfig()


def make_config(max_tokens: int = GenerationConfig.max_tokens, stop: Union[str, Sequence[str]] = (),
                temperature: float = _SAMPLING.temperature, top_k: int = _SAMPLING.top_k,
                top_p: float = _SAMPLING.top_p, min_p: float = _SAMPLING.min_p,
                seed: Optional[int] = None) -> GenerationConfig:
    """The options of generate, stream, chat and chat_stream as a GenerationConfig (validated).
    ``seed`` None or -1: a random seed (reported in the result's statistics)."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                              seed=None if seed == -1 else seed)
    return GenerationConfig(max_tokens=max_tokens, stop=stops, sampling=sampling)


def last(chunks: Iterator[Chunk]) -> Result:
    result = None
    for chunk in chunks:
        result = chunk.result
    assert result is not None
    return result
