"""Draft sources: each proposes candidate tokens that may follow the text; none touches the target.

    base.py         the interface every source implements and what flows through a step
                    (Source, Candidate, Proposal, Budget, Outcome, Rider)
    registry.py     every source as a plugin: its name, needs, evidence priors; which run
    lookup.py       copies of the prompt, the text so far and references (prompt lookup)
    ngram_cache.py  llama.cpp's n-gram cache files (llama-lookup's)
    lookahead.py    lookahead decoding: an n-gram pool and a Jacobi window riding in the batch
    draft_model.py  a small model with the target's vocabulary
    consensus.py    what sibling samples of the same prompt wrote
    grammar.py      what a request's grammar (a JSON schema) forces next
"""

from . import consensus, draft_model, grammar, lookahead, lookup, ngram_cache
from .registry import Registry


def default_registry() -> Registry:
    """The built-in sources, in the order their candidates are gathered."""
    return Registry((lookup.PLUGIN, ngram_cache.PLUGIN, lookahead.PLUGIN, draft_model.PLUGIN, consensus.PLUGIN,
                     grammar.PLUGIN))


__all__ = ["Registry", "default_registry"]
