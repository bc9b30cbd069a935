"""The grammar as a draft source: where a request's grammar (a JSON schema, a GBNF grammar)
allows one continuation only, that continuation is known before the model is asked.

    schema {"name": string, "age": integer}, text so far   {"name": "Ada",
    the grammar forces                                      ` "age": ` (after optional whitespace:
                                                            its tokens once the model chose it)

Two kinds of tokens: ``Forced(i)``, the tokens the grammar's matcher finds forced (token i of
them; i capped at MAX_INDEX), and ``Spelled()``, the rest of the forced text in the model's own
tokenization, which the model may split otherwise. The grammar itself is the request's (the
engine follows it for every verified row); this source only reads its state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .base import FORCED_PRIOR, Budget, Candidate, Proposal, Source
from ..config import SamplingConfig
from ..constraints import Constraint
from .registry import Need, Plugin

NAME = "grammar"
MAX_INDEX = 3


@dataclass(frozen=True)
class Forced:
    """Token ``index`` of the tokens the grammar forces."""

    index: int


@dataclass(frozen=True)
class Spelled:
    """A token of the forced text past the forced tokens, as the model's tokenizer spells it."""


class GrammarSource(Source):
    """What the text's grammar forces next (see the module docstring)."""

    name = NAME

    def __init__(self, constraint: Constraint) -> None:
        self.constraint = constraint

    def propose(self, tokens: Sequence[int], budget: Budget, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        forced = self.constraint.forced()
        spelled = self.constraint.spelled(forced)
        keys = [Forced(min(i, MAX_INDEX)) for i in range(len(forced))] + [Spelled()] * len(spelled)
        n = min(budget.max_len, len(keys))
        if n == 0:
            return Proposal()
        return Proposal((Candidate(tuple(forced + spelled)[:n], NAME, tuple(keys[:n])),))


PLUGIN = Plugin(
    name=NAME, describe="what a request's grammar forces next",
    build=lambda setup, text: GrammarSource(text.constraint),
    priors={**{Forced(i): FORCED_PRIOR for i in range(MAX_INDEX + 1)}, Spelled(): 0.5},
    overall=0.8, needs=frozenset({Need.GRAMMAR}))
