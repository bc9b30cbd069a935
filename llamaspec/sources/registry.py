"""Every draft source as a plugin: one module declares, in its ``PLUGIN``, all there is to know
of its source. The registry holds the plugins a LlamaSpec may run and knows nothing of any of
them but what they declare.

What a source is (``Plugin``'s fields):

    name, describe          what it is called (in --spec, the statistics) and one line about it
    priors, overall         the prior acceptance of each evidence key it gives, and overall
    config, options         its settings: a frozen dataclass of defaults, and each field the
                            command line (``flag``) and Python (``keyword``) set
    needs                   what a generation must carry for it to run (several samples, a grammar)
    shadowed_by, joins,     how it stands to the others and the command line (see Plugin)
    reads_references, flags

What it does at each moment (the hooks: ``build``, and ``Hooks``' methods, each with a default
that means "nothing of this", overridden by a plugin that needs one):

    build(setup, text)      a fresh source for one generation (the one every plugin writes)
    Hooks.complete          its config completed with what the cache keeps for the target
    Hooks.check             before any model loads: its settings checked (files read)
    Hooks.available         before any model loads: whether there is something to load
    Hooks.load              once the target is loaded: what every generation uses
    Hooks.room              what the target's context must give it: KV-cache sequences beside
                            the text's own, hidden states

Plugins are found in this package (``default_registry``), in other installed packages through
the ``llamaspec.sources`` entry-point group (``installed_plugins``: loaded once, when first
needed, each failing alone; ``LLAMASPEC_DISABLE_PLUGINS`` turns them off), and in modules a user
names (``--source``, ``load(sources=...)``): ``installed_registry``. What a plugin declares is
checked when a registry takes it (``checked``); ``listing`` is what ``llamaspec sources`` shows. A source is built for one
generation (one text, or one lane of several) from what a LlamaSpec holds for it (``Setup``)
and what the generation carries (``TextContext``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import (TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Protocol,
                    Sequence, Tuple)

from ..config import ModelConfig, SpecConfig
from ..errors import ConfigError, LlamaspecWarning
from .base import Evidence, Source

if TYPE_CHECKING:
    from ..constraints import Constraint
    from ..llama.binding import Context, Model


class Need(Enum):
    """What a generation must carry for a source to run, as a user is told it is missing."""

    SIBLINGS = "several samples of one prompt decoded together"
    GRAMMAR = "a grammar or JSON schema the text must follow"


@dataclass
class Group:
    """The samples of one prompt decoded together: how many, how long the prompt they share is,
    and a board on which a source keeps what every sample's copy of it shares (by its name)."""

    n: int
    prompt_len: int
    board: Dict[str, Any] = field(default_factory=dict)

    def shared(self, name: str, make: Callable[[], Any]) -> Any:
        """What source ``name`` keeps for the group (made by ``make`` on first use)."""
        if name not in self.board:
            self.board[name] = make()
        return self.board[name]


@dataclass(frozen=True)
class TextContext:
    """What one generation carries to its sources: the lane it is decoded on (its KV-cache
    sequences), texts to copy from (tokens), its group of sibling samples with its own index in
    it, and where its text is in its grammar (the engine advances it; sources read it)."""

    lane: int = 0
    references: Tuple[Tuple[int, ...], ...] = ()
    group: Optional[Group] = None
    sample: int = 0
    constraint: Optional["Constraint"] = None

    def meets(self) -> FrozenSet[Need]:
        return frozenset(({Need.SIBLINGS} if self.group is not None else set())
                         | ({Need.GRAMMAR} if self.constraint is not None else set()))


@dataclass(frozen=True)
class Setup:
    """What a LlamaSpec holds for one source, from which it is built for each generation: its
    ``config``, what its plugin ``loaded`` (None: nothing), the vocabulary's bytes (``piece``)
    and its tokenizer (``tokenize``: text to tokens, no special tokens added or parsed)."""

    config: Any = None
    loaded: Any = None
    piece: Optional[Callable[[int], bytes]] = None
    tokenize: Optional[Callable[[str], List[int]]] = None


