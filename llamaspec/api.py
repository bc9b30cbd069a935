"""The public Python API: load a target (and a draft), then generate, stream or chat."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence, Union

import numpy as np

from ._llama import Context, Model
from .chat import ChatTemplate, Message
from . import models
from .config import DraftConfig, GenerationConfig, LookaheadConfig, LookupConfig, ModelConfig, SamplingConfig
from .costs import CostCurve, load_or_measure
from .draft_length import DraftLength
from .drafters import ChainDrafter, DraftModelDrafter, Drafter, LookupDrafter, NoDrafter
from .lookahead import LookaheadDrafter, check_fits
from .lookup import PromptLookup
from .ngram_cache import NgramCaches
from .engine import Engine
from .errors import PromptError
from .models import resolve_model
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
    """A target model, optionally a draft model, and their KV caches.

    The caches persist between calls: a prompt that extends the previous one (the next turn
    of a chat) evaluates only its new tokens.
    """

    def __init__(self, target: ModelConfig, draft: Optional[ModelConfig] = None,
                 draft_config: DraftConfig = DraftConfig(), cache_dir: Optional[Path] = None,
                 progress: bool = True, lookup: Optional[LookupConfig] = None,
                 references: Sequence[str] = (), lookahead: Optional[LookaheadConfig] = None) -> None:
        """``lookup`` turns on lookup decoding, ``lookahead`` lookahead decoding (tried in that
        order, then the draft model); ``references`` are texts lookup and lookahead may copy."""
        self.target_config, self.draft_config = target, draft_config
        n_seq = check_fits(lookahead, target.n_ctx, target.n_batch) if lookahead is not None else 1
        self.model = Model(resolve_model(target.path, cache_dir, progress), target.n_gpu_layers)
        self.draft_model: Optional[Model] = None
        if draft is not None:
            self.draft_model = Model(resolve_model(draft.path, cache_dir, progress), draft.n_gpu_layers)
            check_compatible(self.model, self.draft_model)
        self.ctx = Context(self.model, target.n_ctx, target.threads, target.n_batch, n_seq)
        ref_tokens = [self.model.tokenize(text, add_special=False, parse_special=False) for text in references]
        drafters: List[Drafter] = []
        if lookup is not None or lookahead is not None:
            costs = load_or_measure(self.ctx, models.cache_dir(cache_dir) / "costs.json")
        if lookup is not None:
            drafters.append(self._lookup_drafter(lookup, ref_tokens, costs))
        if lookahead is not None:
            drafters.append(LookaheadDrafter(self.ctx, lookahead, DraftLength(costs), ref_tokens))
        if draft is not None and self.draft_model is not None:
            draft_ctx = Context(self.draft_model, draft.n_ctx, draft.threads, draft.n_batch)
            drafters.append(DraftModelDrafter(draft_ctx, draft_config))
        drafter = ChainDrafter(*drafters) if len(drafters) > 1 else drafters[0] if drafters else NoDrafter()
        self.engine = Engine(self.ctx, drafter)
        self._template: Optional[ChatTemplate] = None

    def _lookup_drafter(self, cfg: LookupConfig, ref_tokens: List[List[int]], costs: CostCurve) -> LookupDrafter:
        caches = NgramCaches.open(cfg, self.model.n_vocab) if (cfg.cache_static or cfg.cache_dynamic) else None
        return LookupDrafter(PromptLookup(cfg.ngram_min, cfg.ngram_max, cfg.policy, ref_tokens),
                             DraftLength(costs), cfg.draft_max, caches)

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
        stats = Stats(strategy=self.engine.drafter.name)
        self.engine.prefill(prompt, stats)
        seed = config.sampling.seed
        rng = np.random.default_rng(seed)
        text = TextStream(config.stop)
        out: List[int] = []
        stop_reason = "length"
        max_new = config.max_tokens if config.max_tokens >= 0 else self.ctx.n_ctx
        contexts = self.engine.contexts()
        busy0 = sum(c.t_llama for c in contexts)
        t0 = time.perf_counter()
        steps = self.engine.steps(config.sampling, rng, max_new, stats)
        try:
            for new, from_draft in steps:
                piece, kept = "", 0
                for token in new:
                    kept += 1
                    if self.model.is_eog(token):
                        stop_reason = "stop"
                        break
                    out.append(token)
                    piece += text.push(self.model.piece(token))
                    if text.stopped:
                        stop_reason = "stop"
                        break
                if stop_reason == "stop":
                    # drop what the step accepted past the stop; the stop token stays pending
                    self.engine.rewind(len(self.engine.tokens) - len(new) + kept)
                    stats.n_predict -= len(new) - kept
                    from_draft = min(from_draft, kept)
                if piece:
                    yield Chunk(piece, new[:kept], from_draft)
                if stop_reason == "stop":
                    break
        finally:
            steps.close()
            stats.t_decode = time.perf_counter() - t0
            stats.t_llama = sum(c.t_llama for c in contexts) - busy0
            self.engine.drafter.finish(self.engine.tokens)
            stats.extra = self.engine.drafter.extra_stats()
        tail = text.flush()
        yield Chunk(tail, [], 0, Result(text.text, out, stop_reason, stats))

    def reset(self) -> None:
        """Forget the conversation: clear every KV cache."""
        for ctx in self.engine.contexts():
            ctx.clear()
        self.engine.tokens = []

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


def make_config(max_tokens: int = 256, stop: Union[str, Sequence[str]] = (), temperature: float = 0.8,
                top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                seed: Optional[int] = None) -> GenerationConfig:
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    return GenerationConfig(max_tokens=max_tokens, stop=stops, sampling=sampling)


def _last(chunks: Iterator[Chunk]) -> Result:
    result = None
    for chunk in chunks:
        result = chunk.result
    assert result is not None
    return result


def load(model: str, draft: Optional[str] = None, *, lookup: Union[bool, LookupConfig] = False,
         lookahead: Union[bool, LookaheadConfig] = False, references: Sequence[str] = (), n_ctx: int = 4096, n_threads: Optional[int] = None,
         n_gpu_layers: int = 0, n_gpu_layers_draft: int = 0, draft_max: int = 16, draft_min: int = 0,
         draft_p_min: float = 0.75, cache_dir: Optional[Path] = None, progress: bool = True) -> LlamaSpec:
    """Load a target model (a GGUF path or a models.txt name), optionally a draft model, and
    optionally lookup decoding (``lookup=True`` or a LookupConfig; ``references``: texts) and
    lookahead decoding (``lookahead=True`` or a LookaheadConfig)."""
    target = ModelConfig(model, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
    draft_cfg = ModelConfig(draft, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers_draft) if draft else None
    lookup_cfg = LookupConfig() if lookup is True else (lookup or None)
    lookahead_cfg = LookaheadConfig() if lookahead is True else (lookahead or None)
    return LlamaSpec(target, draft_cfg, DraftConfig(draft_max, draft_min, draft_p_min), cache_dir, progress,
                     lookup_cfg, references, lookahead_cfg)
