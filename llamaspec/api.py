"""The public Python API: load a target (and a draft), then generate, stream or chat."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, List, Optional, Protocol, Sequence, Union

import numpy as np

from ._llama import Context, Model
from .chat import ChatTemplate, Message
from . import models
from .acceptance_model import AcceptanceModel
from .candidates import Source
from .config import (DraftConfig, GenerationConfig, LookaheadConfig, LookupConfig, ModelConfig, SamplingConfig,
                     SpecConfig)
from .costs import CostCurve, CostModel, load_or_measure
from .draft_model import DraftModelSource
from .engine import Engine
from .errors import ConfigError, PromptError
from .lookahead import LookaheadSource, check_fits
from .lookup import LookupSource
from .ngram_cache import CacheSource, NgramCaches
from .planner import MAX_LEAVES, Planner
from .speculator import Speculator
from .models import resolve_model
from .sampling import Uniforms
from .stats import Stats
from .text import TextStream
from .vocab import check_compatible

Prompt = Union[str, Sequence[int]]


@dataclass
class Result:
    """A finished generation. ``stop_reason`` is "stop" (end of generation or a stop string)
    or "length" (max_tokens reached or the context is full)."""

    text: str
    tokens: List[int]
    stop_reason: str
    stats: Stats


@dataclass
class Chunk:
    """Text accepted in one step; ``from_draft`` of ``tokens`` were drafted and accepted.
    The last chunk of a stream carries the ``result``."""

    text: str
    tokens: List[int] = field(default_factory=list)
    from_draft: int = 0
    result: Optional[Result] = None


class LlamaSpec:
    """A target model, optionally a draft model, their KV caches and the draft sources.

    ``spec`` chooses the sources (default auto: every one the loaded models and files allow);
    ``lookup`` and ``lookahead`` are their parameters; ``references`` are texts lookup and
    lookahead may copy from. The caches persist between calls: a prompt that extends the
    previous one (the next turn of a chat) evaluates only its new tokens.
    """

    def __init__(self, target: ModelConfig, draft: Optional[ModelConfig] = None,
                 draft_config: DraftConfig = DraftConfig(), cache_dir: Optional[Path] = None,
                 progress: bool = True, lookup: LookupConfig = LookupConfig(), references: Sequence[str] = (),
                 lookahead: LookaheadConfig = LookaheadConfig(), spec: SpecConfig = SpecConfig()) -> None:
        self.target_config, self.draft_config = target, draft_config
        names = spec.resolve(draft is not None, bool(lookup.cache_static or lookup.cache_dynamic))
        if references and not names & {"lookup", "lookahead"}:
            raise ConfigError("references are read by the lookup and lookahead sources; --spec excludes both")
        self.spec_name = spec.name if names else "plain"
        leaves, n_seq = MAX_LEAVES, 1 + MAX_LEAVES
        if "lookahead" in names:
            n_seq = check_fits(lookahead, target.n_ctx, target.n_batch, whole="lookahead" in spec.fixed)
            leaves = n_seq - 1 - lookahead.w
        if "cache" in names:
            NgramCaches.open(lookup)  # bad cache files: fail before loading anything
        self.model = Model(resolve_model(target.path, cache_dir, progress), target.n_gpu_layers)
        self.draft_model: Optional[Model] = None
        if draft is not None and "draft" in names:
            self.draft_model = Model(resolve_model(draft.path, cache_dir, progress), draft.n_gpu_layers)
            check_compatible(self.model, self.draft_model)
        self.ctx = Context(self.model, target.n_ctx, target.threads, target.n_batch, n_seq)
        self._draft_ctx: Optional[Context] = None
        costs_file = models.cache_dir(cache_dir) / "costs.json"
        draft_curve = None
        if self.draft_model is not None and draft is not None:
            self._draft_ctx = Context(self.draft_model, draft.n_ctx, draft.threads, draft.n_batch)
            draft_curve = load_or_measure(self._draft_ctx, costs_file, progress)
        curve = load_or_measure(self.ctx, costs_file, progress) if names else CostCurve.flat()
        self._costs = CostModel(curve, draft_curve)
        self._names, self._fixed, self._lookup, self._lookahead = names, spec.fixed, lookup, lookahead
        self._references = [self.model.tokenize(text, add_special=False, parse_special=False) for text in references]
        self.engine = Engine(self.ctx, self._speculator(), leaves)
        self._template: Optional[ChatTemplate] = None

    def _speculator(self) -> Speculator:
        """The sources, a fresh acceptance model and the planner (the cost model lives on)."""
        names, lookup, refs = self._names, self._lookup, self._references
        sources: List[Source] = []
        if "lookup" in names:
            sources.append(LookupSource(lookup.ngram_min, lookup.ngram_max, refs, lookup.draft_max))
        if "cache" in names:
            caches = NgramCaches.open(lookup)
            caches.validate_vocab(self.model.n_vocab)
            sources.append(CacheSource(caches, lookup.draft_max))
        if "lookahead" in names:
            sources.append(LookaheadSource(self._lookahead, refs))
        if self._draft_ctx is not None:
            sources.append(DraftModelSource(self._draft_ctx, self.draft_config))
        return Speculator(sources, AcceptanceModel(), Planner(self._costs, self._fixed))

    # --- text ---------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True) -> List[int]:
        """Tokens of raw text with special tokens parsed, as llama.cpp's programs tokenize a prompt."""
        return self.model.tokenize(text, add_special=add_special, parse_special=True)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.model.detokenize(tokens)

    def format_chat(self, messages: Sequence[Message]) -> str:
        if self._template is None:
            self._template = ChatTemplate(self.model)
        return self._template.render(messages)

    # --- generation ---------------------------------------------------------------------
    def generate(self, prompt: Prompt, **options: Any) -> Result:
        """Generate from raw text (or tokens). Options: max_tokens, stop, temperature, top_k,
        top_p, min_p, seed."""
        return _last(self.stream(prompt, **options))

    def chat(self, messages: Sequence[Message], **options: Any) -> Result:
        """Reply to chat messages, formatted with the model's own template."""
        return _last(self.chat_stream(messages, **options))

    def chat_stream(self, messages: Sequence[Message], **options: Any) -> Iterator[Chunk]:
        text = self.format_chat(messages)
        return self.stream(self.model.tokenize(text, add_special=False, parse_special=True), **options)

    def stream(self, prompt: Prompt, **options: Any) -> Iterator[Chunk]:
        """Yield chunks of text as the target accepts them; the last chunk carries the Result."""
        config = make_config(**options)
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        if not tokens or (isinstance(prompt, str) and not prompt.strip()):
            raise PromptError("the prompt is empty")
        return self._run(tokens, config)

    def _run(self, prompt: List[int], config: GenerationConfig) -> Iterator[Chunk]:
        return run(self.engine, self.model, prompt, config, self.spec_name)

    def reset(self) -> None:
        """Forget the conversation and what speculation learned from it: every KV cache, the
        sources' memory of the text, the acceptance estimates. (The measured costs stay.)"""
        self.engine.restart(self._speculator())

    def close(self) -> None:
        for ctx in self.engine.contexts():
            ctx.close()
        for model in (self.model, self.draft_model):
            if model is not None:
                model.close()

    def __enter__(self) -> "LlamaSpec":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Vocabulary(Protocol):
    def is_eog(self, token: int) -> bool: ...

    def piece(self, token: int) -> bytes: ...