class Resources(Protocol):
    """What a plugin's ``load`` loads with (the LlamaSpec's assembly gives it). Whatever it
    loads through these is freed with the LlamaSpec."""

    target: "Model"  # the target model (its vocabulary: n_vocab, piece, tokenize)
    draft: Optional[ModelConfig]  # the draft model the user gave (-md), if any
    lanes: int  # the texts a LlamaSpec decodes together at most (a sequence each)

    def model(self, config: ModelConfig) -> "Model":
        """``config``'s model, loaded (its weights shared with any other owner of the same file)."""

    def context(self, model: "Model", config: ModelConfig, n_seq: int) -> "Context":
        """A context on ``model`` with ``config``'s size and threads, of ``n_seq`` sequences."""

    def curve(self, ctx: "Context") -> Any:
        """What a decode on ``ctx`` costs, in the target's single-token decodes (a
        planning.costs.CostCurve, measured once)."""


@dataclass(frozen=True)
class Target:
    """The target's context as a source's ``room`` hook sees it: its size in tokens, the most
    rows one decode takes, the most branches a step's trie may have, and whether this source
    is verified whole every step (``--spec-fixed``)."""

    n_ctx: int
    n_batch: int
    leaves: int
    whole: bool = False


@dataclass(frozen=True)
class Room:
    """What the target's context gives a step beside the text's own KV-cache sequence:
    ``branches`` sequences for the trie's leaves, ``own`` for what a source decodes beside
    them (lookahead's window columns), and ``hidden``: the target's decodes output their hidden
    states (``Outcome.hidden``: draft heads read them)."""

    branches: int
    own: int = 0
    hidden: bool = False

    def __add__(self, other: "Room") -> "Room":
        """What two sources need together: the most branches, both one's own sequences."""
        return Room(max(self.branches, other.branches), self.own + other.own, self.hidden or other.hidden)

    @staticmethod
    def together(rooms: Iterable["Room"], leaves: int) -> "Room":
        """What sources need together, with at least ``leaves`` branches."""
        return sum(rooms, Room(leaves))


class Hooks:
    """What a source does at each moment of a LlamaSpec's life, beside being built for each
    text (``Plugin.build``). Every hook has a default that means "nothing of this": a plugin
    that needs one subclasses Hooks, overrides it and gives an instance as ``Plugin.hooks``.
    The order: ``complete``, ``check`` and ``available`` before any model loads, ``room`` when
    the target's context is made, ``load`` once the target is loaded."""

    loads: str = ""
    """What ``load`` needs, as a user is told it is missing ("a phrase file (--phrases)") and
    ``llamaspec sources`` shows it; "" (the default): the source loads nothing, ``load`` is
    never called and it runs wherever its ``needs`` are met."""

    def complete(self, config: Any, model_file: str, cache: Path) -> Any:
        """Its config (None where it has none) completed with what llamaspec's ``cache`` folder
        keeps for the target's model file (its name): draft heads trained for it. Default: as
        given."""
        return config

    def check(self, config: Any) -> Any:
        """Before any model loads: ConfigError for settings that cannot work (a missing file).
        What it returns (a file it read) is ``load``'s ``checked``. Default: nothing to check."""
        return None

    def available(self, config: Any, draft: Optional[ModelConfig]) -> bool:
        """Before any model loads: whether what ``load`` loads is there with these settings and
        the draft model the user gave (-md; None: none). A source that loads something and has
        nothing to load does not run under ``--spec auto`` and is an error where ``--spec``
        names it. Default: yes."""
        return True

    def load(self, config: Any, resources: Resources, checked: Any) -> Any:
        """Once the target is loaded: what the source loads once for every generation
        (``Setup.loaded``), through ``resources`` (freed with the LlamaSpec). The object may
        have ``restart()`` (the LlamaSpec was reset), ``for_lanes(n)`` (its copy for a batch of
        n texts decoded together, with its own ``close()``), ``close()``, and ``curve`` (an
        expensive source's cost curve). Called only where ``loads`` says what it loads."""
        return None

    def room(self, config: Any, target: Target) -> Room:
        """What the target's context must give it: KV-cache sequences beside the text's own,
        hidden states (ConfigError where llama.cpp cannot have them). Default: a branch for
        each of the trie's leaves, nothing of its own."""
        return Room(target.leaves)


NO_HOOKS = Hooks()


