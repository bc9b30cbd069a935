"""One generation's text out of the engine's steps: stops, statistics, chunks and the result.

A stop (the end of generation, a stop string) inside a step keeps the tokens before it and cuts
the rest, in the text, the caches and the statistics (the scheduler cuts them). Every step gives
one chunk, its text empty while a partial stop string is held back, so the chunks' tokens add
up to the result's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Mapping, Optional, Protocol, Sequence, Tuple, Union

import numpy as np

from ..config import GenerationConfig, SamplingConfig, SpecConfig
from ..errors import ConfigError, shown
from ..constraints import Grammar
from ..sampling import TokenLogprob
from .engine import Step
from .stats import Stats
from .text import TextStream

STOP_REASONS = ("stop", "length", "context", "interrupted")
# A token's provenance when no candidate supplied it: the target chose it in its step (the
# correction after a rejected candidate, the bonus token after an accepted one, a plain step's).
PLAIN = "plain"


@dataclass
class Result:
    """A generation. ``stop_reason``: "stop" (end of generation or a stop string), "length"
    (max_tokens reached), "context" (the context is full) or "interrupted" (the stream was
    closed before it ended); ``stop_string``: the stop string that ended it, if one did. ``dropped_turns``: the oldest chat turns left out so that the
    conversation fits the context. ``warnings``: what went wrong after the text was complete
    (saving a dynamic n-gram cache). ``logprobs``: each token's, when they were asked for;
    ``prompt_logprobs``: each prompt token's after the first, when asked for (echo).
    ``sources``: each token's provenance, beside ``tokens`` (see ``provenance``)."""

    text: str
    tokens: List[int]
    stop_reason: str
    stats: Stats
    dropped_turns: int = 0
    warnings: List[str] = field(default_factory=list)
    logprobs: Optional[List[TokenLogprob]] = None
    prompt_logprobs: Optional[List[TokenLogprob]] = None
    stop_string: Optional[str] = None
    sources: List[str] = field(default_factory=list)


