"""What every strategy of a benchmark shares, and the strategies: which draft sources each runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..llama import models
from ..llama.pool import ModelPool
from ..api import LlamaSpec
from ..config import ModelConfig, SamplingConfig, SpecConfig
from ..errors import ConfigError
from ..sources import default_registry


@dataclass(frozen=True)
class BenchSettings:
    """Models and settings shared by every strategy. Greedy unless ``temperature`` > 0.
    ``sources``: the draft sources' settings by keyword, as ``llamaspec.load`` takes them
    (``draft_max``, ``lookahead_w``...; the others keep their defaults); ``fixed``: sources
    verified whole every step where a strategy runs them (lookahead: all G candidates and the
    whole window, as llama-lookahead does)."""

    model: str
    draft_model: Optional[str] = None
    n_predict: int = 256
    n_ctx: int = ModelConfig.n_ctx
    n_threads: Optional[int] = None
    n_gpu_layers: int = ModelConfig.n_gpu_layers
    n_gpu_layers_draft: int = ModelConfig.n_gpu_layers
    temperature: float = 0.0
    seed: Optional[int] = None
    repeat: int = 3
    rpc: Tuple[str, ...] = ()  # RPC servers holding the target's layers (and the draft's with rpc_draft)
    rpc_draft: bool = False
    tensor_split: Tuple[float, ...] = ()
    rpc_timeout: float = ModelConfig.rpc_timeout
    sources: Dict[str, Any] = field(default_factory=dict)
    fixed: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.n_predict < 1 and self.n_predict != -1:
            raise ConfigError(f"the number of tokens to generate must be >= 1 (or -1: until a stop), "
                              f"got {self.n_predict}")
        if self.repeat < 1:
            raise ConfigError(f"repeat must be >= 1, got {self.repeat}")
        default_registry().configs(self.sources)  # validate now
        self.target_config()
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

    def setting(self, keyword: str) -> Any:
        """A source's setting: as given, else its default."""
        return self.sources.get(keyword, default_registry().options()[keyword][1])

    def gives(self, name: str, cache_dir: Optional[Path] = None) -> bool:
        """Whether source ``name`` has what it loads: a file the settings name, or one the cache
        (``cache_dir``, else the default) keeps for the target (heads trained for it)."""
        registry = default_registry()
        config = registry.configs(self.sources, models.file_name(self.model), models.cache_dir(cache_dir))[name]
        return registry[name].loads_from(config, self.draft_model_config())


@dataclass(frozen=True)
class Strategy:
    """Which draft sources a strategy runs (``SpecConfig``) and what it is."""

    description: str
    spec: SpecConfig
    loads_file: bool = False  # its source loads a file the settings give (a heads file)

    @property
    def needs_draft(self) -> bool:
        return bool(set(self.spec.sources or ()) & set(default_registry().on_draft_model()))


def _strategies() -> Dict[str, Strategy]:
    """Plain, each source that runs alone here (on the models a bench takes, or a file of its
    own such as a heads file; not the n-gram caches, siblings or a grammar), the draft model
    verified whole, and auto."""
    registry = default_registry()
    on_draft = registry.on_draft_model()

    def file_of_its_own(p: Any) -> bool:
        return bool(p.loads) and p.name not in on_draft and any(o.path for o in p.options)
    alone = [p for p in registry.plugins if not p.needs and p.joins is None
             and (not p.loads or p.name in on_draft or file_of_its_own(p))]
    return {
        "plain": Strategy("plain decoding: one token per target call", SpecConfig(frozenset())),
        **{p.name: Strategy(p.describe, SpecConfig(frozenset({p.name})), file_of_its_own(p)) for p in alone},
        **{f"{name}-fixed": Strategy(f"the {name} source every step, verified whole (llama-speculative-simple's "
                                     f"way)", SpecConfig(frozenset({name}), frozenset({name})))
           for name in registry.on_draft_model()},
        "auto": Strategy("every source the models allow, chosen step by step (the default)", SpecConfig()),
    }


STRATEGIES = _strategies()


def default_strategies(settings: BenchSettings, cache_dir: Optional[Path] = None) -> List[str]:
    """Plain, each single source the given models (and files, given or in ``cache_dir``) allow, and auto."""
    return [name for name, s in STRATEGIES.items() if (settings.draft_model or not s.needs_draft) and not s.spec.fixed
            and (not s.loads_file or settings.gives(name, cache_dir))]


def check_strategies(names: Sequence[str], settings: BenchSettings, cache_dir: Optional[Path] = None) -> None:
    """ConfigError for an unknown name or a strategy that needs a draft model when none is given."""
    for name in names:
        if name not in STRATEGIES:
            raise ConfigError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
        if STRATEGIES[name].needs_draft and not settings.draft_model:
            raise ConfigError(f"strategy {name!r} needs a draft model (-md)")
        if STRATEGIES[name].loads_file and not settings.gives(name, cache_dir):
            raise ConfigError(f"strategy {name!r} needs {default_registry()[name].loads}")


def build_spec(name: str, settings: BenchSettings, cache_dir: Optional[Path] = None,
               progress: bool = True, pool: Optional[ModelPool] = None) -> LlamaSpec:
    """A LlamaSpec running strategy ``name``; auto uses the draft model when one is given.
    Strategies built with one ``pool`` share their models' weights."""
    spec = STRATEGIES[name].spec
    runs = spec.sources if spec.sources is not None else frozenset(default_registry().names)
    spec = spec.with_fixed(frozenset(settings.fixed) & runs)
    uses_draft = bool(set(runs) & set(default_registry().on_draft_model()))
    draft = settings.draft_model_config() if uses_draft else None
    return LlamaSpec(settings.target_config(), draft, settings=settings.sources, cache_dir=cache_dir,
                     progress=progress, spec=spec, pool=pool)