@dataclass(frozen=True)
class Option:
    """One setting of a source: ``field`` of its config, set by ``keyword`` in Python
    (``llamaspec.load``, the bench's settings) and by ``flag`` on the command line (None: not
    there); its default is the config's. Sources may share an option (the same keyword)."""

    keyword: str
    field: str
    help: str
    flag: Optional[str] = None
    path: bool = False  # a file's path (None by default)


FLAGS = ("alone", "fixed")  # the command-line flags named after a source it may have


@dataclass(frozen=True, kw_only=True)
class Plugin:
    """One draft source, declared in full: what it is (these fields) and what it does at each
    moment (``build``, and ``hooks``). A simple source gives ``name``, ``build``, ``priors``
    and ``overall``; every other field has a default that means "nothing of this".

    ``priors``: the prior acceptance of a token with each evidence key the source can give
    (every one: a key without a prior turns the source off); ``overall``: its acceptance before
    it proposed anything (what an expensive source is asked on). ``config``: its settings'
    defaults (a frozen dataclass; None: it has none); ``options``: those a user sets.
    ``needs``: what a generation must carry for it to be built. ``build(setup, text)``: a fresh
    Source for one generation. ``hooks``: its other moments (``Hooks``).
    ``shadowed_by``: a source that finds this one's candidates too, with more specific evidence:
    where both propose a token, only the other's estimate counts. ``joins``: it runs wherever
    that source is named in ``--spec`` and its own needs are met. ``reads_references``: it
    copies from a generation's references. ``flags``: of ``FLAGS``, the command-line flags
    named after it: "alone", ``--NAME`` (``NAME=True`` in Python) runs it alone (with the draft
    model when one is given); "fixed", ``--NAME-fixed`` verifies it whole.
    """

    name: str
    build: Callable[[Setup, TextContext], Source]
    priors: Mapping[Evidence, float]
    overall: float
    describe: str = ""
    config: Any = None
    options: Tuple[Option, ...] = ()
    needs: FrozenSet[Need] = frozenset()
    hooks: Hooks = NO_HOOKS
    shadowed_by: Optional[str] = None
    joins: Optional[str] = None
    reads_references: bool = False
    flags: FrozenSet[str] = frozenset()
    origin: str = ""  # where it was found, set by the registry: "" for llamaspec's own (see ``origin_of``)

    @property
    def loads(self) -> str:
        """What it needs loaded, as a user is told (``Hooks.loads``); "": nothing."""
        return self.hooks.loads

    def configured(self, values: Mapping[str, Any]) -> Any:
        """Its config with the options ``values`` (by keyword) sets; a config object given
        under its name starts it. ConfigError for a value its config refuses."""
        base = values.get(self.name)
        if any(o.keyword == self.name for o in self.options) and not isinstance(base, type(self.config)):
            base = None  # NAME= is an option of its own (heads=FILE), not the whole config
        config = base if base is not None and base is not True and base is not False else self.config
        if config is None:
            return None
        if not isinstance(config, type(self.config)):
            raise ConfigError(f"{self.name}= takes a {type(self.config).__name__} or True, got "
                              f"{type(config).__name__}")
        changes = {o.field: str(values[o.keyword]) if o.path and values[o.keyword] is not None else values[o.keyword]
                   for o in self.options if o.keyword in values}
        try:
            return dataclasses.replace(config, **changes) if changes else config
        except TypeError as e:
            raise ConfigError(f"the {self.name} source's settings: {e}") from None

    def loads_from(self, config: Any, draft: Optional[ModelConfig]) -> bool:
        """Whether this source has something to load (before anything is loaded)."""
        return bool(self.loads) and self.hooks.available(config, draft)


