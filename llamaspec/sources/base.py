"""The one interface every draft source implements, and what flows through a step.

Data flows one way::

    sources --propose--> Candidates --planner--> Plan (a token trie) --engine--> Outcome
       ^                                                                            |
       +------------------------------ learn (one call) ----------------------------+

A source proposes candidates: tokens that may follow the text, each with the evidence for it
(a key per token that names what the source saw: a match of so many tokens, a draft model's
confidence, ...; each source declares its keys and their priors, see ``registry.py``). Proposing
nothing is always a valid answer: the step then decodes one token plainly. A source carries no
scratch state from ``propose`` to ``learn``: the outcome holds every candidate of the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generator, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..config import SamplingConfig
from ..sampling import Distribution
from ..sequences import BatchRow

if TYPE_CHECKING:
    from ..llama.binding import Context, KVSequence

# What a source saw behind one candidate token: the acceptance model keys its estimates on it.
Evidence = Hashable


@dataclass(frozen=True)
class ForcedLead:
    """Evidence of a token the text's grammar forces at its position: a candidate that goes on
    past the grammar's forced tokens begins with them (see ``Source.past_forced``)."""


FORCED = ForcedLead()
# The prior of a forced token, whatever source's candidate it leads (the grammar's own are accepted as often).
FORCED_PRIOR = 0.9


@dataclass(frozen=True)
class Candidate:
    """Tokens a source proposes to follow the text.

    ``evidence[i]`` is the evidence key of ``tokens[i]``: what the acceptance model keys its
    estimate of "accepted, given the tokens before it were" on. ``q`` is set for tokens sampled from a
    draft model: ``tokens[i]`` was drawn from ``q[i]``; without it the candidate is
    deterministic (a point mass).
    """

    tokens: Tuple[int, ...]
    source: str
    evidence: Tuple[Evidence, ...]
    q: Optional[Tuple[Distribution, ...]] = None

    def __post_init__(self) -> None:
        if len(self.evidence) != len(self.tokens) or (self.q is not None and len(self.q) != len(self.tokens)):
            raise ValueError("a candidate needs one evidence key (and one q) per token")


@dataclass(frozen=True)
class Window:
    """Rows that ride along in the verify batch without being verified: lookahead's Jacobi
    window. Sequence ids are local (0 .. n_seqs - 1; the engine maps them to free sequences,
    every one sharing the accepted text); offsets count from the pending token's position.
    ``value`` is the expected number of future accepted tokens one ride earns."""

    rows: Tuple[BatchRow, ...]
    n_seqs: int
    value: float

    def after(self, n_seqs: int) -> List[BatchRow]:
        """The rows with their sequence ids moved past the first ``n_seqs`` (a trie's)."""
        return [BatchRow(t, offset, tuple(n_seqs + s for s in seqs), logits) for t, offset, seqs, logits in self.rows]


