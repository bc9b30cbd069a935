"""One step of speculation before and after the target's decode: ask the sources, plan, learn.

The replay harness (a recorded answer) drives it a step at a time::

    plan = speculator.plan(tokens, limits, sampling, rng)   # candidates -> what to verify
    ... verify plan.trie (and the window) ...
    speculator.learn(outcome)                                # every part learns from one outcome

and the engine (a real target, one lane or several) plans in two halves, so that the lanes'
draft models draft together::

    asked = speculator.propose(tokens, limits, sampling, rng)   # each lane's, in turn
    drafted = rounds.together(every lane's asked.drafting)      # one draft decode a round
    plan = speculator.choose(asked, drafted, limits)            # each lane's, in turn

Cheap sources (lookup, n-gram caches, lookahead) propose every step that asks (every step,
unless asking has not been paying for its own time: see Gate). An expensive one (a draft model)
is asked only when the planner expects it to pay; otherwise ``idle`` says why.

A source is optional: the target can always decode plainly. One that raises (in propose,
drafting, lag or learn), proposes what is no proposal (not a Proposal, a candidate of another
source, a token that is no token id, evidence it declares no prior for) or takes longer to
answer one ask than SLOW_ASK single-token decodes of the target is turned off for the rest of
the text, with one LlamaspecWarning naming it and the error (``off``); the text goes on as
the target's own.

Where the text's grammar forces the next tokens (its lead), every candidate begins with them;
a source that reads nothing but the tokens it is given (``Source.past_forced``: lookup, the
n-gram caches) is asked after them, so that what it finds goes on past the lead::

    text                    [{"id": 7, "city": "Oslo"}, {"     pending token: {"
    lead                                                 id      the grammar forces it
    lookup, after text+lead                                ": 7, "city": "Oslo"}    what followed id before
    candidate                                            id": 7, "city": "Oslo"}
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

from .acceptance_model import AcceptanceModel
from ..constraints import Constraint
from ..sources import rounds
from ..sources.base import FORCED, Budget, Candidate, Drafting, Outcome, Proposal, Window, Source
from ..sources.registry import described
from ..config import SamplingConfig
from ..errors import LlamaspecWarning
from ..sampling import Distribution
from .costs import CostModel
from .gate import Gate
from .planner import Choice, Limits, Planner
from .trie import Trie

# Candidates a cheap source may offer per step.
MAX_CANDIDATES = 4
# A cheap source's ask that takes longer than this many single-token decodes of the target (and
# SLOW_FLOOR seconds: a first ask that indexes a long prompt, a pause of the machine) costs more
# than any candidate can repay: the source is turned off. The gate prices sources merely slow.
SLOW_ASK = 100
SLOW_FLOOR = 1.0


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What to verify this step: ``trie`` (the pending token at its root) holds the first
    ``lengths[c]`` tokens of every ``candidates[c]``; ``window`` rides along when set.
    ``t_draft`` is the wall time an expensive source spent proposing, ``sunk`` what it cost in
    single-token decodes (in ``choice.cost``); ``asked``: whether the sources were asked (see Gate)."""

    trie: Trie
    candidates: Tuple[Candidate, ...]
    lengths: Tuple[int, ...]
    window: Optional[Window]
    choice: Choice
    t_draft: float = 0.0
    sunk: float = 0.0
    idle: Dict[str, str] = field(default_factory=dict)
    asked: bool = True


@dataclass(eq=False, kw_only=True)
class StepProposals:
    """A step's sources asked, the expensive ones' drafting not run yet (the engine runs every
    lane's together): the cheap sources' candidates and their estimated acceptance (``rates``),
    lookahead's ``window``, each expensive source asked and its ``drafting``, why the others
    idle, the choice among the cheap candidates where an expensive source was considered,
    ``admit`` (a candidate as the text's grammar and end tokens let it be verified) and
    ``rate_of`` (a candidate's estimates). ``asked``: whether the sources were asked (see Gate)."""

    tokens: Sequence[int]
    limits: Limits
    candidates: List[Candidate]
    rates: List[List[float]]
    window: Optional[Window]
    drafting: List[Tuple[Source, Drafting]]
    admit: Callable[[Candidate], Optional[Candidate]]
    rate_of: Callable[[Candidate], List[float]]
    idle: Dict[str, str] = field(default_factory=dict)
    choice: Optional[Choice] = None
    asked: bool = True