@dataclass
class Chunk:
    """Text accepted in one step; ``from_draft`` of ``tokens`` were drafted and accepted;
    ``logprobs``: the tokens', when asked for; ``prompt_logprobs``: the first chunk's, the
    prompt's (echo); ``sources``: each token's provenance, beside ``tokens`` (see
    ``provenance``); ``pieces``: the text each token's arrival released, beside them (``text``
    joined: a token's bytes held back, part of a character or of a stop string, come with a later
    one's). The last chunk of a stream carries the ``result``."""

    text: str
    tokens: List[int] = field(default_factory=list)
    from_draft: int = 0
    result: Optional[Result] = None
    logprobs: List[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: List[TokenLogprob] = field(default_factory=list)
    sources: List[str] = field(default_factory=list)
    pieces: List[str] = field(default_factory=list)


def provenance(step: Step, j: int) -> str:
    """Where token ``j`` of ``step`` came from: the source whose candidate held it, verified and
    accepted, else PLAIN (the target's own token ends every step). A token two sources proposed
    is credited to the one whose candidate the step gathered first: the cheap sources in the
    order the speculator asks them, then the draft models (``Trie.sources``' order), so that a
    replayed step names the same source. The statistics count it for both (DraftCounts)."""
    return step.path_sources[j][0] if j < len(step.path_sources) and step.path_sources[j] else PLAIN


class Vocabulary(Protocol):
    n_vocab: int

    @property
    def eog_tokens(self) -> FrozenSet[int]: ...

    def piece(self, token: int) -> bytes: ...


REPLACEMENT = "\ufffd"


class Collector:
    """The text of one generation, step by step: tokens up to the end of generation or a stop
    string, the text safe to show, and the statistics. ``stop_reason`` stays "interrupted"
    until the caller or a stop says otherwise."""

    def __init__(self, vocab: Vocabulary, config: GenerationConfig, stats: Stats) -> None:
        self.vocab, self.stats = vocab, stats
        self.text = TextStream(config.stop)
        self.tokens: List[int] = []
        self.sources: List[str] = []
        self.logprobs: Optional[List[TokenLogprob]] = [] if config.logprobs is not None else None
        self.prompt_logprobs: Optional[List[TokenLogprob]] = [] if config.echo else None
        self.stop_reason = "interrupted"
        self._t0 = time.perf_counter()
        self._result: Optional[Result] = None

    def clock(self) -> None:
        """Time the decoding from now (the prompt was read since the collector was made)."""
        self._t0 = time.perf_counter()

    def take(self, step: Step) -> "tuple[Chunk, int]":
        """The chunk of one step and how many of its tokens count (fewer when it stopped)."""
        kept, taken, sources, pieces = 0, [], [], []
        for j, token in enumerate(step.tokens):
            if j == step.halt:  # the caller's stopping criterion: this token is not the text's
                self.stop_reason = "stop"
                break
            kept += 1
            if token in self.vocab.eog_tokens:
                self.stop_reason = "stop"
                break
            self.tokens.append(token)
            taken.append(token)
            sources.append(provenance(step, j))
            pieces.append(self.text.push(self.vocab.piece(token)))
            if self.text.stopped:
                self.stop_reason = "stop"
                break
        self.sources += sources
        self.stats.record_step(step, kept)
        logprobs = list(step.logprobs[:len(taken)])
        if self.logprobs is not None:
            self.logprobs += logprobs
        if self.prompt_logprobs is not None:
            self.prompt_logprobs += step.echoed
        return Chunk("".join(pieces), taken, min(step.n_accepted, len(taken)), logprobs=logprobs,
                     prompt_logprobs=list(step.echoed), sources=sources, pieces=pieces), kept

    def result(self, dropped_turns: int = 0) -> Result:
        """The generation as it stands: its decode time ends now."""
        self.stats.t_decode = time.perf_counter() - self._t0
        self.stats.stop_reason = self.stop_reason
        self._result = Result(self.text.released, self.tokens, self.stop_reason, self.stats, dropped_turns,
                              logprobs=self.logprobs, prompt_logprobs=self.prompt_logprobs,
                              stop_string=self.text.stop_string, sources=self.sources)
        return self._result

    def tail(self) -> Chunk:
        """The last chunk: what was held back for a stop string that never came, and the result.
        A generation that ended inside a multi-byte character reports it as llama-server does:
        the chunks never show its bytes, the whole text ends with one U+FFFD for them (its JSON
        replaces what is not UTF-8)."""
        assert self._result is not None
        tail = self.text.flush()
        self._result.text = self.text.text + (REPLACEMENT if self.text.incomplete else "")
        return Chunk(tail, [], 0, self._result)


def seed_of(sampling: SamplingConfig) -> int:
    """The seed a generation samples with: the configured one, else one drawn at random."""
    return sampling.seed if sampling.seed is not None else random_seed()


def random_seed() -> int:
    """A seed drawn from the operating system's entropy."""
    return int(np.random.SeedSequence().entropy % 2**31)


_SAMPLING = SamplingConfig()


def make_config(max_tokens: Optional[int] = GenerationConfig.max_tokens, stop: Union[str, Sequence[str], None] = (),
                temperature: float = _SAMPLING.temperature, top_k: int = _SAMPLING.top_k,
                top_p: float = _SAMPLING.top_p, min_p: float = _SAMPLING.min_p, typical_p: float = _SAMPLING.typical_p,
                seed: Optional[int] = None, grammar: Any = None, json_schema: Any = None,
                repeat_penalty: float = _SAMPLING.repeat_penalty, frequency_penalty: float = _SAMPLING.frequency_penalty,
                presence_penalty: float = _SAMPLING.presence_penalty, penalty_last_n: int = _SAMPLING.penalty_last_n,
                logit_bias: Any = None, logprobs: Optional[int] = None, echo: bool = False,
                mirostat: int = _SAMPLING.mirostat, mirostat_tau: float = _SAMPLING.mirostat_tau,
                mirostat_eta: float = _SAMPLING.mirostat_eta, logits_processor: Any = None,
                stopping_criteria: Any = None, sources: Optional[str] = None) -> GenerationConfig:
    """The options of generate, stream, chat and chat_stream as a GenerationConfig (validated).
    ``seed`` None or -1: a random seed (reported in the result's statistics). The text follows
    ``grammar`` (a Grammar, GBNF text or a llama_cpp.LlamaGrammar) or ``json_schema`` (a dict or
    its JSON text; ``{"type": "object"}``: any JSON object), if given. ``max_tokens`` None and
    ``stop`` None mean what llama-cpp-python means: until a stop or a full context, no stop strings.
    Penalties and ``logit_bias`` (a mapping of token ids, or their decimal text as OpenAI sends
    them, to biases; or (token, bias) pairs): see SamplingConfig. ``logprobs``: None, or the
    number of most probable tokens whose log-probabilities come with each token's; ``echo``: the
    prompt's tokens' too (the result's ``prompt_logprobs``). ``mirostat`` (1 or 2), its
    ``mirostat_tau`` and ``mirostat_eta``: llama.cpp's mirostat sampler after the temperature (see
    SamplingConfig). ``logits_processor`` and ``stopping_criteria``: llama-cpp-python's, a
    function of (the text's tokens, a row of logits) or a list of them (applied in turn; any
    criterion stops the text). ``sources``: the draft sources this text may use, as ``--spec``
    names them (auto, none or a comma-separated list of those the LlamaSpec runs); None: auto."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    max_tokens = -1 if max_tokens is None else max_tokens
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                              seed=None if seed == -1 else seed, repeat_penalty=repeat_penalty,
                              frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                              penalty_last_n=penalty_last_n, logit_bias=biases(logit_bias), mirostat=mirostat,
                              mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta)
    if grammar is not None and json_schema is not None:
        raise ConfigError("give a grammar or a JSON schema, not both")
    rules = Grammar.of(grammar, "grammar") if grammar is not None else (
        Grammar.json_schema(json_schema, "json_schema") if json_schema is not None else None)
    return GenerationConfig(max_tokens=max_tokens, stop=stops, sampling=sampling, grammar=rules, logprobs=logprobs,
                            echo=echo, logits_processor=_callbacks(logits_processor, "logits_processor", _chained),
                            stopping_criteria=_callbacks(stopping_criteria, "stopping_criteria", _any),
                            sources=_sources(sources))


def _sources(spec: Optional[str]) -> Optional[FrozenSet[str]]:
    """The sources a request's ``spec`` names (None: auto); ConfigError for one that is not text."""
    if spec is None:
        return None
    if not isinstance(spec, str):
        raise ConfigError(f"is auto, none or a comma-separated list of draft sources, got {shown(spec)}", "spec")
    try:
        return SpecConfig.parse(spec).sources
    except ConfigError as e:
        raise ConfigError(str(e), "spec") from None


def _callbacks(value: Any, name: str, join: Callable[[Sequence[Callable]], Callable]) -> Optional[Callable]:
    """llama-cpp-python's callbacks as one function: a callable itself (its LogitsProcessorList
    and StoppingCriteriaList are), or a list of them joined by ``join``; ConfigError otherwise."""
    if value is None or callable(value):
        return value
    if isinstance(value, (list, tuple)) and all(callable(f) for f in value):
        return join(list(value))
    raise ConfigError(f"{name} is a function of (input_ids, logits) or a list of them, got {shown(value)}")


def _chained(processors: Sequence[Callable]) -> Callable:
    def process(input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        for processor in processors:
            scores = processor(input_ids, scores)
        return scores
    return process


def _any(criteria: Sequence[Callable]) -> Callable:
    return lambda input_ids, logits: any([criterion(input_ids, logits) for criterion in criteria])


def biases(value: Any) -> Tuple[Tuple[int, float], ...]:
    """Logit biases as (token, bias) pairs in token order: from a mapping (OpenAI's ``logit_bias``,
    token ids as decimal text) or pairs; ConfigError for a key that is not a token id."""
    if not value:
        return ()
    pairs = value.items() if isinstance(value, Mapping) else value
    out: Dict[int, float] = {}
    for token, bias in pairs:
        try:
            key = int(token)
            out[key] = -math.inf if bias is False else float(bias)  # llama-server: false bans the token
        except (TypeError, ValueError):
            raise ConfigError(f"logit_bias maps token ids to numbers, got {shown(token)}: {shown(bias)}") from None
    return tuple(sorted(out.items()))


def last(chunks: Iterator[Chunk]) -> Result:
    result = None
    for chunk in chunks:
        result = chunk.result
    assert result is not None
    return result