def run(engine: Engine, vocab: Vocabulary, prompt: List[int], config: GenerationConfig,
        strategy: str = "plain") -> Iterator[Chunk]:
    """One generation on ``engine``: chunks of text as the target accepts them, the last one
    carrying the Result. A stop (end of generation, a stop string) inside a step keeps the
    tokens before it and cuts the rest, in the text, the caches and the statistics; chunk
    tokens add up to the result's (one chunk per step, its text empty while a partial stop
    string is held back)."""
    stats = Stats(strategy=strategy)
    t0 = time.perf_counter()
    stats.n_prompt_eval = engine.prefill(prompt)
    stats.n_prompt, stats.t_prompt = len(prompt), time.perf_counter() - t0
    seed = config.sampling.seed if config.sampling.seed is not None else int(np.random.SeedSequence().entropy % 2**31)
    stats.seed = seed
    rng = np.random.default_rng(seed)
    text = TextStream(config.stop)
    out: List[int] = []
    stop_reason = "length"
    max_new = config.max_tokens if config.max_tokens >= 0 else engine.target.n_ctx
    contexts = engine.contexts()
    busy0 = sum(c.t_llama for c in contexts)
    t0 = time.perf_counter()
    steps = engine.steps(config.sampling, rng, max_new, Uniforms(seed))
    try:
        for step in steps:
            piece, kept, taken = "", 0, []
            for token in step.tokens:
                kept += 1
                if vocab.is_eog(token):
                    stop_reason = "stop"
                    break
                out.append(token)
                taken.append(token)
                piece += text.push(vocab.piece(token))
                if text.stopped:
                    stop_reason = "stop"
                    break
            stats.record_step(step, kept)
            if kept < len(step.tokens):  # drop what the step accepted past the stop
                engine.rewind(len(engine.tokens) - len(step.tokens) + kept)
            yield Chunk(piece, taken, min(step.n_accepted, len(taken)))
            if stop_reason == "stop":
                break
    finally:
        steps.close()
        stats.t_decode = time.perf_counter() - t0
        stats.t_llama = sum(c.t_llama for c in contexts) - busy0
        engine.finish()
    tail = text.flush()
    yield Chunk(tail, [], 0, Result(text.text, out, stop_reason, stats))


