"""What a lane's target chooses from a row of logits, and the walk down a verified trie that
makes those choices.

A row is read as llama-cpp-python's sampler chain reads it: the caller's logits processors
first (``logits_processor``: ``(input_ids, scores) -> scores``), then logit biases and penalties
(``sampling.shape``), the grammar's mask, then the sampler chain (``sampling.transform``) or
mirostat. Three of these depend on the text before the row: the processors and penalties on its
tokens, the grammar and mirostat on a state that each chosen token moves on. A lane's
``Target`` holds that state between steps; the walk carries it down the one path it takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from ..config import SamplingConfig
from ..constraints import Constraint
from ..planning.trie import Trie
from ..sampling import Distribution, Mirostat, recent, sample_at, shape, transform
from .verification import walk_greedy, walk_sampled

# llama-cpp-python's logits processor: (the text's tokens, a row's logits) -> the row's new logits.
Processor = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(eq=False)
class Target:
    """How one text's target chooses: ``sampling`` (its chain), ``constraint`` (where its text is in
    its grammar, when it has one), ``mirostat`` (its surprise state, when it samples with
    mirostat), ``processor`` (the caller's logits processors, as one function)."""

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    constraint: Optional[Constraint] = None
    mirostat: Optional[Mirostat] = None
    processor: Optional[Processor] = None

    @staticmethod
    def start(sampling: SamplingConfig, constraint: Optional[Constraint] = None,
              processor: Optional[Processor] = None) -> "Target":
        """The target of a text about to be generated (mirostat's state at its start)."""
        return Target(sampling, constraint, Mirostat.start(sampling), processor)

    def row(self, logits: np.ndarray, text: Sequence[int]) -> np.ndarray:
        """``logits``, the row after ``text``, as the chain reads it: processed, biased, penalized
        (``logits`` itself when nothing applies). ``text``: the whole text when there is a
        processor, else at least the penalties' window (``sampling.recent``)."""
        if self.processor is not None:
            logits = np.asarray(self.processor(np.array(text, dtype=np.intc), np.array(logits, dtype=np.float32)),
                                dtype=np.float32)
        return shape(logits, self.sampling, text)

    def argmax(self, row: np.ndarray) -> int:
        """The greedy token: the best the grammar allows (and typical-p keeps: it may drop the best)."""
        if self.sampling.typical_p < 1:
            return int(self.distribution(row).ids[0])
        return self.constraint.argmax(row) if self.constraint is not None else int(row.argmax())

    def distribution(self, row: np.ndarray) -> Distribution:
        """What the target samples from: the chain, or mirostat at its present state, over the
        tokens the grammar allows."""
        allowed = self.constraint.mask(row) if self.constraint is not None else row
        return self.mirostat.distribution(allowed) if self.mirostat is not None else transform(allowed, self.sampling)

    def choose(self, row: np.ndarray, uniform: Callable[[], float]) -> int:
        """The token from ``row`` alone (no candidate): greedy, the argmax; sampling, a draw at the
        position's ``uniform``. The grammar and mirostat move on past it."""
        if self.sampling.greedy:
            token = self.argmax(row)
        else:
            dist = self.distribution(row)
            token = sample_at(dist, uniform())
            self.drew(dist, token)
        if self.constraint is not None:
            self.constraint.advance(token)
        return token

    def drew(self, dist: Distribution, token: int) -> None:
        """``token`` was drawn from ``dist``, this target's distribution at its position: mirostat moves on."""
        if self.mirostat is not None:
            self.mirostat.advance(dist, token)


def walk(trie: Trie, logits: np.ndarray, target: Target, rng: np.random.Generator, uniform: Callable[[int], float],
         text: Sequence[int] = ()) -> Tuple[List[int], int, List[np.ndarray]]:
    """The target's choice down the trie, ``logits[v]`` its raw row after node v's path:
    (accepted nodes, the target's next token, the rows it chose from: one per emitted token, as
    ``target.row`` gave them).

    Every row is read after the text along its own path: ``text`` (the lane's, up to the pending
    token) and the path's tokens to v. The walk only ever goes down the child holding the
    target's token, so one grammar state and one mirostat state follow it: each moves on by a
    node's token as the walk enters the node (mirostat: by the token's probability in the
    distribution of the row it was drawn from), and by the next token at the end. A branch the
    walk leaves is never looked at, so no state of one branch reaches another, and a candidate
    token the grammar forbids is never the target's. Each row is read once, in the text's order,
    as plain decoding reads it (a logits processor sees the calls it would see there).
    """
    sampling, constraint = target.sampling, target.constraint
    before = list(text) if target.processor is not None else recent(text, sampling)
    rows: List[np.ndarray] = []
    dists: List[Distribution] = []

    def row(v: int) -> np.ndarray:
        if v:  # the walk entered v: its token is the text's
            if constraint is not None:
                constraint.advance(trie.token[v])
            if dists:
                target.drew(dists[-1], trie.token[v])
        x = logits[v]
        if target.processor is not None or sampling.shaped:
            x = target.row(x, before + [trie.token[u] for u in trie.path(v)])
        rows.append(x)
        return x

    def distribution(v: int) -> Distribution:
        dists.append(target.distribution(row(v)))
        return dists[-1]

    if sampling.greedy:
        path, token = walk_greedy(trie.children, lambda v: target.argmax(row(v)))
    else:
        path, token = walk_sampled(trie.children, trie.q, distribution, rng, uniform)
        target.drew(dists[-1], token)
    if constraint is not None:
        constraint.advance(token)
    return path, token, rows
