"""The one interface every draft source implements, and what flows through a step.

Data flows one way::

    sources --propose--> Candidates --planner--> Plan (a token trie) --engine--> Outcome
       ^                                                                            |
       +------------------------------ learn (one call) ----------------------------+

A source proposes candidates: tokens that may follow the text, each with the evidence for it
(a small integer bucket per token: a match length, a draft model's confidence, ...). Proposing
nothing is always a valid answer: the step then decodes one token plainly. A source carries no
scratch state from ``propose`` to ``learn``: the outcome holds every candidate of the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Mapping, Optional, Protocol, Sequence, Tuple

import numpy as np

from ..config import SamplingConfig
from ..sampling import Distribution

if TYPE_CHECKING:
    from ..llama.binding import Context

# A batch row of a rider: (token, position offset from the pending token, local sequence ids, logits?).
RiderRow = Tuple[int, int, Tuple[int, ...], bool]


@dataclass(frozen=True)
class Candidate:
    """Tokens a source proposes to follow the text.

    ``evidence[i]`` is the bucket of ``tokens[i]``: what the acceptance model keys its estimate
    of "accepted, given the tokens before it were" on. ``q`` is set for tokens sampled from a
    draft model: ``tokens[i]`` was drawn from ``q[i]``; without it the candidate is
    deterministic (a point mass).
    """

    tokens: Tuple[int, ...]
    source: str
    evidence: Tuple[int, ...]
    q: Optional[Tuple[Distribution, ...]] = None

    def __post_init__(self) -> None:
        if len(self.evidence) != len(self.tokens) or (self.q is not None and len(self.q) != len(self.tokens)):
            raise ValueError("a candidate needs one evidence bucket (and one q) per token")


@dataclass(frozen=True)
class Rider:
    """Rows that ride along in the verify batch without being verified: lookahead's Jacobi
    window. Sequence ids are local (0 .. n_seqs - 1; the engine maps them to free sequences,
    every one sharing the accepted text); offsets count from the pending token's position.
    ``value`` is the expected number of future accepted tokens one ride earns."""

    rows: Tuple[RiderRow, ...]
    n_seqs: int
    value: float

    def after(self, n_seqs: int) -> List[RiderRow]:
        """The rows with their sequence ids moved past the first ``n_seqs`` (a trie's)."""
        return [(t, offset, tuple(n_seqs + s for s in seqs), logits) for t, offset, seqs, logits in self.rows]


@dataclass(frozen=True)
class Proposal:
    """What one source proposes for one step. ``decodes`` are the (rows, seconds) of the model
    decodes proposing took (a draft model's), for the cost model."""

    candidates: Tuple[Candidate, ...] = ()
    rider: Optional[Rider] = None
    decodes: Tuple[Tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Budget:
    """What the planner asks of a source this step.

    ``max_len``: the longest candidate worth proposing; ``max_candidates``: how many;
    ``stop_below``: a source that pays per drafted token (a draft model) stops when the
    estimated chance that its whole path is accepted falls below this; ``rates``: the
    acceptance model's estimate for each of the source's evidence buckets.
    """

    max_len: int
    max_candidates: int = 4
    stop_below: float = 0.0
    rates: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """What one verified step showed; every source, the acceptance model and the planner learn
    from it.

    ``tokens`` is the text after the step (its last token pending; read-only). ``emitted`` are
    the step's new tokens: the accepted candidate tokens, then the target's own token. Each is
    the target's own choice at its position (greedy: its argmax; sampling: exactly a sample of
    its p), so they show which candidate tokens the target would have accepted, verified or
    not. ``verified[c]`` is how many tokens of ``candidates[c]`` were in the batch,
    ``path_sources`` the sources behind each accepted token, ``rider_tokens`` the target's
    greedy token at each rider row with logits (None when no rider rode), ``cost`` what the
    step cost as planned, in single-token decodes, ``estimated`` the candidate tokens the
    acceptance model expected accepted among those verified.
    """

    tokens: Sequence[int]
    candidates: Tuple[Candidate, ...]
    verified: Tuple[int, ...]
    emitted: Tuple[int, ...]
    path_sources: Tuple[Tuple[str, ...], ...] = ()
    rider_tokens: Optional[Tuple[int, ...]] = None
    cost: float = 0.0
    estimated: float = 0.0

    @property
    def n_accepted(self) -> int:
        return len(self.emitted) - 1


class Source(Protocol):
    """A draft source. ``expensive`` sources (a draft model) cost time to propose, so the
    planner decides first whether to ask them at all."""

    name: str
    expensive: bool

    def propose(self, tokens: Sequence[int], budget: Budget, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        """Candidates to follow ``tokens`` (its last token is pending, not yet in any cache)."""

    def learn(self, outcome: Outcome) -> None:
        """The step is over."""

    def contexts(self) -> List["Context"]:
        """The llama.cpp contexts this source owns (the engine rolls them back with the target's)."""

    def finish(self, tokens: Sequence[int]) -> None:
        """The generation is over; keep what should outlive it (a dynamic n-gram cache)."""


def length_bucket(n: int) -> int:
    """Evidence bucket of a match of n tokens: exact up to 4, then roughly logarithmic
    (5-7 -> 5, 8-11 -> 8, 12-15 -> 12, 16-23 -> 16, 24-31 -> 24, 32+ -> 32)."""
    if n <= 4:
        return max(n, 0)
    for edge in (32, 24, 16, 12, 8, 5):
        if n >= edge:
            return edge
    return 5