class Speculator:
    """The sources, the acceptance model and the planner, for one text at a time. ``ends``:
    the tokens that end a generation; no candidate goes on past one (nothing after it is ever
    emitted: a prompt's ``.<|im_end|>\\n<|im_start|>`` is a copy worth one token at most).
    ``n_vocab``: the target's vocabulary size, where known: a candidate token at or past it is
    no token id (a source proposing one is turned off)."""

    def __init__(self, sources: Sequence[Source], model: AcceptanceModel, planner: Planner,
                 ends: FrozenSet[int] = frozenset(), n_vocab: Optional[int] = None) -> None:
        self.sources = list(sources)
        self.model = model
        self.planner = planner
        self.ends = ends
        self.n_vocab = n_vocab
        self.gate = Gate()
        # a source whose proposing takes time of its own has a gate of its own (Source.own_gate)
        self.own_gates = {source.name: Gate() for source in self.sources if source.own_gate}
        self._own_seconds: Dict[str, float] = {}  # this step's time of each of them, asked
        self._plain = 0.0  # what a plain step costs under this step's limits
        self._sunk = 0.0  # what a draft model's drafting cost this step (in the plan's cost, not a row's)
        self.off: Dict[str, str] = {}  # the sources turned off for the rest of the text, and why
        self._dropped: List[Source] = []  # (their contexts are still rolled back with the target's)

    @property
    def costs(self) -> CostModel:
        return self.planner.costs

    def plan(self, tokens: Sequence[int], limits: Limits, sampling: SamplingConfig, rng: np.random.Generator,
             constraint: Optional[Constraint] = None,
             estimate: Optional[Callable[[Candidate], List[float]]] = None) -> Plan:
        """What to verify after ``tokens``, the expensive sources drafting here, alone (the engine
        runs ``propose``, every lane's drafting together and ``choose`` itself)."""
        asked = self.propose(tokens, limits, sampling, rng, constraint, estimate)
        return self.choose(asked, rounds.together([drafting for _, drafting in asked.drafting]), limits)

    def propose(self, tokens: Sequence[int], limits: Limits, sampling: SamplingConfig, rng: np.random.Generator,
                constraint: Optional[Constraint] = None,
                estimate: Optional[Callable[[Candidate], List[float]]] = None,
                before_asking: Callable[[], None] = lambda: None) -> "StepProposals":
        """Ask the cheap sources for candidates after ``tokens``, and each expensive source the
        planner expects to pay for its drafting. ``constraint``: the grammar's state after them,
        where the text has one: the target never takes a token the grammar forbids, so a
        candidate is cut before its first such token; a sampled one (a draft model's) just after
        it, where verifying rejects it (cutting a draw before a token drawn for it would bias
        what is emitted there: the residual of speculative sampling is what keeps it exact).
        ``estimate``: each candidate token's acceptance, in place of the acceptance model's (the
        replay's perfect estimates). ``before_asking``: called once the gate says the sources are
        asked, before they are (an engine that overlaps learns from plain steps late: then)."""
        def admit(cand: Candidate) -> Optional[Candidate]:
            cand = _until_end(cand, self.ends)
            if constraint is None:
                return cand
            return _cut(cand, constraint.valid(cand.tokens) + (cand.q is not None))
        rate_of = estimate or (lambda c: self.model.chain(c.source, c.evidence))
        limits = _at_length(limits, len(tokens))
        self._plain, self._sunk = self.planner.plain_cost(limits), 0.0
        if not self.sources or (not self.planner.fixed and not self.gate.ask(self._plain)):
            return StepProposals(tokens=tokens, limits=limits, candidates=[], rates=[], window=None, drafting=[],
                                 admit=admit, rate_of=rate_of, asked=False)
        before_asking()
        candidates: List[Candidate] = []
        window: Optional[Window] = None
        budget = Budget(limits.max_depth, MAX_CANDIDATES)
        lead = constraint.forced()[:limits.max_depth - 1] if constraint is not None and limits.max_depth > 1 else []
        expensive = [source for source in self.sources if source.expensive] if limits.max_depth > 0 else []
        self._own_seconds = {}
        rates: List[List[float]] = []
        if limits.max_depth > 0:
            for source in list(self.sources):
                if source.expensive:
                    continue
                own = self.own_gates.get(source.name)
                if own is not None and not own.ask(0.0):
                    continue
                t0 = time.perf_counter()
                mine = budget
                if own is not None:  # it spares the work its estimates say no row would repay
                    mine = replace(budget, stop_below=self.planner.stop_below(limits))
                try:
                    if lead and source.past_forced:
                        proposal = self._checked(source, source.propose(
                            list(tokens) + lead, replace(mine, max_len=mine.max_len - len(lead)), sampling, rng))
                        proposed = [_after_forced(lead, c) for c in proposal.candidates]
                    else:
                        proposal = self._checked(source, source.propose(tokens, mine, sampling, rng))
                        proposed = list(proposal.candidates)
                    admitted = [c for c in map(admit, proposed) if c is not None]
                    its_rates = [rate_of(c) for c in admitted]  # (evidence without a prior fails here)
                except Exception as e:
                    self._turn_off(source, described(e))
                    continue
                seconds = time.perf_counter() - t0
                if self.costs.timed and seconds > SLOW_FLOOR and self.costs.units(seconds, len(tokens)) > SLOW_ASK:
                    self._turn_off(source, f"one ask took {seconds:.1f} s, over {SLOW_ASK} decodes of the target")
                    continue
                if own is not None:
                    self._own_seconds[source.name] = seconds
                candidates += admitted
                rates += its_rates
                window = proposal.window or window
        if window is not None and max(row[1] for row in window.rows) > limits.room:
            window = None
        asked = StepProposals(tokens=tokens, limits=limits, candidates=candidates, rates=rates, window=window,
                              drafting=[], admit=admit, rate_of=rate_of)
        if expensive:
            asked.choice = self.planner.choose(candidates, rates, window, limits)
        for source in expensive:
            try:
                lag = source.lag(tokens)
            except Exception as e:
                self._turn_off(source, described(e))
                continue
            ask, why = self.planner.ask(source.name, self.model.overall(source.name), lag,
                                        source.max_len, candidates, rates, window, limits, asked.choice)
            if ask is None:
                asked.idle[source.name] = why
            else:
                budget = replace(ask, rates=self.model.rates(source.name))
                asked.drafting.append((source, self._guarded(source, tokens, budget, sampling, rng)))
        return asked

    def _guarded(self, source: Source, tokens: Sequence[int], budget: Budget, sampling: SamplingConfig,
                 rng: np.random.Generator) -> Drafting:
        """``source``'s drafting, or none (an empty proposal) where it fails: then it is turned off."""
        try:
            proposal = self._checked(source, (yield from source.drafting(tokens, budget, sampling, rng)))
            for cand in proposal.candidates:
                self.model.chain(source.name, cand.evidence)  # (evidence without a prior fails here)
        except Exception as e:
            self._turn_off(source, described(e))
            return Proposal()
        return proposal

    def _checked(self, source: Source, proposal: object) -> Proposal:
        """``proposal`` if it is one of ``source``'s, else ValueError saying what it is."""
        if not isinstance(proposal, Proposal):
            raise ValueError(f"proposed a {type(proposal).__name__}, not a Proposal")
        if proposal.window is not None and not isinstance(proposal.window, Window):
            raise ValueError(f"proposed a window that is a {type(proposal.window).__name__}, not a Window")
        for cand in proposal.candidates:
            if not isinstance(cand, Candidate) or cand.source != source.name:
                raise ValueError(f"proposed {cand!r:.80}, not a Candidate of its own")
            for token in cand.tokens:
                if not isinstance(token, (int, np.integer)) or isinstance(token, bool) or token < 0 or \
                        (self.n_vocab is not None and token >= self.n_vocab):
                    raise ValueError(f"proposed {token!r:.40}, which is no token id")
        return proposal

    def _turn_off(self, source: Source, problem: str) -> None:
        """``source`` is asked no more for this text: one warning names it and ``problem``."""
        self.sources.remove(source)
        self._dropped.append(source)
        self.own_gates.pop(source.name, None)
        self.off[source.name] = f"the {source.name} draft source is turned off for this text: {problem}"
        warnings.warn(self.off[source.name], LlamaspecWarning, stacklevel=3)

    def choose(self, asked: "StepProposals", drafted: Sequence[Tuple[Proposal, float]], limits: Limits) -> Plan:
        """What to verify, from what ``asked``'s sources proposed and what its expensive sources
        drafted (each drafting's proposal and the seconds it is charged, see rounds.py).
        ``limits``: the step's, now that the lanes planned before took their rows."""
        limits = _at_length(limits, len(asked.tokens))
        if limits != asked.limits:  # the gate weighs this step's cost against a plain one's under the same limits
            self._plain = self.planner.plain_cost(limits)
            self.gate.plain(self._plain)
        # a plain step (see Gate), or one with no source to ask (plain decoding)
        if not asked.asked and not drafted and not (self.planner.fixed and self.sources):
            choice = Choice((), False, 1.0, self._plain, 1.0)
            return Plan(trie=Trie(asked.tokens[-1]), candidates=(), lengths=(), window=None, choice=choice,
                        asked=False)
        candidates, rates = list(asked.candidates), list(asked.rates)
        sunk = 0.0
        for (source, _), (proposal, _) in zip(asked.drafting, drafted):
            for n, seconds in proposal.decodes:
                self.costs.observe(source.name, n, seconds, limits.length)
            sunk += self.costs.units(sum(seconds for _, seconds in proposal.decodes), limits.length)
            for cand in filter(None, map(asked.admit, proposal.candidates)):
                candidates.append(cand)
                rates.append(asked.rate_of(cand))
        self._sunk = sunk
        if asked.choice is not None and not asked.drafting and limits == asked.limits:
            choice = asked.choice  # nothing drafted: the choice among the cheap candidates stands
        else:
            choice = self.planner.choose(candidates, rates, asked.window, limits, sunk)
        trie = Trie.build(asked.tokens[-1], candidates, choice.lengths)
        return Plan(trie=trie, candidates=tuple(candidates), lengths=choice.lengths,
                    window=asked.window if choice.ride else None, choice=choice,
                    t_draft=sum(seconds for _, seconds in drafted), sunk=sunk, idle=asked.idle, asked=asked.asked)

    def learn(self, outcome: Outcome, share: Optional[float] = None) -> None:
        """Every part learns from ``outcome``. ``share``: the step's part of a decode other
        lanes' rows shared, its drafting included (Engine._shares): what the planner's exchange
        rate is charged in place of the step's marginal cost."""
        self.model.learn(outcome)
        self.planner.learn(len(outcome.emitted), outcome.cost if share is None else share, outcome.estimated)
        n = len(outcome.emitted)

        def units(seconds: float) -> float:  # wall time in single-token decodes, where the curve has ms
            return self.costs.units(seconds, len(outcome.tokens)) if self.costs.timed else 0.0

        def foresaw(candidates: Sequence[Candidate]) -> bool:  # one held every token the step emitted
            return any(c.tokens[:n] == outcome.emitted for c in candidates)
        if self.gate.asked:  # a step that did not ask teaches the gate nothing
            self.gate.learn(outcome.n_accepted, outcome.cost, units(outcome.seconds), foresaw(outcome.candidates))
        extra = max(0.0, outcome.cost - self._sunk - self._plain)  # what the step's rows cost over a plain step
        for name, seconds in self._own_seconds.items():  # what it brought that no other source did
            accepted = sum(1 for sources in outcome.path_sources if set(sources) == {name})
            self.own_gates[name].learn(accepted, extra * _share(outcome, name), units(seconds))
        self._own_seconds = {}
        for source in list(self.sources):
            try:
                source.learn(outcome)
            except Exception as e:
                self._turn_off(source, described(e))

    def contexts(self) -> list:
        return [ctx for source in self.sources + self._dropped for ctx in source.contexts()]