@dataclass(frozen=True)
class Registry:
    """The plugins a LlamaSpec may run, in the order their candidates are gathered."""

    plugins: Tuple[Plugin, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for i, p in enumerate(self.plugins):
            checked(p)
            for q in self.plugins[:i]:
                if q.name == p.name:
                    raise ConfigError(f"two draft sources are named {p.name!r}: {origin_of(q)} and {origin_of(p)}")
        self.options()  # shared options agree

    def extended(self, *plugins: Plugin) -> "Registry":
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

    def options(self) -> Dict[str, Tuple[Option, Any]]:
        """Every option by keyword, with its default (an option two sources share once)."""
        out: Dict[str, Tuple[Option, Any]] = {}
        for p in self.plugins:
            for o in p.options:
                default = getattr(p.config, o.field)
                if o.keyword in out and (out[o.keyword][1] != default or out[o.keyword][0].flag != o.flag):
                    raise ConfigError(f"the sources share the option {o.keyword} with different defaults or flags")
                out.setdefault(o.keyword, (o, default))
        return out

    def configs(self, values: Mapping[str, Any], model_file: Optional[str] = None,
                cache: Optional[Path] = None) -> Dict[str, Any]:
        """Every source's config, with the options ``values`` sets (by keyword; a config object
        by a source's name), completed by each plugin's ``Hooks.complete`` with what ``cache`` keeps for
        the target's ``model_file`` where both are given. ConfigError for a keyword no source has."""
        known = set(self.options()) | set(self.names)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"no draft source has the setting {unknown[0]!r}; the settings are: "
                              f"{', '.join(sorted(self.options()))}")
        configs = {p.name: p.configured(values) for p in self.plugins}
        if model_file is not None and cache is not None:
            configs = {p.name: p.hooks.complete(configs[p.name], model_file, cache) for p in self.plugins}
        return configs

    def resolve(self, spec: SpecConfig, loadable: FrozenSet[str]) -> FrozenSet[str]:
        """The sources ``spec`` runs, given the names of those that have something to load
        (``Plugin.loads_from``). ConfigError for a name no plugin has, a named source with
        nothing to load, and a source to be verified whole that does not run."""
        unknown = sorted((set(spec.sources or ()) | set(spec.fixed)) - set(self.names))
        if unknown:
            raise ConfigError(f"unknown draft source {unknown[0]!r}; choose from auto, none or {', '.join(self.names)}")

        def runs(p: Plugin) -> bool:
            return not p.loads or p.name in loadable
        if spec.sources is None:
            names = {p.name for p in self.plugins if runs(p)}
        else:
            for name in spec.sources:
                p = self[name]
                if not runs(p):
                    raise ConfigError(f"the {name} source needs {p.loads or 'something to load'}")
            names = set(spec.sources) | {p.name for p in self.plugins if p.joins in spec.sources and runs(p)}
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

    def build(self, names: FrozenSet[str], setups: Mapping[str, Setup], text: TextContext = TextContext()) -> List[Source]:
        """Fresh sources for one generation: those of ``names`` whose needs the text meets."""
        met = text.meets()
        return [p.build(setups.get(p.name, Setup()), text) for p in self.plugins
                if p.name in names and p.needs <= met]

    def rooms(self, names: FrozenSet[str], configs: Mapping[str, Any], target: Target,
              fixed: FrozenSet[str]) -> Dict[str, Room]:
        """What each source of ``names`` needs of the target's context (``Room.together``: all
        of them), each told whether it is verified whole (``fixed``)."""
        return {p.name: p.hooks.room(configs[p.name], dataclasses.replace(target, whole=p.name in fixed))
                for p in self.plugins if p.name in names}

    def on_draft_model(self) -> List[str]:
        """The sources that run on a draft model (-md): those with something to load where one
        is given and nothing where none is."""
        given = ModelConfig("a draft model")
        return [p.name for p in self.plugins
                if p.loads_from(p.config, given) and not p.loads_from(p.config, None)]

    def setups(self, configs: Optional[Mapping[str, Any]] = None,
               piece: Optional[Callable[[int], bytes]] = None) -> Dict[str, Setup]:
        """Each source's Setup with nothing loaded (its config, the default where ``configs``
        has none): what a replay, with no model, builds sources from."""
        return {p.name: Setup((configs or {}).get(p.name, p.config), None, piece) for p in self.plugins}

    def priors(self) -> Dict[str, Mapping[Evidence, float]]:
        return {p.name: p.priors for p in self.plugins}

    def overall(self) -> Dict[str, float]:
        return {p.name: p.overall for p in self.plugins}

    def shadowed(self) -> Dict[str, str]:
        """source -> the source that shadows it."""
        return {p.name: p.shadowed_by for p in self.plugins if p.shadowed_by}


ENTRY_POINTS = "llamaspec.sources"
# "1": no installed package's source is loaded; "NAME,...": none of these (a source's or a package's name)
DISABLE = "LLAMASPEC_DISABLE_PLUGINS"
RESERVED = ("auto", "none")  # words of --spec


