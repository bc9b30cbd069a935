"""A LlamaSpec put together: which draft sources run, the models, contexts and cost curves they
run on, and the scheduler a LlamaSpec (or a batcher of it) decodes through. ``api.py`` holds
the public methods; this module the assembly, in the order it happens::

    settings (by keyword) -> each source's config        Registry.configs
    --spec, what each source has to load -> the names     Registry.resolve
    each source's checks (files read)                     before any model loads
    the target model and its context                      through the model pool
    each source's load (cache files, a draft model)       through Resources, freed with it
    the target's cost curve (measured once per machine)   after the loads' checks
    each source's Setup -> fresh sources per generation   Registry.build
    engine + scheduler (one text, or a batch of several)  Assembly.scheduler / Assembly.batcher
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence

from .config import ModelConfig, SpecConfig
from .constraints import GrammarVocabulary
from .engine.batcher import Batcher
from .engine.engine import Engine
from .engine.scheduler import Scheduler
from .errors import ConfigError, LlamaspecWarning
from .llama import models
from .llama.binding import Context, Model, gpus, max_sequences, queues_decodes, supports_gpu_offload
from .llama.models import resolve_model
from .llama.pool import ModelPool
from .planning.acceptance_model import AcceptanceModel
from .planning.costs import CostCurve, CostModel, load_or_measure, load_or_measure_draft
from .planning.planner import MAX_LEAVES, Planner
from .sources.base import Source
from .sources.registry import Registry, Room, Setup, Target, TextContext

# Texts decoded together at most (the samples of one prompt; each is a KV-cache sequence).
MAX_SAMPLES = 16


class Resources:
    """What a source's plugin loads with (sources.registry.Resources): models through the pool,
    contexts and cost curves; what is loaded here is freed with the assembly."""

    def __init__(self, pool: ModelPool, target: Model, draft: Optional[ModelConfig],
                 target_curve: Callable[[], CostCurve], costs_file: Path, cache_dir: Optional[Path],
                 progress: bool) -> None:
        self.target, self.draft, self.lanes = target, draft, MAX_SAMPLES
        self._pool, self._target_curve, self._costs_file = pool, target_curve, costs_file
        self._cache_dir, self._progress = cache_dir, progress
        self.models: List[Model] = []
        self.contexts: List[Context] = []

    def model(self, config: ModelConfig) -> Model:
        _warn_about(config)
        model = self._pool.get(resolve_model(config.path, self._cache_dir, self._progress), config.offloaded,
                               config.rpc, config.tensor_split, config.rpc_timeout)
        self.models.append(model)
        return model

    def context(self, model: Model, config: ModelConfig, n_seq: int) -> Context:
        ctx = model.context(config.n_ctx, config.threads, config.n_batch, n_seq)
        self.contexts.append(ctx)
        return ctx

    def curve(self, ctx: Context) -> CostCurve:
        return load_or_measure_draft(ctx, self._target_curve(), self.target, self._costs_file, self._progress)


class Assembly:
    """The target, its context and everything the chosen sources loaded; the scheduler a
    LlamaSpec decodes one text (or n samples) through, and batchers of several texts. See the
    module's text for the order."""

    def __init__(self, target: ModelConfig, draft: Optional[ModelConfig] = None,
                 settings: Optional[Mapping[str, Any]] = None, cache_dir: Optional[Path] = None,
                 progress: bool = True, references: Sequence[str] = (), spec: SpecConfig = SpecConfig(),
                 pool: Optional[ModelPool] = None, registry: Optional[Registry] = None) -> None:
        from .sources import default_registry
        self.registry = registry if registry is not None else default_registry()
        self.target_config = target
        # with what the cache keeps for the target's file (its trained heads)
        configs = self.registry.configs(settings or {}, models.file_name(target.path), models.cache_dir(cache_dir))
        loadable = frozenset(p.name for p in self.registry.plugins if p.loads_from(configs[p.name], draft))
        self.names = names = self.registry.resolve(spec, loadable)
        self.fixed = spec.fixed
        readers = [n for n in self.registry.names if self.registry[n].reads_references]
        if references and not names & set(readers):
            raise ConfigError(f"references are read by the {' and '.join(readers)} sources; --spec runs none of them")
        self.spec_name = self.registry.label(names, spec)
        rooms = self.registry.rooms(names, configs, Target(target.n_ctx, target.n_batch, MAX_LEAVES), spec.fixed)
        room = Room.together(rooms.values(), MAX_LEAVES)
        self.leaves = room.branches
        self.scratch = room.branches + room.own  # the sequences a step's branches and the sources' own may use
        plugins = [p for p in self.registry.plugins if p.name in names]
        self.hidden = room.hidden  # the target's decodes output hidden states
        if self.hidden and target.rpc:
            readers = [name for name, r in rooms.items() if r.hidden]
            raise ConfigError(f"the {' and '.join(readers)} source reads the target's hidden states, which a "
                              f"model on RPC servers does not return")
        checked = {p.name: p.hooks.check(configs[p.name]) for p in plugins}  # before any model
        _warn_about(target)
        self._pool = pool if pool is not None else ModelPool()
        self.model = self._pool.get(resolve_model(target.path, cache_dir, progress), target.offloaded, target.rpc,
                                    target.tensor_split, target.rpc_timeout)
        self.ctx: Optional[Context] = None
        self.loaded: Dict[str, Any] = {}
        self._resources: Optional[Resources] = None
        try:
            if target.n_ctx > self.model.n_ctx_train > 0:
                warnings.warn(f"the context ({target.n_ctx} tokens) exceeds the {self.model.n_ctx_train} "
                              f"{self.model.path.name} was trained on: expect worse text past that", LlamaspecWarning,
                              stacklevel=4)
            self.ctx = self.model.context(target.n_ctx, target.threads, target.n_batch,
                                          1 + self.scratch + MAX_SAMPLES)
            self.ctx.hidden_states = self.hidden
            costs_file = models.cache_dir(cache_dir) / "costs.json"
            ctx = self.ctx

            @functools.cache
            def target_curve() -> CostCurve:  # measured once, when first needed: after a draft's checks
                return load_or_measure(ctx, costs_file, progress) if names else CostCurve.flat()
            self._resources = Resources(self._pool, self.model, draft, target_curve, costs_file, cache_dir, progress)
            for p in plugins:
                if p.loads_from(configs[p.name], draft):
                    self.loaded[p.name] = p.hooks.load(configs[p.name], self._resources, checked.get(p.name))
            curve = target_curve()
            curves = {n: loaded.curve for n, loaded in self.loaded.items() if getattr(loaded, "curve", None)}
            self.costs = CostModel(curve, curves or None)
            self.setups = {n: Setup(configs[n], self.loaded.get(n), self.model.piece, self._tokenize) for n in names}
            self.references = tuple(tuple(self._tokenize(text)) for text in references)
            self.grammars = GrammarVocabulary(self.model)  # its tokenizer built when a first request has a grammar
        except BaseException:  # nothing half-loaded stays behind
            self.close()
            raise

    @property
    def draft_models(self) -> List[Model]:
        """The models the sources loaded (a draft model)."""
        return list(self._resources.models) if self._resources is not None else []

    def _tokenize(self, text: str) -> List[int]:
        """A text's tokens as the sources read them: no special tokens added or parsed."""
        return self.model.tokenize(text, add_special=False, parse_special=False)

    def acceptance_model(self) -> AcceptanceModel:
        return AcceptanceModel(self.registry.priors(), self.registry.overall())

    def planner(self, costs: CostModel) -> Planner:
        return Planner(costs, self.fixed, self.registry.shadowed())

    def sources_for(self, setups: Mapping[str, Setup]) -> Callable[[TextContext], List[Source]]:
        """The sources of one generation: those chosen, each built from its Setup, reading the
        references."""
        def sources(text: TextContext) -> List[Source]:
            return self.registry.build(self.names, setups, replace(text, references=self.references))
        return sources

    def chosen(self, asked: FrozenSet[str]) -> FrozenSet[str]:
        """The sources a request that asks for ``asked`` runs: those (and the sources that join
        them, as ``--spec`` joins them) of the ones loaded here; ConfigError for another."""
        unknown = sorted(asked - self.names)
        if unknown:
            running = ", ".join(n for n in self.registry.names if n in self.names) or "none"
            raise ConfigError(f"{unknown[0]!r} is not a draft source this model runs; choose auto, none or of "
                              f"{running}", "spec")
        return frozenset(asked | {p.name for p in self.registry.plugins if p.joins in asked and p.name in self.names})

    def label(self, asked: FrozenSet[str]) -> str:
        """What the statistics call a text that asks for the sources ``asked`` (see ``chosen``)."""
        return self.registry.label(self.chosen(asked), SpecConfig(asked))

    def scheduler(self) -> Scheduler:
        """Empty caches and an engine of MAX_SAMPLES lanes on them, one request at a time: fresh
        sources, acceptance model and planner (the cost model lives on)."""
        assert self.ctx is not None
        self.ctx.clear()
        for loaded in self.loaded.values():
            if hasattr(loaded, "restart"):
                loaded.restart()
        engine = Engine(self.ctx, MAX_SAMPLES, self.leaves, overlap=queues_decodes(self.model))
        return Scheduler(engine, self.model, self.sources_for(self.setups), self.planner(self.costs), self.ctx.n_ctx,
                         self.ctx.n_ctx, self.acceptance_model(), exclusive=True, grammars=self.grammars,
                         choose=self.chosen)

    def batcher(self, parallel: int, tokens_of: Callable[[Any], List[int]]) -> Batcher:
        """Requests from any thread decoded together, up to ``parallel`` sequences at once, each
        with this context's size, on a context of their own and each source's own copy of what
        it loaded (a draft model's context); closed by the batcher."""
        if not 1 <= parallel <= MAX_SAMPLES:
            raise ConfigError(f"parallel sequences must be between 1 and {MAX_SAMPLES}, got {parallel}")
        if parallel + self.scratch > max_sequences():
            raise ConfigError(f"{parallel} parallel sequences and {self.scratch} for drafts exceed the "
                              f"{max_sequences()} KV-cache sequences llama.cpp allows; lower the parallel "
                              f"sequences or lookahead's W and G")
        assert self.ctx is not None
        cfg, n_ctx = self.target_config, self.ctx.n_ctx
        # every lane's share, and room for one batch of branch rows on top of them
        # as many texts as lanes saved for later prompts that start alike, where sequences are left
        saved = max(0, min(parallel, max_sequences() - parallel - self.scratch))
        ctx = self.model.context(n_ctx * parallel + cfg.n_batch, cfg.threads, cfg.n_batch,
                                 parallel + self.scratch + saved)
        ctx.hidden_states = self.hidden
        closing: List[Any] = [ctx]
        try:
            copies = {}
            for name, loaded in self.loaded.items():
                if hasattr(loaded, "for_lanes"):
                    copies[name] = loaded.for_lanes(parallel)
                    closing.append(copies[name])
        except BaseException:
            for c in closing:
                c.close()
            raise
        setups = {n: replace(s, loaded=copies.get(n, s.loaded)) for n, s in self.setups.items()}
        planner = self.planner(self.costs.fresh())  # learns this batch's timings, not ours
        scheduler = Scheduler(Engine(ctx, parallel, overlap=queues_decodes(self.model), n_saved=saved), self.model,
                              self.sources_for(setups), planner, n_ctx * parallel, n_ctx, self.acceptance_model(),
                              grammars=self.grammars, choose=self.chosen)
        return Batcher(scheduler, closing, tokens_of, self.spec_name)

    def close(self) -> None:
        """Free what was loaded: the sources' (contexts, models), the target's context and model."""
        if hasattr(self, "grammars"):
            self.grammars.close()
        for loaded in self.loaded.values():
            if hasattr(loaded, "close"):
                loaded.close()
        self.loaded = {}
        if self.ctx is not None:
            self.ctx.close()
            self.ctx = None
        resources, self._resources = self._resources, None
        for ctx in resources.contexts if resources is not None else []:  # (closing twice does nothing)
            ctx.close()
        for model in (resources.models if resources is not None else []) + [self.model]:
            self._pool.release(model)


def _warn_about(cfg: ModelConfig) -> None:
    cores = os.cpu_count() or 1
    if cfg.threads > cores:
        warnings.warn(f"{cfg.threads} threads on {cores} cores: llama.cpp runs slower with more threads than "
                      f"cores", LlamaspecWarning, stacklevel=5)
    if cfg.n_gpu_layers != 0 and not cfg.rpc and not gpus():
        why = ("found no GPU: the GPU layers run on the CPU" if supports_gpu_offload() else
               "was built without GPU support: the GPU layers are ignored (rebuild it with CMAKE_ARGS, see the README)")
        warnings.warn(f"this llama-cpp-python {why}", LlamaspecWarning, stacklevel=5)