_SAMPLING = SamplingConfig()


def make_config(max_tokens: int = GenerationConfig.max_tokens, stop: Union[str, Sequence[str]] = (),
                temperature: float = _SAMPLING.temperature, top_k: int = _SAMPLING.top_k,
                top_p: float = _SAMPLING.top_p, min_p: float = _SAMPLING.min_p,
                seed: Optional[int] = None) -> GenerationConfig:
    """The options of generate, stream, chat and chat_stream as a GenerationConfig (validated)."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    return GenerationConfig(max_tokens=max_tokens, stop=stops, sampling=sampling)


def _last(chunks: Iterator[Chunk]) -> Result:
    result = None
    for chunk in chunks:
        result = chunk.result
    assert result is not None
    return result


def load(model: str, draft: Optional[str] = None, *, spec: str = "auto", lookup: Union[bool, LookupConfig] = False,
         lookahead: Union[bool, LookaheadConfig] = False, references: Sequence[str] = (),
         n_ctx: int = ModelConfig.n_ctx, n_threads: Optional[int] = None, n_gpu_layers: int = ModelConfig.n_gpu_layers,
         n_gpu_layers_draft: int = ModelConfig.n_gpu_layers, draft_max: int = DraftConfig.draft_max,
         draft_min: int = DraftConfig.draft_min, draft_p_min: float = DraftConfig.draft_p_min,
         cache_dir: Optional[Path] = None, progress: bool = True) -> LlamaSpec:
    """Load a target model (a GGUF path or a models.txt name) and optionally a draft model.

    ``spec``: "auto" (every source the models allow), "none" (plain decoding) or a list such as
    "lookup,lookahead,draft". ``lookup=True`` / ``lookahead=True`` are shorthands that restrict
    the sources to those (plus the draft model when one is given); a LookupConfig or
    LookaheadConfig sets their parameters. ``references``: texts lookup and lookahead copy from.
    """
    spec_cfg = SpecConfig.parse(spec)
    chosen = [name for name, on in (("lookup", lookup), ("lookahead", lookahead)) if on is True]
    if chosen:
        if spec_cfg.sources is not None:
            raise ConfigError("give spec or the lookup=True / lookahead=True shorthands, not both")
        spec_cfg = SpecConfig(frozenset(chosen + (["draft"] if draft else [])))
    target = ModelConfig(model, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
    draft_cfg = ModelConfig(draft, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers_draft) if draft else None
    lookup_cfg = lookup if isinstance(lookup, LookupConfig) else LookupConfig()
    lookahead_cfg = lookahead if isinstance(lookahead, LookaheadConfig) else LookaheadConfig()
    return LlamaSpec(target, draft_cfg, DraftConfig(draft_max, draft_min, draft_p_min), cache_dir, progress,
                     lookup_cfg, references, lookahead_cfg, spec_cfg)
