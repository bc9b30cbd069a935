"""Consensus drafting: what sibling samples of the same prompt wrote after the same context.

Samples of one prompt share most of their text. For sample s, the last tokens of its text are
looked up in every sibling's generated text; what followed there is a candidate, free of any
model. Siblings that continue alike are evidence: the more of them agree on a continuation, the
likelier the target samples it too (the acceptance model learns how likely)::

    sample 0   ... "name": "Ada", "age": 36 }
    sample 1   ... "name": "Bob", "age": 41 }
    sample 2   ... "name": "Bob", ▮                  <- after `"Bob",` sample 1 wrote ` "age": 41 }`
                                                        sample 0, after `",`, wrote ` "age": 36 }`
    candidates for sample 2:  ` "age": 41 }` (agreement 3 tokens)   ` "age": 36 }` (agreement 1)
    the shared ` "age":` is one trie path, with 2 siblings behind it

``Siblings`` is the board the samples of one group share: each sample's source writes its own
text there when it learns, and reads the others' when it proposes.

Evidence: token i of a candidate is ``Agreed(min(agreeing, MAX_AGREEING), min(length_bucket(L + i), MAX_LENGTH))``,
``agreeing`` the siblings whose continuation holds the candidate's first i + 1 tokens and ``L``
how many tokens before the occurrence agree with the text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np

from .base import Budget, Candidate, Outcome, Proposal, Source, length_bucket
from ..config import SamplingConfig
from .lookup import SCAN, TokenIndex, agreement
from .registry import Need, Plugin, TextContext

NAME = "consensus"
NGRAM_MAX = 4
# Evidence counts agreeing siblings up to MAX_AGREEING and match lengths up to MAX_LENGTH.
MAX_AGREEING = 3
MAX_LENGTH = 8


@dataclass(frozen=True)
class Agreed:
    """A token that ``siblings`` sibling samples continue with after a match whose length
    bucket is ``length``."""

    siblings: int
    length: int


def evidence(agreeing: int, match: int) -> Agreed:
    """The evidence of a token that ``agreeing`` siblings continue with after a match of
    ``match`` tokens."""
    return Agreed(min(agreeing, MAX_AGREEING), min(length_bucket(match), MAX_LENGTH))


class Siblings:
    """The texts of the samples of one prompt (each indexed by n-grams), the first
    ``prompt_len`` tokens shared."""

    def __init__(self, n: int, prompt_len: int) -> None:
        self.prompt_len = prompt_len
        self.indexes = [TokenIndex(1, NGRAM_MAX) for _ in range(n)]

    def update(self, sample: int, tokens: Sequence[int]) -> None:
        self.indexes[sample].follow(tokens)

    def continuations(self, sample: int, tokens: Sequence[int], max_len: int) -> List[Tuple[Tuple[int, ...], int]]:
        """For every sibling that wrote the text's last tokens after the prompt: (what followed,
        how many tokens before it agree with the text), the most specific occurrence each."""
        found = []
        for j, index in enumerate(self.indexes):
            if j == sample:
                continue
            sib = index.tokens
            best = None
            for n in range(min(NGRAM_MAX, len(tokens)), 0, -1):
                ends = [e for e in index.ends(tuple(tokens[-n:]))[-SCAN:] if self.prompt_len <= e < len(sib)]
                for e in ends:
                    agree = agreement(tokens, len(tokens), sib, e)
                    if best is None or agree >= best[1]:  # ties: the most recent
                        best = (e, agree)
                if best is not None:
                    break
            if best is not None:
                e, agree = best
                found.append((tuple(sib[e:e + max_len]), agree))
        return found


def candidates(found: Sequence[Tuple[Tuple[int, ...], int]], max_candidates: int) -> List[Candidate]:
    """The distinct continuations ``found`` (what follows, agreement) as candidates, the most
    agreed on first; a continuation that is a prefix of another is left out (the trie holds it)."""
    conts = sorted(found, key=lambda f: (-len(f[0]), -f[1]))
    out: List[Tuple[Tuple[int, ...], int]] = []
    for cont, agree in conts:
        if cont and not any(kept[:len(cont)] == cont for kept, _ in out):
            out.append((cont, agree))
    result = []
    for cont, agree in out:
        match = max(a for c, a in found if c[:1] == cont[:1])
        keys = []
        for i in range(len(cont)):
            agreeing = sum(1 for c, _ in found if c[:i + 1] == cont[:i + 1])
            keys.append(evidence(agreeing, match + i))
        result.append((keys[0], agree, Candidate(cont, NAME, tuple(keys))))
    result.sort(key=lambda r: (-r[0].siblings, -r[0].length, -r[1]))
    return [c for _, _, c in result[:max_candidates]]


class ConsensusSource(Source):
    """Candidates for sample ``sample`` from its siblings' texts (see the module docstring)."""

    name = NAME

    def __init__(self, siblings: Siblings, sample: int) -> None:
        self.siblings, self.sample = siblings, sample

    def propose(self, tokens: Sequence[int], budget: Budget, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        self.siblings.update(self.sample, tokens)
        found = self.siblings.continuations(self.sample, tokens, budget.max_len)
        return Proposal(tuple(candidates(found, budget.max_candidates)))

    def learn(self, outcome: Outcome) -> None:
        self.siblings.update(self.sample, outcome.tokens)

    def finish(self, tokens: Sequence[int]) -> None:
        self.siblings.update(self.sample, tokens)


# Priors: a match's length as for lookup, raised by each further agreeing sibling.
_ONE_SIBLING = {0: 0.1, 1: 0.15, 2: 0.25, 3: 0.35, 4: 0.45, 5: 0.55, 8: 0.65}


def _build(text: TextContext) -> ConsensusSource:
    group = text.group
    assert group is not None  # Need.SIBLINGS
    return ConsensusSource(group.shared(NAME, lambda: Siblings(group.n, group.prompt_len)), text.sample)


PLUGIN = Plugin(
    name=NAME, describe="what sibling samples of the prompt wrote", build=lambda setup, text: _build(text),
    priors={Agreed(a, m): min(0.9, p + 0.1 * (a - 1)) for a in range(1, MAX_AGREEING + 1)
            for m, p in _ONE_SIBLING.items()},
    overall=0.3, needs=frozenset({Need.SIBLINGS}))
