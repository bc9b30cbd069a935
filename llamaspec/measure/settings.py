"""What every strategy of a benchmark shares, and the strategies: which draft sources each runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..llama.pool import ModelPool
from ..api import LlamaSpec
from ..config import DraftConfig, LookaheadConfig, LookupConfig, ModelConfig, SamplingConfig, SpecConfig
from ..errors import ConfigError
from ..sources.registry import Need
from ..sources import default_registry

_DRAFT, _LOOKUP, _LOOKAHEAD = DraftConfig(), LookupConfig(), LookaheadConfig()


@dataclass(frozen=True)
class BenchSettings:
    """Models and settings shared by every strategy. Greedy unless ``temperature`` > 0."""

    model: str
    draft_model: Optional[str] = None
    n_predict: int = 256
    n_ctx: int = ModelConfig.n_ctx
    n_threads: Optional[int] = None
    n_gpu_layers: int = ModelConfig.n_gpu_layers
    n_gpu_layers_draft: int = ModelConfig.n_gpu_layers
    draft_max: int = _DRAFT.draft_max
    draft_min: int = _DRAFT.draft_min
    draft_p_min: float = _DRAFT.draft_p_min
    lookup_draft_max: int = _LOOKUP.draft_max
    lookahead_w: int = _LOOKAHEAD.w
    lookahead_n: int = _LOOKAHEAD.n
    lookahead_g: int = _LOOKAHEAD.g
    lookahead_fixed: bool = False  # every step verifies all G candidates and decodes the whole window
    temperature: float = 0.0
    seed: Optional[int] = None
    repeat: int = 3
    rpc: Tuple[str, ...] = ()  # RPC servers holding the target's layers (and the draft's with rpc_draft)
    rpc_draft: bool = False
    tensor_split: Tuple[float, ...] = ()
    rpc_timeout: float = ModelConfig.rpc_timeout

    def __post_init__(self) -> None:
        if self.n_predict < 1 and self.n_predict != -1:
            raise ConfigError(f"the number of tokens to generate must be >= 1 (or -1: until a stop), "
                              f"got {self.n_predict}")
        if self.repeat < 1:
            raise ConfigError(f"repeat must be >= 1, got {self.repeat}")
        self.draft_config(), self.lookup_config(), self.lookahead_config(), self.target_config()  # validate now
        SamplingConfig(temperature=self.temperature, seed=self.seed)

    def target_config(self) -> ModelConfig:
        return ModelConfig(self.model, n_ctx=self.n_ctx, n_threads=self.n_threads, n_gpu_layers=self.n_gpu_layers,
                           **self._placed())

    def draft_model_config(self) -> Optional[ModelConfig]:
        if not self.draft_model:
            return None
        return ModelConfig(self.draft_model, n_ctx=self.n_ctx, n_threads=self.n_threads,
                           n_gpu_layers=self.n_gpu_layers_draft, **(self._placed() if self.rpc_draft else {}))

    def _placed(self) -> dict:
        return dict(rpc=tuple(self.rpc), tensor_split=tuple(self.tensor_split), rpc_timeout=self.rpc_timeout)

    def draft_config(self) -> DraftConfig:
        return DraftConfig(self.draft_max, self.draft_min, self.draft_p_min)

    def lookup_config(self) -> LookupConfig:
        return LookupConfig(draft_max=self.lookup_draft_max)

    def lookahead_config(self) -> LookaheadConfig:
        return LookaheadConfig(w=self.lookahead_w, n=self.lookahead_n, g=self.lookahead_g)


@dataclass(frozen=True)
class Strategy:
    """Which draft sources a strategy runs (``SpecConfig``) and what it is."""

    description: str
    spec: SpecConfig

    @property
    def needs_draft(self) -> bool:
        registry = default_registry()
        return any(Need.DRAFT_MODEL in registry[name].needs for name in self.spec.sources or ())


# What a bench can give a source: its draft model (-md); no cache files, siblings or grammar.
_BENCHED = frozenset({Need.DRAFT_MODEL})
STRATEGIES: Dict[str, Strategy] = {
    "plain": Strategy("plain decoding: one token per target call", SpecConfig(frozenset())),
    **{p.name: Strategy(p.describe, SpecConfig(frozenset({p.name})))  # each source that runs alone here
       for p in default_registry().plugins if p.needs <= _BENCHED and p.joins is None},
    "draft-fixed": Strategy("the draft model every step, --draft-max tokens (llama-speculative-simple's way)",
                            SpecConfig(frozenset({"draft"}), frozenset({"draft"}))),
    "auto": Strategy("every source the models allow, chosen step by step (the default)", SpecConfig()),
}


def default_strategies(settings: BenchSettings) -> List[str]:
    """Plain, each single source the given models allow, and auto."""
    return [name for name, s in STRATEGIES.items() if (settings.draft_model or not s.needs_draft) and not s.spec.fixed]


def check_strategies(names: Sequence[str], settings: BenchSettings) -> None:
    """ConfigError for an unknown name or a strategy that needs a draft model when none is given."""
    for name in names:
        if name not in STRATEGIES:
            raise ConfigError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
        if STRATEGIES[name].needs_draft and not settings.draft_model:
            raise ConfigError(f"strategy {name!r} needs a draft model (-md)")


def build_spec(name: str, settings: BenchSettings, cache_dir: Optional[Path] = None,
               progress: bool = True, pool: Optional[ModelPool] = None) -> LlamaSpec:
    """A LlamaSpec running strategy ``name``; auto uses the draft model when one is given.
    Strategies built with one ``pool`` share their models' weights."""
    spec = STRATEGIES[name].spec
    if settings.lookahead_fixed and "lookahead" in (spec.sources or ()):
        spec = spec.with_fixed(frozenset({"lookahead"}))
    uses_draft = "draft" in (spec.sources if spec.sources is not None else {"draft"})
    draft = settings.draft_model_config() if uses_draft else None
    return LlamaSpec(settings.target_config(), draft, settings.draft_config(), cache_dir, progress,
                     lookup=settings.lookup_config(), lookahead=settings.lookahead_config(), spec=spec, pool=pool)