def origin_of(plugin: Plugin) -> str:
    """Where ``plugin`` was found, as a user is told: built-in, a package and its version, a file."""
    return plugin.origin or "built-in"


def checked(plugin: Plugin) -> Plugin:
    """``plugin``, if what it declares can work: ConfigError naming it and the first fault.
    Checked when it registers, not found mid-generation (a key without a prior, an option of no
    field of its config)."""
    name = plugin.name if isinstance(plugin, Plugin) else "?"

    def fault(problem: str) -> ConfigError:
        return ConfigError(f"the draft source {name!r} ({origin_of(plugin)}): {problem}")
    if not isinstance(name, str) or not name.isidentifier() or name in RESERVED:
        raise fault("its name must be a Python identifier, not auto or none")
    if not callable(plugin.build):
        raise fault("build is not callable")
    if not isinstance(plugin.hooks, Hooks):
        raise fault("hooks must be an instance of Hooks (or a subclass of it)")
    if not isinstance(plugin.hooks.loads, str):
        raise fault("hooks.loads must say, as a string, what the source loads")
    if type(plugin.hooks).load is not Hooks.load and not plugin.hooks.loads:
        raise fault("its hooks load something but do not say what (Hooks.loads), so load would never be called")
    if not isinstance(plugin.flags, frozenset) or not plugin.flags <= set(FLAGS):
        raise fault(f"flags must be a frozenset of {', '.join(FLAGS)}")
    if not isinstance(plugin.priors, Mapping) or not plugin.priors:
        raise fault("priors must map each evidence key it gives to its prior acceptance")
    for key, prior in list(plugin.priors.items()) + [("overall", plugin.overall)]:
        if isinstance(prior, bool) or not isinstance(prior, (int, float)) or not 0 < prior <= 1:
            raise fault(f"the prior of {key!r} is {prior!r}, not a probability in (0, 1]")
    if plugin.config is not None and not dataclasses.is_dataclass(plugin.config):
        raise fault("config must be a dataclass instance (its settings' defaults) or None")
    for o in plugin.options:
        if not isinstance(o, Option) or not str(o.keyword).isidentifier():
            raise fault(f"option {o!r} is not an Option with a Python identifier as keyword")
        if plugin.config is None or not hasattr(plugin.config, o.field):
            raise fault(f"option {o.keyword} sets {o.field!r}, which its config has no field of")
        if o.flag is not None and not (o.flag.startswith("--") and len(o.flag) > 2 and " " not in o.flag):
            raise fault(f"option {o.keyword}'s flag {o.flag!r} is not a --long-flag")
    if not isinstance(plugin.needs, frozenset) or not all(isinstance(n, Need) for n in plugin.needs):
        raise fault("needs must be a frozenset of Need")
    return plugin


def plugin_of(where: Any) -> Plugin:
    """The plugin a module declares (its ``PLUGIN``): a Plugin itself, a module, a module's
    import name (``package.module``) or a Python file's path. ConfigError for anything else."""
    if isinstance(where, Plugin):
        return where
    module = where if isinstance(where, ModuleType) else _module(str(where))
    plugin = getattr(module, "PLUGIN", None)
    if not isinstance(plugin, Plugin):
        raise ConfigError(f"{where} declares no draft source: a module of one has PLUGIN = Plugin(...)")
    return plugin if plugin.origin else dataclasses.replace(plugin, origin=str(where))


def _module(where: str) -> ModuleType:
    path = Path(where)
    if where.endswith(".py") or path.is_file():
        if not path.is_file():
            raise ConfigError(f"no such source file: {where}")
        name = f"llamaspec_source_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ConfigError(f"cannot load a source from {where}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look a module up by name
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as e:  # the user's file: say what broke, in one line
            del sys.modules[name]
            raise ConfigError(f"cannot load a source from {where}: {described(e)}") from None
        return module
    try:
        return importlib.import_module(where)
    except ImportError as e:
        raise ConfigError(f"no source module {where!r}: {e}") from None
    except (Exception, SystemExit) as e:
        raise ConfigError(f"cannot load the source module {where!r}: {described(e)}") from None


