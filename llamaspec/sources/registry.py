"""Every draft source, as a plugin: what it is called, what it needs, how it is built, its
evidence keys with their priors and what it shadows (whether it is expensive, its Source class
says: that is what the speculator reads).

A plugin is declared in its source's own module (``PLUGIN``) and listed once, in the
package's ``default_registry``; ``auto`` is every plugin whose needs are met. Adding a source is one module, one
line here and its tests (or, for a source of one's own, ``default_registry().with_(plugin)``
passed to ``LlamaSpec``). Sources are built for one generation (one text, or one lane of
several) from two things::

    Loaded          what a LlamaSpec loaded once: configurations, n-gram cache files, a draft
                    model's sequences, the vocabulary's bytes
    TextContext     what one generation carries: its lane, its references, its sibling samples
                    and its grammar

A need is met by one of the two. One that ``Loaded`` meets (a draft model, cache files) is
checked when a LlamaSpec loads: a source named in ``--spec`` whose need is not met is an error.
One that ``TextContext`` meets (several samples) is checked per generation: the source simply
does not run where it is not met.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Tuple

from ..config import DraftConfig, LookaheadConfig, LookupConfig, SpecConfig
from ..errors import ConfigError
from .base import Evidence, Source

if TYPE_CHECKING:
    from ..constraints import Constraint
    from .consensus import Siblings
    from .draft_model import DraftSequences
    from .ngram_cache import NgramCaches


class Need(Enum):
    """What a source may need to run, as a user is told it is missing."""

    DRAFT_MODEL = "a draft model (-md)"
    CACHE_FILES = "an n-gram cache file (--lookup-cache-static or --lookup-cache-dynamic)"
    SIBLINGS = "several samples of one prompt decoded together"
    GRAMMAR = "a grammar or JSON schema the text must follow"


@dataclass(frozen=True)
class Loaded:
    """What a LlamaSpec loaded once, for every generation's sources. ``piece``: a token's bytes."""

    piece: Optional[Callable[[int], bytes]] = None
    lookup: LookupConfig = LookupConfig()
    lookahead: LookaheadConfig = LookaheadConfig()
    draft: DraftConfig = DraftConfig()
    caches: Optional["NgramCaches"] = None
    drafts: Optional["DraftSequences"] = None

    def meets(self) -> FrozenSet[Need]:
        return frozenset({Need.DRAFT_MODEL} if self.drafts is not None else set()) | \
            frozenset({Need.CACHE_FILES} if self.caches is not None else set())


@dataclass(frozen=True)
class TextContext:
    """What one generation carries to its sources: the lane it is decoded on (its KV-cache
    sequences), texts to copy from (tokens), the board of its sibling samples with its own
    index on it, and where its text is in its grammar (the engine advances it; sources read it)."""

    lane: int = 0
    references: Tuple[Tuple[int, ...], ...] = ()
    siblings: Optional["Siblings"] = None
    sample: int = 0
    constraint: Optional["Constraint"] = None

    def meets(self) -> FrozenSet[Need]:
        return frozenset(({Need.SIBLINGS} if self.siblings is not None else set())
                         | ({Need.GRAMMAR} if self.constraint is not None else set()))


# Needs a generation's context meets; the others are met, or not, once and for all at loading.
PER_TEXT = frozenset({Need.SIBLINGS, Need.GRAMMAR})


@dataclass(frozen=True)
class Room:
    """KV-cache sequences a step may use beside the text's own: ``branches`` for the trie's
    leaves, ``own`` for what a source decodes beside them (lookahead's window columns)."""

    branches: int
    own: int = 0


@dataclass(frozen=True)
class Plugin:
    """One draft source, declared in full.

    ``priors``: the prior acceptance of a token with each evidence key the source can give
    (every one: a key without a prior is a bug, see the acceptance model); ``overall``: its
    acceptance before it proposed anything (what an expensive source is asked on).
    ``shadowed_by``: a source that finds this one's candidates too, with more specific evidence:
    where both propose a token, only the other's estimate counts. ``joins``: it runs wherever
    that source is named in ``--spec`` and its own needs are met. ``reads_references``: it
    copies from a generation's references. ``describe``: one line for benchmarks and help.
    ``room``: the KV-cache sequences it needs, given what is loaded, the context and batch sizes,
    the planner's leaves and whether it is verified whole, checked before anything loads
    (ConfigError where llama.cpp cannot have them).
    """

    name: str
    build: Callable[[Loaded, TextContext], Source]
    priors: Mapping[Evidence, float]
    overall: float
    needs: FrozenSet[Need] = frozenset()
    shadowed_by: Optional[str] = None
    joins: Optional[str] = None
    reads_references: bool = False
    describe: str = ""
    room: Optional[Callable[[Loaded, int, int, int, bool], Room]] = None


@dataclass(frozen=True)
class Registry:
    """The plugins a LlamaSpec may run, in the order their candidates are gathered."""

    plugins: Tuple[Plugin, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        names = [p.name for p in self.plugins]
        if len(set(names)) != len(names):
            raise ConfigError(f"two draft sources share a name: {', '.join(names)}")

    def with_(self, *plugins: Plugin) -> "Registry":
        """This registry and ``plugins`` after its own."""
        return Registry(self.plugins + tuple(plugins))

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(p.name for p in self.plugins)

    def __getitem__(self, name: str) -> Plugin:
        for p in self.plugins:
            if p.name == name:
                return p
        raise KeyError(name)

    def resolve(self, spec: SpecConfig, loaded: FrozenSet[Need]) -> FrozenSet[str]:
        """The sources ``spec`` runs, given the needs what was loaded meets. ConfigError for a
        name no plugin has, a named source whose loading-time need is not met, and a source to
        be verified whole that does not run."""
        unknown = sorted((set(spec.sources or ()) | set(spec.fixed)) - set(self.names))
        if unknown:
            raise ConfigError(f"unknown draft source {unknown[0]!r}; choose from auto, none or {', '.join(self.names)}")
        def loadable(p: Plugin) -> bool:
            return (p.needs - PER_TEXT) <= loaded
        if spec.sources is None:
            names = {p.name for p in self.plugins if loadable(p)}
        else:
            for name in spec.sources:
                p = self[name]
                missing = sorted(n.value for n in p.needs - PER_TEXT - loaded)
                if missing:
                    raise ConfigError(f"the {name} source needs {missing[0]}")
            names = set(spec.sources) | {p.name for p in self.plugins
                                         if p.joins in spec.sources and loadable(p)}
        idle = sorted(spec.fixed - names)
        if idle:
            raise ConfigError(f"{idle[0]} is to be verified whole but does not run")
        return frozenset(names)

    def label(self, names: Iterable[str], spec: SpecConfig) -> str:
        """What a generation with these sources is called in statistics: auto, plain or the names."""
        names = set(names)
        if not names:
            return "plain"
        if spec.sources is None:
            return "auto"
        return ",".join(n for n in self.names if n in spec.sources)

    def build(self, names: FrozenSet[str], loaded: Loaded, text: TextContext = TextContext()) -> List[Source]:
        """Fresh sources for one generation: those of ``names`` whose needs are met."""
        met = loaded.meets() | text.meets()
        return [p.build(loaded, text) for p in self.plugins if p.name in names and p.needs <= met]

    def room(self, names: FrozenSet[str], settings: Loaded, n_ctx: int, n_batch: int, leaves: int,
             fixed: FrozenSet[str]) -> Room:
        """The sequences the sources of ``names`` need beside the text (at least ``leaves`` branches)."""
        room = Room(leaves)
        for p in self.plugins:
            if p.name in names and p.room is not None:
                need = p.room(settings, n_ctx, n_batch, leaves, p.name in fixed)
                room = Room(max(room.branches, need.branches), room.own + need.own)
        return room

    def priors(self) -> Dict[str, Mapping[Evidence, float]]:
        return {p.name: p.priors for p in self.plugins}

    def overall(self) -> Dict[str, float]:
        return {p.name: p.overall for p in self.plugins}

    def shadowed(self) -> Dict[str, str]:
        """source -> the source that shadows it."""
        return {p.name: p.shadowed_by for p in self.plugins if p.shadowed_by}