def _share(outcome: Outcome, name: str) -> float:
    """The share of the step's verified rows (trie nodes and window rows) that held a token of
    source ``name`` alone (a node another source proposed too would have been verified anyway)."""
    def nodes(mine: bool) -> set:
        return {c.tokens[:i] for c, n in zip(outcome.candidates, outcome.verified) if (c.source == name) == mine
                for i in range(1, n + 1)}
    mine, theirs = nodes(True), nodes(False)
    rows = len(mine | theirs) + len(outcome.window_tokens or ())
    return len(mine - theirs) / rows if rows else 0.0


def _at_length(limits: Limits, length: int) -> Limits:
    """``limits`` behind a text of ``length`` tokens (the limits themselves where they say so)."""
    return limits if limits.length == length else replace(limits, length=length)


def _after_forced(lead: Sequence[int], cand: Candidate) -> Candidate:
    """``cand``, proposed after the ``lead`` the grammar forces, with the lead before it."""
    q = None if cand.q is None else tuple(map(Distribution.point, lead)) + cand.q
    return Candidate(tuple(lead) + cand.tokens, cand.source, (FORCED,) * len(lead) + cand.evidence, q)


def _until_end(cand: Candidate, ends: FrozenSet[int]) -> Candidate:
    """``cand`` up to and with its first token in ``ends``."""
    for i, token in enumerate(cand.tokens):
        if token in ends:
            return _cut(cand, i + 1)
    return cand


def _cut(cand: Candidate, n: int) -> Optional[Candidate]:
    """The first ``n`` tokens of ``cand`` (None for none)."""
    if n <= 0:
        return None
    if n >= len(cand.tokens):
        return cand
    return replace(cand, tokens=cand.tokens[:n], evidence=cand.evidence[:n], q=cand.q[:n] if cand.q is not None else None)
