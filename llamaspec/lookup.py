"""Prompt lookup: drafts copied from text the model has already seen.

The last n tokens (n from ``ngram_max`` down to ``ngram_min``) are looked up in the prompt,
in everything generated so far and in reference documents; the tokens that followed the
match are the draft. Nothing here touches a model.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Callable, DefaultDict, List, Optional, Sequence, Tuple

import numpy as np

from .acceptance import accept_greedy
from .config import SamplingConfig

MATCH_POLICIES = ("longest", "recent", "frequent")


class TokenIndex:
    """Every n-gram (n in [ngram_min, ngram_max]) of an append-only token list, mapped to the
    positions right after its occurrences, oldest first."""

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.tokens: List[int] = []
        self._ends: DefaultDict[Tuple[int, ...], List[int]] = defaultdict(list)

    def extend(self, new: Sequence[int]) -> None:
        t = self.tokens
        for token in new:
            t.append(token)
            end = len(t)
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                self._ends[tuple(t[end - n:end])].append(end)

    def ends(self, ngram: Tuple[int, ...]) -> List[int]:
        return self._ends.get(ngram, [])


def appended(old: Sequence[int], new: Sequence[int]) -> Optional[int]:
    """How many tokens ``new`` adds to ``old``, or None when it is not an extension of it."""
    n = len(old)
    if len(new) >= n and list(new[:n]) == list(old):
        return len(new) - n
    return None


def _left_context(a: Sequence[int], a_end: int, b: Sequence[int], b_end: int, limit: int = 64) -> int:
    """How many tokens before a_end in ``a`` equal those before b_end in ``b``."""
    n = 0
    while n < limit and n < a_end and n < b_end and a[a_end - 1 - n] == b[b_end - 1 - n]:
        n += 1
    return n


class PromptLookup:
    """Finds a continuation for the current history in the history itself and in references.

    ``policy`` picks among several occurrences of the matched n-gram:

    - ``longest``: the occurrence whose preceding tokens agree longest with the history's
      (the most specific context), the most recent one on ties;
    - ``recent``: the most recent occurrence;
    - ``frequent``: the continuation token seen most often after the n-gram, then the most
      recent occurrence followed by it.
    """

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4, policy: str = "longest",
                 references: Sequence[Sequence[int]] = ()) -> None:
        if policy not in MATCH_POLICIES:
            raise ValueError(f"unknown match policy {policy!r}; choose from {', '.join(MATCH_POLICIES)}")
        self.ngram_min, self.ngram_max, self.policy = ngram_min, ngram_max, policy
        self.history = TokenIndex(ngram_min, ngram_max)
        self.references: List[TokenIndex] = []
        for ref in references:
            index = TokenIndex(ngram_min, ngram_max)
            index.extend(ref)
            self.references.append(index)

    def reset(self, tokens: Sequence[int]) -> None:
        """Forget the history and index ``tokens`` instead."""
        self.history = TokenIndex(self.ngram_min, self.ngram_max)
        self.history.extend(tokens)

    def sync(self, tokens: Sequence[int]) -> bool:
        """Follow ``tokens``: index what was appended, or rebuild (and return True) if it is
        not an extension of the history."""
        n_new = appended(self.history.tokens, tokens)
        if n_new is not None:
            self.history.extend(tokens[len(tokens) - n_new:])
            return False
        self.reset(tokens)
        return True

    def find(self, max_len: int) -> Tuple[List[int], int]:
        """The continuation (up to ``max_len`` tokens) of the best match, and the match length n."""
        hist = self.history.tokens
        for n in range(min(self.ngram_max, len(hist)), self.ngram_min - 1, -1):
            key = tuple(hist[len(hist) - n:])
            candidates = [(self.history, e) for e in self.history.ends(key) if e < len(hist)]
            for ref in self.references:
                candidates += [(ref, e) for e in ref.ends(key) if e < len(ref.tokens)]
            if candidates:
                index, end = self._choose(candidates, hist)
                return index.tokens[end:end + max_len], n
        return [], 0

    def _choose(self, candidates: List[Tuple[TokenIndex, int]], hist: List[int]) -> Tuple[TokenIndex, int]:
        if self.policy == "recent":
            own = [c for c in candidates if c[0] is self.history]
            return (own or candidates)[-1]
        if self.policy == "frequent":
            votes = Counter(index.tokens[end] for index, end in candidates)
            best = votes.most_common(1)[0][0]
            return [c for c in candidates if c[0].tokens[c[1]] == best][-1]
        scored = [(_left_context(index.tokens, end, hist, len(hist)), i) for i, (index, end) in enumerate(candidates)]
        return candidates[max(scored)[1]]



@dataclass
class ReplayStats:
    """What a drafter would have done on a known text (llama-lookup-stats' figures)."""

    n_tokens: int = 0  # tokens emitted
    n_steps: int = 0  # target decode calls
    n_drafted: int = 0
    n_accept: int = 0
    cost: float = 0.0  # in decodes of one token

    @property
    def accept(self) -> float:
        return 100.0 * self.n_accept / self.n_drafted if self.n_drafted else 0.0

    @property
    def speedup(self) -> float:
        """Predicted decode speed over plain decoding (which costs one unit per token)."""
        return self.n_tokens / self.cost if self.cost else 0.0


def replay(drafter: Any, tokens: Sequence[int], n_prompt: int, cost: Callable[[int], float],
           max_len: int = 31) -> ReplayStats:
    """Run ``drafter`` (a model-free Drafter) over ``tokens`` as if the target had generated
    ``tokens[n_prompt:]`` greedily; charge each step the cost of verifying its batch."""
    stats = ReplayStats()
    pos = n_prompt
    drafter.prefill(tokens[:pos])
    greedy = SamplingConfig(temperature=0)
    rng = np.random.default_rng(0)
    while pos < len(tokens):
        draft = drafter.propose(tokens[:pos], min(max_len, len(tokens) - pos - 1), greedy, rng).tokens
        m = accept_greedy(np.asarray(tokens[pos:pos + len(draft)]), np.asarray(draft))
        pos += m + 1
        stats.n_tokens += m + 1
        stats.n_steps += 1
        stats.n_drafted += len(draft)
        stats.n_accept += m
        stats.cost += cost(len(draft) + 1)
        drafter.accepted(tokens[:pos], len(draft), m)
    return stats
