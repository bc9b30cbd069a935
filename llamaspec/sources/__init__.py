"""Draft sources: each proposes candidate tokens that may follow the text; none touches the target.

    base.py         the interface every source implements and what flows through a step
                    (Source, Candidate, Proposal, Budget, Outcome, Window)
    registry.py     a source as a plugin, declared in full in its own module; which run
    rounds.py       an expensive source's drafting, every lane's in one decode a round
    lookup.py       copies of the prompt, the text so far and references (prompt lookup)
    ngram_cache.py  llama.cpp's n-gram cache files (llama-lookup's)
    lookahead.py    lookahead decoding: an n-gram pool and a Jacobi window riding in the batch
    draft_model.py  a small model with the target's vocabulary
    heads.py        draft heads on the target's hidden state, trained on this machine (Medusa)
    consensus.py    what sibling samples of the same prompt wrote
    grammar.py      what a request's grammar (a JSON schema) forces next

Outside this package, code names no source: it reads the registry (and the configs below, the
built-in sources' settings, which the package exports for ``llamaspec.LookaheadConfig(...)``).
"""

from typing import Any, Sequence

from . import consensus, draft_model, grammar, heads, lookahead, lookup, ngram_cache
from .draft_model import DraftConfig
from .heads import HeadsConfig
from .lookahead import LookaheadConfig
from .lookup import LookupConfig
from .ngram_cache import CacheConfig
from .registry import Registry, installed


def default_registry() -> Registry:
    """The built-in sources, in the order their candidates are gathered."""
    return Registry((lookup.PLUGIN, ngram_cache.PLUGIN, lookahead.PLUGIN, heads.PLUGIN, draft_model.PLUGIN, consensus.PLUGIN,
                     grammar.PLUGIN))


def installed_registry(extra: Sequence[Any] = ()) -> Registry:
    """The built-in sources, those installed packages declare (entry points ``llamaspec.sources``)
    and ``extra`` (plugins, modules, module names or source files)."""
    return installed(default_registry(), extra)


__all__ = ["CacheConfig", "DraftConfig", "HeadsConfig", "LookaheadConfig", "LookupConfig", "Registry", "default_registry",
           "installed_registry"]
