"""Which candidate tokens to verify: the sub-trie with the most expected tokens per unit of cost.

The model. A candidate token v is accepted when its parent was and the target picks v's token:
P(v) = P(parent) * a(v), with a(v) from the acceptance model's per-token estimates (where
several candidates share v, the best of their chains, but see ``Plugin.shadowed_by``); the children of one
node exclude each other, so the best estimated child keeps its a and each next one gets at most
what the better ones leave. Verifying the node set S emits on average

    E(S) = 1 + sum of P(v) over S          (the 1: the target's own token, always emitted)

tokens for one target decode of 1 + |S| rows, which costs C(1 + |S|) single-token decodes (the
measured curve of this machine, ``costs.CostModel``), plus what drafting cost this step (a draft
model's decodes). The planner verifies the S that maximises E(S) / cost(S). For a given size the
best S is the |S| nodes of highest P, and that set holds every node's parent (P never grows down
a path), so one pass over the nodes by decreasing P tries every size; the cost curve need not be
monotone. S empty is a plain step: E / cost = 1.

What a token is worth. The planner maximises E(S) - lam * cost(S), with lam the rate recent steps
reached (``Planner.rate``, at least 1): an accepted token saves the decode that would produce it
later, and inside a copy that goes on, the next step would copy it at about that rate, so it is
worth one token of E. Not so where the copy ends: when the sources offer a continuation after v
but none likely (none accepted at least GOES_ON given v), the target's own token after v is one
no source offers, which takes a plain step of its own unless it comes as the bonus of a step
that accepted v. So accepting such a v saves a whole decode: it counts lam tokens
(``_worth``). A summary's line ending after a quoted sentence (`` mechanism`` then ``.\n``, where
the passage goes on ``.`` and a new sentence) is worth verifying at a price a token inside the
quote is not.

The estimates are calibrated: the planner verifies the candidates rated best, so those are rated
too well on average where the text gives little to copy, while a copied run, once it is going,
goes on longer than its per-token rates multiply out to. Every P is multiplied by the ratio of
the candidate tokens accepted to those the estimates expected, over recent verified steps
(``Planner.calibration``, held near 1 until there is evidence, drifting back to 1 when nothing
is verified), siblings still sharing at most their parent's P.

A window (lookahead's Jacobi window) adds its rows to the batch and its value (expected future
tokens) to E; it rides when that raises E / cost.

A draft model costs time before anything is known of its proposal, so it is asked first:
``ask`` compares the best plan of the cheap sources with plans that add a draft of k tokens,
each accepted with the draft's overall acceptance so far, at the cost of drafting them (a
decode per token plus catching the draft's cache up). It is asked only when that pays, and told
to stop drafting once the chance that its whole path is accepted no longer repays one more
draft decode. Then ``choose`` plans again with the real draft, its tokens weighed by their own
confidence; what drafting cost is spent either way and counts in every plan's cost.

Sampled draft tokens are planned without looking at their values (each sits on its own branch,
never merged with another source's token while planning; its weight depends only on the draft's
confidence before drawing it), so choosing them never biases the tokens drawn: speculative
sampling stays exact. Deterministic candidates merge freely.

On a GPU-like flat curve verifying more is nearly free, so the planner picks long drafts, wide
tries, the window and the draft model; on a steep CPU curve it picks short drafts or none.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from ..sources.base import Budget, Candidate, Window
from ..sources import default_registry
from .shape import decode
from .costs import N_MAX, CostModel
from .trie import Trie

# Branches (KV-cache sequences besides the text's) a step may verify, unless a source needs more.
MAX_LEAVES = 8
# A draft model's catch-up is charged this many steps' share each step (see Planner.ask).
CATCH_UP_STEPS = 8
# A node whose likeliest child is accepted less than this, given the node, ends its copy (see _worth).
GOES_ON = 0.7
# Draft lengths tried when deciding whether to ask a draft model.
ASK_LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


@dataclass(frozen=True)
class Limits:
    """What one step may verify: the deepest position it may accept (tokens left to generate,
    room in the context), the rows a batch may hold, the positions left in the context after
    the pending token's, and how many branches (KV-cache sequences). ``base_rows``: rows other
    sequences put in the same decode; this one's rows cost what they add to them. ``length``:
    the text's tokens, the pending one included (decodes cost more behind a longer text).
    ``shape``: the rows of the last decode, and ``switch``: what a decode of another row count
    is charged more (where a change of row count costs: planning/shape.py)."""

    max_depth: int
    max_rows: int
    room: int
    max_leaves: int = MAX_LEAVES
    base_rows: int = 0
    length: Optional[int] = None
    shape: int = 0
    switch: float = 0.0


@dataclass(frozen=True)
class Choice:
    """``lengths[c]``: how many tokens of candidate c to verify; ``ride``: whether the window rides.
    ``expected`` tokens for ``cost`` single-token decodes (drafting included); ``value``: what
    they are worth, in tokens (see _worth); ``estimated``: the candidate tokens the acceptance
    model expected accepted, before calibration; ``forgone``: after single-row decodes where a
    change of row count costs (planning/shape.py), what the best plan would have scored more had
    the change cost nothing (what staying on one row forgoes, in tokens)."""

    lengths: Tuple[int, ...]
    ride: bool
    expected: float
    cost: float
    value: float
    estimated: float = 0.0
    forgone: float = 0.0

    @property
    def rate(self) -> float:
        return self.expected / self.cost if self.cost > 0 else 0.0


class Planner:
    """Chooses what to verify from candidates, their per-token acceptance estimates and the costs.

    Sources named in ``fixed`` are verified whole, every step (and their window always rides): how
    llama.cpp's programs verify, for comparing with them. ``shadowed``: source -> the source that
    shadows it (``Plugin.shadowed_by``; by default the built-in sources').
    """

    RATE_DECAY = 0.95
    # Calibration: decay per step, and the pseudo-count of accepted tokens that holds the factor
    # at 1 until evidence builds up (and brings it back to 1 when nothing is verified for a while).
    CALIBRATION_DECAY = 0.95
    CALIBRATION_PRIOR = 8.0

    def __init__(self, costs: CostModel, fixed: FrozenSet[str] = frozenset(),
                 shadowed: Optional[Mapping[str, str]] = None) -> None:
        self.costs = costs
        self.fixed = fixed
        self.shadowed = default_registry().shadowed() if shadowed is None else shadowed
        self._tokens, self._cost = 0.0, 0.0  # decayed sums over recent steps
        self._accepted, self._estimated = 0.0, 0.0  # decayed sums over recent verified steps
        self._known: Dict[Tuple[int, int, int, float, Optional[int]], float] = {}  # _added's, in this epoch
        self._epoch = -1  # of the costs' verify costs that _known holds

    @property
    def rate(self) -> float:
        """Tokens per unit of cost recently reached, at least plain decoding's 1: what a unit of
        cost is worth elsewhere, the price each step's extra rows must beat."""
        return max(1.0, self._tokens / self._cost) if self._cost > 0 else 1.0

    @property
    def calibration(self) -> float:
        """How many candidate tokens were accepted, recently, per token the acceptance model
        expected accepted in what was verified. The planner picks the candidates rated best, so
        the ones it verifies are rated too well on average where the text gives little to copy
        (the factor falls below 1), and copied runs go on longer than per-token rates multiply
        out to where it gives much (above 1)."""
        k = self.CALIBRATION_PRIOR
        return (self._accepted + k) / (self._estimated + k)

    def learn(self, n_tokens: int, cost: float, estimated: float = 0.0) -> None:
        """A step emitted ``n_tokens`` for ``cost`` (its plan's estimate); ``estimated``: the
        candidate tokens its plan expected accepted before calibration (0 for a plain step)."""
        d = self.RATE_DECAY
        self._tokens, self._cost = self._tokens * d + n_tokens, self._cost * d + cost
        d = self.CALIBRATION_DECAY
        self._accepted = self._accepted * d + (n_tokens - 1 if estimated > 0 else 0)
        self._estimated = self._estimated * d + estimated

    def choose(self, candidates: Sequence[Candidate], rates: Sequence[Sequence[float]],
               window: Optional[Window], limits: Limits, sunk: float = 0.0) -> Choice:
        """The best selection. ``rates[c][i]``: estimated acceptance of ``candidates[c].tokens[i]``
        given its predecessors; ``sunk``: what drafting already cost this step."""
        if not self.fixed:
            limits = _measured(limits)
        # on one row where another row count costs the switch: also score each plan without it
        entering = _entering(limits)
        free = replace(limits, shape=0) if entering else limits
        cost = partial(self._added, limits)  # what n rows add under the step's limits
        cost_free = partial(self._added, free) if entering else cost  # and without the switch
        if not self.fixed and not self._may_pay(rates, window, free, cost_free):
            return Choice((0,) * len(candidates), False, 1.0, sunk + cost(1), 1.0)
        lam = self.rate
        parent, raw, depth, support = _nodes(candidates, rates, self.shadowed)
        prob = _scaled(parent, raw, self.calibration)
        worth = _worth(parent, prob, lam)
        forced = [v for v in range(1, len(parent))
                  if any(candidates[c].source in self.fixed for c, _ in support[v])] if self.fixed else []
        force_window = window is not None and bool(self.fixed)
        rider_rows = len(window.rows) if window is not None else 0

        chosen: List[int] = []
        picked = [False] * len(parent)
        picked[0] = True
        has_child = [False] * len(parent)
        leaves, value = 1, 1.0
        best: Optional[Tuple[float, int, bool]] = None  # (score, nodes, ride)
        best_free = -float("inf")  # the best score without the switch (entering)

        def consider() -> None:
            rows = 1 + len(chosen)
            if not force_window:
                weigh(value, rows, False)
            if window is not None and rows + rider_rows <= limits.max_rows:
                weigh(value + window.value, rows + rider_rows, True)

        def weigh(worth_of: float, n_rows: int, ride: bool) -> None:
            nonlocal best, best_free
            score = worth_of - lam * (sunk + cost(n_rows))
            if best is None or score > best[0]:
                best = (score, len(chosen), ride)
            if entering:
                best_free = max(best_free, worth_of - lam * (sunk + cost_free(n_rows)))

        def take(v: int) -> bool:
            nonlocal leaves, value
            p = parent[v]
            if not picked[p] or depth[v] > limits.max_depth or 1 + len(chosen) + 1 > limits.max_rows:
                return False
            if has_child[p] and leaves + 1 > limits.max_leaves:
                return False
            leaves += has_child[p]
            has_child[p] = True
            picked[v] = True
            chosen.append(v)
            value += prob[v] * worth[v]
            return True

        for v in forced:  # a fixed source's tokens are all verified; the scan adds to them
            take(v)
        consider()
        for v in _by_decreasing(prob):
            if len(chosen) + 2 > limits.max_rows:  # no room for another node
                break
            if not picked[v] and take(v):
                consider()
        _, n, ride = best if best is not None else (0.0, len(chosen), False)
        lengths = [0] * len(candidates)
        for v in chosen[:n]:
            for c, pos in support[v]:
                lengths[c] = max(lengths[c], pos + 1)
        ridden = window.value if ride and window else 0.0
        expected = 1.0 + sum(prob[v] for v in chosen[:n]) + ridden
        worth_all = 1.0 + sum(prob[v] * worth[v] for v in chosen[:n]) + ridden
        rows = 1 + n + (rider_rows if ride else 0)
        forgone = max(0.0, best_free - best[0]) if entering and best is not None else 0.0
        return Choice(tuple(lengths), ride, expected, sunk + cost(rows), worth_all, sum(raw[v] for v in chosen[:n]),
                      forgone)

    def stop_below(self, limits: Limits) -> float:
        """The estimated acceptance (before calibration) under which a candidate token is not worth
        its row this step, by the bound ``_may_pay`` uses: m tokens each expected accepted less
        than the cheapest mean of m rows added to a plain step cannot repay them (a token is
        worth at most lam tokens, a unit of cost lam). Where a change of row count costs, the
        rows' own cost, as ``forgone`` weighs them. 0 for fixed sources (verified whole)."""
        if self.fixed:
            return 0.0
        limits = _measured(limits)
        if _entering(limits):
            limits = replace(limits, shape=0)
        plain = self._added(limits, 1)
        cheapest = min(((self._added(limits, 1 + m) - plain) / m for m in range(1, limits.max_rows)),
                       default=float("inf"))
        return max(0.0, cheapest) / self.calibration

    def plain_cost(self, limits: Limits) -> float:
        """What a plain step costs: the one row it adds."""
        return self._added(limits, 1)

    def _added(self, limits: Limits, rows: int) -> float:
        """What ``rows`` add to the decode of the ``limits.base_rows`` other sequences put in it
        (known from an earlier step while the costs' verify costs stand: a step weighs some thirty
        row counts)."""
        if self._epoch != self.costs.epoch:
            self._epoch = self.costs.epoch
            self._known.clear()
        key = (rows, limits.base_rows, limits.shape, limits.switch, self.costs.length_step(limits.length))
        cost = self._known.get(key)
        if cost is None:
            base = limits.base_rows
            cost = self._known[key] = self._decode(limits, base + rows) - (self._decode(limits, base) if base else 0.0)
        return cost

    def _decode(self, limits: Limits, rows: int) -> float:
        """What a decode of ``rows`` rows costs after the last one (planning/shape.py)."""
        return decode(rows, limits.shape, limits.switch, lambda n: self.costs.verify(n, limits.length))[1]

    def _may_pay(self, rates: Sequence[Sequence[float]], window: Optional[Window], limits: Limits,
                 added: Callable[[int], float]) -> bool:
        """Whether any selection could beat a plain step: a bound that spares building the trie
        where nothing pays, which is most steps of a text that copies little. Verifying m nodes
        adds at most the m best single chain values (calibrated, at most 1 each: merging shares
        nodes and siblings exclude each other, which only lowers them), each worth at most lam
        tokens, for m rows. ``added(n)``: what n rows add under ``limits``."""
        lam, factor = self.rate, self.calibration
        values = sorted((lam * min(1.0, factor * p) for chain in _chains(rates) for p in chain), reverse=True)
        plain = 1.0 - lam * added(1)
        ride_rows, ride_value = (len(window.rows), window.value) if window is not None else (0, 0.0)
        if ride_rows and 1.0 + ride_value - lam * added(1 + ride_rows) > plain:
            return True
        value = 1.0
        for m, v in enumerate(values[:limits.max_rows - 1], 1):
            value += v
            if value - lam * added(1 + m) > plain:
                return True
            if ride_rows and value + ride_value - lam * added(1 + m + ride_rows) > plain:
                return True
        return False

    def ask(self, name: str, rate: float, lag: int, draft_max: int, candidates: Sequence[Candidate],
            rates: Sequence[Sequence[float]], window: Optional[Window], limits: Limits,
            base: Optional[Choice] = None) -> Tuple[Optional[Budget], str]:
        """Whether a draft model is worth running this step, with ``rate`` its expected per-token
        acceptance and ``lag`` the accepted tokens its cache misses: (its budget or None, why).
        ``base``: the choice among the other candidates, when already made."""
        lam = self.rate
        base = base or self.choose(candidates, rates, window, limits)
        base_score = base.value - lam * base.cost
        length = limits.length
        c_d = self.costs.token(name, length)
        lengths = [k for k in ASK_LENGTHS if k <= min(draft_max, limits.max_depth)]
        if not lengths:
            return None, f"{name}: no room to draft"
        # Catching the draft's cache up is paid once and serves every later draft step: each step
        # is charged CATCH_UP_STEPS-th of it.
        catch_up = (self.costs.proposing(name, 1, lag, length) - self.costs.proposing(name, 1, 0, length)) / CATCH_UP_STEPS

        def drafting(k: int) -> float:
            return self.costs.proposing(name, k, 0, length) + catch_up

        # alone, to skip the full plans when the draft cannot pay, and (without the catch-up) for
        # the explanation
        alone = []
        for k in lengths:
            expected = sum(rate ** j for j in range(k + 1))
            cost = self.costs.proposing(name, k, 0, length) + self._added(limits, k + 1)
            alone.append((expected - lam * (cost + catch_up), expected / cost, k))
        score = max(alone)[0]
        _, ratio, k_best = max(alone, key=lambda a: a[1])
        why = (f"{name} idle: a drafted token costs {c_d:.2f} of a target token and verifying {k_best} costs "
               f"{self.costs.verify(k_best + 1, length):.2f}; at {rate:.0%} acceptance the best draft is expected at "
               f"{ratio:.2f}x plain" + (f" before catching up on {lag} tokens" if lag > 1 else "")
               + (f", the other sources at {base.rate:.2f}x" if base.rate > 1 else ""))
        fixed = name in self.fixed
        if score <= base_score and not fixed:
            return None, why
        best_score, best_k = base_score, 0
        for k in lengths:
            hyp = Candidate(tuple(range(-k, 0)), name, (0,) * k)
            choice = self.choose([*candidates, hyp], [*rates, [rate] * k], window, limits, drafting(k))
            score = choice.value - lam * choice.cost
            if choice.lengths[-1] and score > best_score:
                best_score, best_k = score, k
        if best_k == 0 and not fixed:
            return None, why
        return Budget(min(draft_max, limits.max_depth), 1, stop_below=0.0 if fixed else lam * c_d), ""


def _measured(limits: Limits) -> Limits:
    """No more rows than the cost curve measured, unless other sequences' rows share the decode:
    past N_MAX a cost is a guess, and a proportional guess undershot the cost measured
    (docs/results.md, "Tuning the planner by replaying recorded answers")."""
    return limits if limits.base_rows else replace(limits, max_rows=min(limits.max_rows, N_MAX))


def _entering(limits: Limits) -> bool:
    """Whether the step is on one row where a decode of another row count costs the switch
    (planning/shape.py): plans are then also weighed without it."""
    return limits.switch > 0 and limits.shape == 1 and not limits.base_rows


def _scaled(parent: Sequence[int], prob: Sequence[float], factor: float) -> List[float]:
    """Every node's P times ``factor``, the children of a node together at most its own P (the
    likelier first: siblings exclude each other). Parents come before their children."""
    out = [1.0] * len(prob)
    left = [1.0] * len(prob)  # what a node's children may still share
    for v in _by_decreasing(prob):  # a parent's P is at least its child's
        p = parent[v]
        out[v] = min(left[p], factor * prob[v])
        left[p] -= out[v]
        left[v] = out[v]
    return out


def _worth(parent: Sequence[int], prob: Sequence[float], lam: float) -> List[float]:
    """What accepting each node is worth, in tokens at the price ``lam`` (see the module's
    docstring): ``lam`` where the sources offer children but none is accepted at least GOES_ON
    given the node (the copy ends after it), else 1. A node without children is one the
    candidates stop at for want of length as often as for want of a copy: 1."""
    offered = [False] * len(parent)
    goes_on = [False] * len(parent)
    for v in range(1, len(parent)):
        p = parent[v]
        offered[p] = True
        goes_on[p] = goes_on[p] or prob[v] >= GOES_ON * prob[p]
    return [lam if offered[v] and not goes_on[v] else 1.0 for v in range(len(parent))]


def _nodes(candidates: Sequence[Candidate], rates: Sequence[Sequence[float]], shadowed: Mapping[str, str]):
    """The planning trie: deterministic candidates merged, sampled ones (a draft model's) each on
    a branch of its own. Returns (parent, P, depth, support) per node, node 0 the root.

    Each candidate's own chain gives P_c(i) = rates[c][0] * .. * rates[c][i]; a node shared by
    several candidates takes the best of their chains (sources that copy the same text are not
    independent evidence, so their estimates are not combined), a ``shadowed`` source's left
    out where the source shadowing it proposes the node too. Then a(v) = P(v) / P(parent)."""
    merged = [c for c, cand in enumerate(candidates) if cand.q is None]
    trie = Trie.build(-1, [candidates[c] for c in merged], [len(candidates[c].tokens) for c in merged])
    parent, depth = list(trie.parent), list(trie.depth)
    support = trie.support if len(merged) == len(candidates) else \
        [[(merged[i], pos) for i, pos in s] for s in trie.support]
    chains = _chains(rates)
    best = [chains[s[0][0]][s[0][1]] if len(s) == 1 else  # one candidate's node: most nodes of a long copy
            max((chains[c][pos] for c, pos in _unshadowed(s, candidates, shadowed)), default=1.0) for s in support]
    for c, cand in enumerate(candidates):
        if cand.q is None:
            continue
        node = 0
        for pos in range(len(cand.tokens)):
            parent.append(node)
            depth.append(depth[node] + 1)
            support.append([(c, pos)])
            best.append(chains[c][pos])
            node = len(parent) - 1
    accept = [best[v] / best[parent[v]] if v and best[parent[v]] > 0 else 1.0 for v in range(len(parent))]
    # Siblings exclude each other: the best estimated keeps its value, each next one at most
    # what the better ones leave (1 - their sum).
    left = [1.0] * len(parent)
    for v in _by_decreasing(accept):
        a = min(accept[v], left[parent[v]])
        left[parent[v]] -= a
        accept[v] = a
    prob = [1.0] * len(parent)
    for v in range(1, len(parent)):  # parents first
        prob[v] = prob[parent[v]] * accept[v]
    return parent, prob, depth, support


def _by_decreasing(values: Sequence[float]) -> List[int]:
    """Nodes 1 .. len(values) - 1 by decreasing value, the lower index first among equals (the
    sort is stable in reverse too)."""
    return sorted(range(1, len(values)), key=values.__getitem__, reverse=True)


def _chains(rates: Sequence[Sequence[float]]) -> List[List[float]]:
    """Each candidate's chain: P_c(i) = rates[c][0] * .. * rates[c][i]."""
    chains = []
    for r in rates:
        chain, p = [], 1.0
        for a in r:
            p *= a
            chain.append(p)
        chains.append(chain)
    return chains


def _unshadowed(support: Sequence[Tuple[int, int]], candidates: Sequence[Candidate],
                shadowed: Mapping[str, str]) -> Sequence[Tuple[int, int]]:
    """The (candidate, position) pairs behind a node whose estimates count (see ``_nodes``)."""
    names = {candidates[c].source for c, _ in support}
    if not any(shadowed.get(name) in names for name in names):
        return support
    return [(c, pos) for c, pos in support if shadowed.get(candidates[c].source) not in names]
