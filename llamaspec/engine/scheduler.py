"""Requests on the lanes of one Engine: each request is a prompt and n samples (one text: n = 1).

    request = Request(prompt, config, n)
    scheduler.submit(request)          # waits (first come, first served) for n idle lanes
    scheduler.step()                   # admit what fits, one Engine step, route the chunks
    request.events                     # (sample index, Chunk) as they come; each sample's last
                                       # chunk carries its Result

Any thread may submit and cancel; one thread steps. A request joins at the next step and
leaves as soon as its last sample stops, so the others never wait for it. Its samples share
their prompt (read once) and draft from each other (``consensus.py``). Here, and only here, a
text stops: at the end of generation, a stop string, ``max_tokens`` or the context's edge.

A LlamaSpec decodes one request at a time (``exclusive``): a request may use every cell of the
context, the lanes it leaves are emptied for the next, and one text's speculator (its sources'
memory of the text) goes on with the next text on its lane, as the next turn of a chat.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Callable, ContextManager, Deque, Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

from ..planning.acceptance_model import AcceptanceModel
from ..sources.base import Source
from ..config import GenerationConfig
from ..errors import ConfigError, LlamaspecError, LlamaspecWarning, RemoteError, StreamClosedError
from ..constraints import Constraint, GrammarVocabulary, constraint_of
from ..sources.registry import Group, TextContext, described
from .generation import Chunk, Collector, Result, Vocabulary, seed_of
from .engine import Engine
from ..planning.planner import Planner
from ..sampling import Uniforms
from ..planning.speculator import Speculator
from ..sequences import common_prefix
from .stats import SourceStats, Stats, sum_sources

# The sources of one sample, from what its generation carries (its lane, its group's siblings, None
# for a text alone, its index among them, its grammar's state).
SourceFactory = Callable[[TextContext], List[Source]]


class Request:
    """A prompt to sample ``n`` times. ``events`` receives (sample, Chunk); ``results`` fill in
    as samples end; ``done`` is set once every sample has."""

    def __init__(self, prompt: Sequence[int], config: GenerationConfig, n: int = 1, strategy: str = "plain") -> None:
        check_samples(n, config)
        self.prompt, self.config, self.n, self.strategy = list(prompt), config, n, strategy
        self.events: "queue.SimpleQueue[Tuple[int, Chunk]]" = queue.SimpleQueue()
        self.results: List[Optional[Result]] = [None] * n
        self.done = threading.Event()
        self.error: Optional[BaseException] = None
        self.cancelled = False
        self.lanes: List[int] = []  # the lanes its samples run on, once admitted


class RequestStream:
    """The (sample, Chunk) events of one request as they come; each sample's last chunk carries
    its Result, and ``results`` holds them once the stream ends. ``close()`` ends the request
    early (its samples: what they had, stop reason "interrupted").

    Either this reader makes progress itself (``step``: one scheduler step, under ``lock``, when
    no event waits) or a thread that steps the scheduler does (``step`` None: reading waits for
    it)."""

    WAIT = 60.0  # seconds close() waits for a stepping thread to drop the request

    def __init__(self, request: Request, cancel: Callable[[Request], None],
                 step: Optional[Callable[[], None]] = None, lock: Optional[ContextManager] = None) -> None:
        self.request = request
        self._cancel, self._step = cancel, step
        self._lock = lock if lock is not None else contextlib.nullcontext()
        self._left = request.n  # samples whose last chunk has not been read
        self._ended = False
        self._closed: Optional[str] = None

    def __iter__(self) -> "RequestStream":
        return self

    def __next__(self) -> Tuple[int, Chunk]:
        with self._lock:
            if self._closed:
                raise StreamClosedError(self._closed)
            if self._left == 0:
                self._ended = True
                if self.request.error is not None:
                    raise self.request.error
                raise StopIteration
            try:
                while self._step is not None and self.request.events.empty():
                    self._step()
            except BaseException:  # every sample of this request has ended with it
                self._left, self._ended = 0, True
                raise
            index, chunk = self.request.events.get()
            if chunk.result is not None:
                self._left -= 1
            return index, chunk

    @property
    def results(self) -> List[Result]:
        return [r for r in self.request.results if r is not None]

    @property
    def done(self) -> bool:
        """The request is over and read to its end (or closed)."""
        return self._ended

    def stop(self) -> None:
        """End the request at its next step; reading goes on to each sample's last chunk (its
        result: what it had, stop reason "interrupted")."""
        if not self.request.done.is_set():
            self._cancel(self.request)

    def close(self, reason: str = "") -> None:
        """End the request now. With ``reason``, reading on raises StreamClosedError(reason)."""
        with self._lock:
            if not self.request.done.is_set():
                self._cancel(self.request)
                if self._step is not None:
                    while not self.request.done.is_set():
                        self._step()
                else:
                    self.request.done.wait(self.WAIT)
                if reason:
                    self._closed = reason
            self._ended = True


class Stream:
    """The chunks of one generation (a request of one sample), as they come. ``close()`` ends it
    early and leaves the caches consistent; ``result`` is its Result once it ended, finished or
    not (closed early: stop reason "interrupted"). A stream closed because another generation
    started (``reason``) raises StreamClosedError when read again. ``dropped_turns``: the chat
    turns left out of its prompt, reported in its result."""

    def __init__(self, requests: RequestStream, dropped_turns: int = 0) -> None:
        self._requests, self._dropped = requests, dropped_turns
        self.result: Optional[Result] = None

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> Chunk:
        _, chunk = next(self._requests)
        if chunk.result is not None:
            self._take(chunk.result)
        return chunk

    def stop(self) -> None:
        """End the generation at its next step; its last chunk, with the result, is still read."""
        self._requests.stop()

    def close(self, reason: str = "") -> None:
        """End the generation now (its result: what was generated so far). With ``reason``,
        reading on raises StreamClosedError(reason) instead of stopping quietly."""
        self._requests.close(reason)
        if self.result is None and self._requests.results:
            self._take(self._requests.results[0])

    @property
    def done(self) -> bool:
        return self.result is not None

    def _take(self, result: Result) -> None:
        result.dropped_turns = self._dropped
        self.result = result


def check_samples(n: int, config: GenerationConfig) -> None:
    """ConfigError unless ``n`` samples can be drawn with ``config``."""
    if n < 1:
        raise ConfigError(f"the number of samples must be >= 1, got {n}")
    if n > 1 and config.sampling.greedy:
        raise ConfigError(f"{n} samples at temperature 0 would all be the same text; sample with a temperature "
                          f"above 0 or ask for one")


@dataclass
class _Sample:
    request: Request
    index: int
    lane: int
    collector: Collector
    speculator: Speculator
    admitted: float  # perf_counter when the request joined
    busy: float  # seconds the contexts had spent in llama_decode by then (by its first token, once read)


class Scheduler:
    """Runs requests on an Engine. ``limit``: the positions one lane may use; ``cells``: the KV
    cells of the whole context (a request of n samples may use n lanes' share, or every cell when
    ``exclusive``); ``model``: the acceptance model every lane's speculator shares;
    ``grammars``: the model's vocabulary for the grammars requests carry; ``choose``: the sources
    a request that names some runs (ConfigError for one that does not run here)."""

    def __init__(self, engine: Engine, vocab: Vocabulary, sources: SourceFactory, planner: Planner,
                 cells: int, limit: int, model: Optional[AcceptanceModel] = None, exclusive: bool = False,
                 grammars: Optional[GrammarVocabulary] = None,
                 choose: Callable[[FrozenSet[str]], FrozenSet[str]] = lambda names: names) -> None:
        self.engine, self.vocab, self.sources, self.planner = engine, vocab, sources, planner
        self.choose = choose
        self.grammars = grammars
        self.model = model if model is not None else AcceptanceModel()  # shared: every sample teaches every other
        self.cells, self.limit, self.exclusive = cells, limit, exclusive
        self._kept: Optional[Tuple[int, Speculator]] = None  # (lane, speculator) of the last text alone
        self._inbox: "queue.SimpleQueue[Request]" = queue.SimpleQueue()
        self._waiting: Deque[Request] = deque()
        self._samples: Dict[int, _Sample] = {}  # lane -> sample on it
        self._cancelled: "queue.SimpleQueue[Request]" = queue.SimpleQueue()

    @property
    def n_lanes(self) -> int:
        return len(self.engine.lanes)

    def check(self, request: Request) -> None:
        """ConfigError (GrammarError) for a request this scheduler cannot run; its grammar is
        compiled now, in the caller's thread (kept: the stepping thread only copies its start)."""
        if request.n > self.n_lanes:
            raise ConfigError(f"{request.n} samples need {request.n} sequences decoded together; at most "
                              f"{self.n_lanes} here")
        bad = [token for token, _ in request.config.sampling.logit_bias if token >= self.vocab.n_vocab]
        if bad:
            raise ConfigError(f"logit_bias names token {bad[0]}, which is not in the vocabulary of "
                              f"{self.vocab.n_vocab} tokens")
        if request.config.grammar is not None:
            constraint_of(self.grammars, request.config.grammar)
        if request.config.sources is not None:
            self.choose(request.config.sources)

    def submit(self, request: Request) -> None:
        self.check(request)
        self._inbox.put(request)

    def cancel(self, request: Request) -> None:
        """Stop ``request`` at the next step (its results: stop reason "interrupted")."""
        request.cancelled = True
        self._cancelled.put(request)

    @property
    def busy(self) -> bool:
        return bool(self._samples or self._waiting or not self._inbox.empty())

    def step(self) -> None:
        """Admit waiting requests that fit, then one decode of every lane with work."""
        while not self._cancelled.empty():
            self._drop(self._cancelled.get())
        while not self._inbox.empty():
            self._waiting.append(self._inbox.get())
        while self._waiting and self._admit(self._waiting[0]):
            self._waiting.popleft()
        if not self._samples:
            return
        try:
            steps = self.engine.step()
        except BaseException as e:  # the caches are consistent again; every request on them fails
            ended = list(self._samples.values())
            for sample in ended:
                sample.request.error = e
                self._finish(sample, "interrupted")
            if isinstance(e, RemoteError):  # the servers went: the error carries what the texts had
                e.results = [sample.request.results[sample.index] for sample in ended]
            raise
        for lane, step in steps:
            sample = self._samples[lane]
            first = sample.collector.stats.n_target_calls == 0
            if first:  # its first token: the prompt is read
                sample.collector.stats.t_prompt = time.perf_counter() - sample.admitted
                sample.collector.clock()
                sample.busy = self._busy(sample.speculator)  # t_llama is of the generation loop, as t_decode
            chunk, kept = sample.collector.take(step)
            if first:
                sample.collector.stats.n_first = kept
            ln = self.engine.lanes[lane]
            if kept < len(step.tokens):  # drop what the step accepted past the stop
                self.engine.stop(lane, len(ln.tokens) - len(step.tokens) + kept)
            sample.request.events.put((sample.index, chunk))
            if sample.collector.stop_reason == "stop":
                self._finish(sample, "stop")
            elif not ln.live:
                self._finish(sample, "context" if len(ln.tokens) > ln.limit else "length")

    def run(self, request: Request) -> None:
        """Submit ``request`` and step until it is done (for a caller that owns the scheduler)."""
        self.submit(request)
        while not request.done.is_set():
            self.step()
        if request.error is not None:
            raise request.error

    def _admit(self, request: Request) -> bool:
        idle = [ln for ln in self.engine.lanes if ln.state == "idle" and ln.home not in self._samples]
        if len(idle) < request.n:
            return False
        if request.cancelled:
            self._cancel_waiting(request)
            return True
        # the lane whose cache holds most of the prompt reads it (on a tie, the last text alone's)
        kept = self._kept[0] if self._kept is not None else None
        idle.sort(key=lambda ln: (-common_prefix(ln.cached, request.prompt), ln.home != kept))
        lanes = request.lanes = [ln.home for ln in idle[:request.n]]
        p = len(request.prompt)
        share = self.cells if self.exclusive else self.cells * request.n // self.n_lanes
        limit = min(self.limit, p + (share - p) // request.n)
        group = Group(request.n, p) if request.n > 1 else None  # a text alone has no siblings
        config = request.config
        seed = seed_of(config.sampling)
        max_new = config.max_tokens if config.max_tokens >= 0 else limit
        t0 = time.perf_counter()
        try:
            constraints = [constraint_of(self.grammars, config.grammar) for _ in lanes]
            speculators = self._speculators(request, lanes, group, constraints)
            seeds = [(np.random.default_rng(seed + i), Uniforms(seed + i)) for i in range(request.n)]
            n_eval = self.engine.start(lanes, request.prompt, speculators, config.sampling, seeds, max_new, limit,
                                       constraints, config.logprobs, config.echo, config.logits_processor,
                                       config.stopping_criteria)
        except Exception as e:  # a prompt that does not fit, a cache file gone: this request ends, the others go on
            request.error = e
            self._cancel_waiting(request)
            return True
        for i, lane in enumerate(lanes):
            stats = Stats(strategy=request.strategy, seed=None if config.sampling.greedy else seed + i,
                          n_prompt=p, n_prompt_eval=n_eval if i == 0 else 0)
            self._samples[lane] = _Sample(request, i, lane, Collector(self.vocab, config, stats), speculators[i], t0,
                                          self._busy(speculators[i]))
        return True

    def _speculators(self, request: Request, lanes: Sequence[int], group: Optional[Group],
                     constraints: Sequence[Optional[Constraint]]) -> List[Speculator]:
        """Each sample's speculator: fresh sources, the shared acceptance model and planner. One
        text decoded alone (``exclusive``) and free of any grammar goes on with the last such
        text's speculator on its lane; a text that does not continue its lane's makes the evidence
        weigh less."""
        first = self.engine.lanes[lanes[0]]
        if self.exclusive and first.tokens and common_prefix(first.tokens, request.prompt) < len(first.tokens) - 1:
            self.model.forget()
        if self._continues(request) and self._kept is not None and self._kept[0] == lanes[0]:
            return [self._kept[1]]
        asked = request.config.sources
        chosen = self.choose(asked) if asked is not None else None
        return [Speculator([s for s in self.sources(TextContext(lane, group=group, sample=i, constraint=constraints[i]))
                            if chosen is None or s.name in chosen], self.model, self.planner, self.vocab.eog_tokens,
                           self.vocab.n_vocab)
                for i, lane in enumerate(lanes)]

    def _continues(self, request: Request) -> bool:
        """Whether ``request``'s speculator may go on with the next such request's text (a chat's
        next turn): one text decoded alone, with no grammar (its sources follow its own)."""
        return self.exclusive and request.n == 1 and request.config.grammar is None and request.config.sources is None

    def _busy(self, speculator: Speculator) -> float:
        """Seconds the target's and ``speculator``'s contexts have spent in llama_decode."""
        return self.engine.target.t_llama + sum(c.t_llama for c in speculator.contexts())

    def close(self) -> None:
        """Stop every request, running or waiting (their results: stop reason "interrupted")."""
        while not self._inbox.empty():
            self._waiting.append(self._inbox.get())
        for request in list(self._waiting) + [s.request for s in self._samples.values()]:
            self._drop(request)

    def _cancel_waiting(self, request: Request) -> None:
        for i in range(request.n):
            stats = Stats(strategy=request.strategy, stop_reason="interrupted")
            request.results[i] = Result("", [], "interrupted", stats)
            request.events.put((i, Chunk("", [], 0, request.results[i])))
        request.done.set()

    def _drop(self, request: Request) -> None:
        if request in self._waiting:
            self._waiting.remove(request)
            self._cancel_waiting(request)
            return
        for sample in [s for s in self._samples.values() if s.request is request]:
            self._finish(sample, "interrupted")

    def _finish(self, sample: _Sample, reason: str) -> None:
        """Sample ``sample`` ends: its lane leaves the batch, its last chunk carries its result."""
        del self._samples[sample.lane]
        self.engine.stop(sample.lane)
        collector = sample.collector
        if collector.stop_reason != "stop":
            collector.stop_reason = reason
        result = collector.result()
        result.stats.t_llama = self._busy(sample.speculator) - sample.busy
        constraint = self.engine.lanes[sample.lane].constraint
        result.stats.t_grammar = constraint.seconds if constraint is not None else 0.0
        for source in sample.speculator.sources:
            result.stats.sources.setdefault(source.name, SourceStats())  # every source is listed, verified or not
            try:
                source.finish(self.engine.lanes[sample.lane].tokens)
            except LlamaspecError as e:  # the text is complete: report, do not lose it
                result.warnings.append(str(e))
            except Exception as e:  # a plugin's bug costs it alone, as when it proposes (speculator.py)
                warnings.warn(f"the {source.name} draft source failed at the end of the text: {described(e)}",
                              LlamaspecWarning, stacklevel=2)
        request = sample.request
        request.results[sample.index] = result
        if self.exclusive:  # the lane's text is this one's now: only its speculator may go on with it
            self._kept = (sample.lane, sample.speculator) if self._continues(request) else None
        request.events.put((sample.index, collector.tail()))
        if all(r is not None for r in request.results):
            if self.exclusive:  # the next request gets every cell but its first sample's text
                self.engine.vacate(keep=request.lanes[0])
            request.done.set()


def aggregate(results: Sequence[Result]) -> Stats:
    """One Stats for several samples decoded together: tokens summed, ``t_decode`` the wall time
    from their first token to the last one's end (so ``decode_tps`` is all generated tokens over
    it), per-source counts summed."""
    total = Stats(strategy=results[0].stats.strategy if results else "plain")
    for r in results:
        s = r.stats
        total.n_prompt = max(total.n_prompt, s.n_prompt)
        total.n_prompt_eval += s.n_prompt_eval
        total.t_prompt = max(total.t_prompt, s.t_prompt)
        total.n_predict += s.n_predict
        total.n_first += s.n_first
        total.n_drafted += s.n_drafted
        total.n_accept += s.n_accept
        total.n_target_calls = max(total.n_target_calls, s.n_target_calls)
        total.t_plan += s.t_plan
        total.t_decode = max(total.t_decode, s.t_decode)
    total.sources = sum_sources(r.stats for r in results)
    return total