@dataclass(frozen=True)
class Proposal:
    """What one source proposes for one step. ``decodes`` are the (rows, seconds) of the model
    decodes proposing took (a draft model's), for the cost model."""

    candidates: Tuple[Candidate, ...] = ()
    window: Optional[Window] = None
    decodes: Tuple[Tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Budget:
    """What the planner asks of a source this step.

    ``max_len``: the longest candidate worth proposing; ``max_candidates``: how many;
    ``stop_below``: a source that pays per drafted token (a draft model) or per head (draft
    heads) stops when the estimated chance that its whole path is accepted falls below this
    (for a cheap source: no token estimated lower is worth a row, ``Planner.stop_below``); ``rates``: the
    acceptance model's estimate for each of the source's evidence keys.
    """

    max_len: int
    max_candidates: int = 4
    stop_below: float = 0.0
    rates: Mapping[Evidence, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What one verified step showed; every source, the acceptance model and the planner learn
    from it.

    ``tokens`` is the text after the step (its last token pending; read-only). ``emitted`` are
    the step's new tokens: the accepted candidate tokens, then the target's own token. Each is
    the target's own choice at its position (greedy: its argmax; sampling: exactly a sample of
    its p), so they show which candidate tokens the target would have accepted, verified or
    not. ``verified[c]`` is how many tokens of ``candidates[c]`` were in the batch,
    ``path_sources`` the sources behind each accepted token, ``window_tokens`` the target's
    greedy token at each window row with logits (None when no window rode), ``cost`` what the
    step cost as planned, in single-token decodes, ``estimated`` the candidate tokens the
    acceptance model expected accepted among those verified, ``seconds`` the wall time asking
    the sources and planning took (a draft model's drafting aside; 0: not measured),
    ``hidden`` the target's last hidden state at the row it chose its own token from (the
    emitted's last), where its decodes output hidden states (a source's plugin asks for them),
    and ``logits`` that row's raw logits (n_vocab,), beside it.
    """

    tokens: Sequence[int]
    candidates: Tuple[Candidate, ...]
    verified: Tuple[int, ...]
    emitted: Tuple[int, ...]
    path_sources: Tuple[Tuple[str, ...], ...] = ()
    window_tokens: Optional[Tuple[int, ...]] = None
    cost: float = 0.0
    estimated: float = 0.0
    seconds: float = 0.0
    hidden: Optional[np.ndarray] = None
    logits: Optional[np.ndarray] = None

    @property
    def n_accepted(self) -> int:
        return len(self.emitted) - 1


@dataclass(frozen=True)
class Read:
    """Tokens to append to a sequence, and read the logits after the last of them."""

    seq: "KVSequence"
    tokens: Tuple[int, ...]


# yields what to read, is sent the logits after it, returns its proposal
Drafting = Generator[Read, np.ndarray, Proposal]


def done(proposal: Proposal) -> Drafting:
    """A drafting that reads nothing: ``proposal``, known already."""
    return proposal
    yield  # (makes this a generator)


class Source:
    """A draft source: everything the speculator and the engine call on one. A source that reads
    only the text overrides ``propose`` and, where it keeps memory, ``learn`` and ``finish``.

    ``name``: its name in ``--spec``, the statistics and the acceptance model. ``max_len``: the
    longest candidate it proposes, where it has a limit of its own (0: the budget's). ``expensive``: proposing costs time before anything is known
    of the proposal (a draft model's decodes, on its own cost curve named after it), so the
    planner decides first whether to ask it (``Planner.ask``), from ``lag``, and asks it through
    ``drafting``, which the engine runs for every lane at once. ``past_forced``: it
    reads nothing but the tokens it is given, so where the text's grammar forces the next tokens
    the speculator asks it after them (``tokens`` then ends with them, unverified) and puts them
    before its candidates (evidence ``FORCED``, which its plugin gives a prior). ``own_gate``:
    its proposing takes time of its own (draft heads' products), so it is asked only while the
    tokens it alone proposed, accepted, repay that time, measured, and its share of the rows
    verified, those it alone held (``planning/gate.py``, one gate of its own). Foresight does
    not count for it: a draft heads' tree, four guesses a head, holds the next token most steps,
    which says nothing of whether it will pay.
    """

    name: str = ""
    max_len: int = 0
    expensive: bool = False
    past_forced: bool = False
    own_gate: bool = False

    def propose(self, tokens: Sequence[int], budget: Budget, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        """Candidates to follow ``tokens`` (its last token is pending, not yet in any cache)."""
        raise NotImplementedError

    def drafting(self, tokens: Sequence[int], budget: Budget, sampling: SamplingConfig,
                 rng: np.random.Generator) -> "Drafting":
        """An expensive source's proposal as rounds of decodes (see rounds.py), so that the lanes
        of one step draft together: what the speculator asks an expensive source for. By
        default its ``propose``, reading nothing."""
        return done(self.propose(tokens, budget, sampling, rng))

    def lag(self, tokens: Sequence[int]) -> int:
        """Accepted tokens (the pending one aside) it must catch up on before proposing after
        ``tokens``: what an expensive source's next proposal costs beyond its drafting."""
        return 0

    def learn(self, outcome: Outcome) -> None:
        """The step is over."""

    def contexts(self) -> List["Context"]:
        """The llama.cpp contexts this source owns (the engine rolls them back with the target's)."""
        return []

    def finish(self, tokens: Sequence[int]) -> None:
        """The generation is over; keep what should outlive it (a dynamic n-gram cache)."""


# Every value length_bucket gives.
LENGTH_BUCKETS = (0, 1, 2, 3, 4, 5, 8, 12, 16, 24, 32)


def length_bucket(n: int) -> int:
    """Evidence bucket of a match of n tokens: exact up to 4, then roughly logarithmic
    (5-7 -> 5, 8-11 -> 8, 12-15 -> 12, 16-23 -> 16, 24-31 -> 24, 32+ -> 32)."""
    if n <= 4:
        return max(n, 0)
    for edge in (32, 24, 16, 12, 8, 5):
        if n >= edge:
            return edge
    return 5