def described(e: BaseException) -> str:
    """An exception in one line: its type and message (a warning or error quotes it)."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def installed_plugins(taken: Iterable[str] = ()) -> Tuple[Plugin, ...]:
    """The sources installed packages declare (entry points ``llamaspec.sources``, each a Plugin
    or a module declaring one), but those ``LLAMASPEC_DISABLE_PLUGINS`` turns off and those
    named as one of ``taken`` (the built-in sources: they always win). Each is loaded once per
    process, when first asked for: importing llamaspec runs no other package's code. A package
    whose source fails to load (an ImportError, any exception, a sys.exit) or declares one that
    cannot work is one LlamaspecWarning naming it, its version and the error; two of one name
    are one naming both, the first by package name kept."""
    return _load_installed(os.environ.get(DISABLE, "").strip(), tuple(taken))


def forget_installed() -> None:
    """Load the installed packages' sources again when next asked (a test installs a package)."""
    _load_installed.cache_clear()


@functools.lru_cache(maxsize=None)  # once per process and setting: the cached plugins, not a global to set
def _load_installed(disabled: str, taken: Tuple[str, ...]) -> Tuple[Plugin, ...]:
    from importlib.metadata import entry_points
    off = {name.strip() for name in disabled.split(",")} - {""}
    if "1" in off:
        return ()

    def package(ep: Any) -> str:
        dist = getattr(ep, "dist", None)
        return f"{dist.name} {dist.version}" if dist is not None else f"the entry point {ep.value}"
    found: List[Plugin] = []
    for ep in sorted(entry_points(group=ENTRY_POINTS), key=lambda ep: (package(ep), ep.name)):
        dist = getattr(ep, "dist", None)
        if ep.name in off or (dist is not None and dist.name in off):
            continue
        origin = package(ep)
        try:
            plugin = plugin_of(ep.load())
            plugin = checked(dataclasses.replace(plugin, origin=origin))
        except (Exception, SystemExit) as e:  # another package's fault: not the user's command's
            warnings.warn(f"the draft source {ep.name!r} of {origin} is not loaded: {described(e)}", LlamaspecWarning,
                          stacklevel=2)
            continue
        if plugin.name in off:
            continue
        kept = [p for p in found if p.name == plugin.name]
        if plugin.name in taken or kept:
            winner = kept[0].origin if kept else "the built-in one"
            warnings.warn(f"two draft sources are named {plugin.name!r}: {winner} and {origin}; {winner}'s is kept",
                          LlamaspecWarning, stacklevel=2)
            continue
        found.append(plugin)
    return tuple(found)


def installed(base: Registry, extra: Sequence[Any] = ()) -> Registry:
    """``base`` (the built-in sources), then those of installed packages (``installed_plugins``),
    then ``extra`` (plugins, modules, module names or files the user names: one named like an
    installed package's is kept in its place, with a warning; one named like a built-in source
    is a ConfigError)."""
    named = [p if p.origin else dataclasses.replace(p, origin="given in Python") for p in map(plugin_of, extra)]
    found = []
    for p in installed_plugins(base.names):
        mine = [q for q in named if q.name == p.name]
        if mine:
            warnings.warn(f"two draft sources are named {p.name!r}: {p.origin} and {origin_of(mine[0])}; "
                          f"{origin_of(mine[0])}'s is kept", LlamaspecWarning, stacklevel=2)
        else:
            found.append(p)
    return base.extended(*found, *named)


@dataclass(frozen=True)
class Listed:
    """One source as ``llamaspec sources`` shows it: its name, where it was found, one line about
    it, its options (each flag, or Python keyword where it has no flag, its default and help),
    what it loads (where it runs only with it) and what a generation must carry for it."""

    name: str
    origin: str
    describe: str
    options: Tuple[Tuple[str, Any, str], ...]
    loads: str
    needs: Tuple[str, ...]


def listing(registry: Registry) -> List[Listed]:
    """Every source of ``registry``, in its order, as ``llamaspec sources`` lists it."""
    return [Listed(p.name, origin_of(p), p.describe,
                   tuple((o.flag or f"{o.keyword}=", getattr(p.config, o.field), o.help) for o in p.options),
                   p.loads, tuple(sorted(n.value for n in p.needs)))
            for p in registry.plugins]
