"""Replay a recorded answer through the sources and the planner, with no model: what would
speculation have verified, accepted and cost on this machine? And the copy-oracle bound.

The answer is taken as the target's greedy output. Each step plans exactly as a real run does
(``Speculator.plan``), then follows the trie as far as the answer agrees and emits the answer's
next token, which is what greedy verification would do; the step is charged the planner's cost
of its batch. The Jacobi window needs the model, so it never rides in a replay; everything else
(prompt lookup, references, n-gram caches, the lookahead pool) behaves as in a real run.

The copy oracle knows the answer and may verify, at the measured cost, any run of upcoming
tokens that occurs in the prompt or in the text generated so far; dynamic programming over the
answer picks the runs that minimise the total cost. No source that copies can beat it.

In both, the first token comes from the prompt's decode, as in a real run, and costs nothing;
speed-ups are over plain decoding, which costs one unit per further token.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, DefaultDict, List, Mapping, Optional, Sequence

import numpy as np

from ..engine.verification import walk_greedy
from ..planning.acceptance_model import AcceptanceModel
from ..sources.base import Candidate, Outcome
from ..config import SamplingConfig
from ..planning.costs import N_MAX, CostCurve, CostModel
from ..planning.shape import Shape, decode
from ..sources import default_registry
from ..planning.planner import MAX_LEAVES, Limits, Planner
from ..sequences import common_prefix
from ..planning.speculator import Speculator
from ..engine.stats import DraftCounts

if TYPE_CHECKING:
    from ..engine.generation import Vocabulary


@dataclass
class ReplayStats(DraftCounts):
    """What speculation would have done on a known answer (llama-lookup-stats' figures)."""

    n_tokens: int = 0  # tokens emitted by target decodes (the prompt's first token aside)
    n_steps: int = 0  # target decodes
    n_asked: int = 0  # of which, steps that asked the sources
    cost: float = 0.0  # in single-token decodes

    @property
    def speedup(self) -> float:
        """Predicted decode speed over plain decoding (which costs one unit per token)."""
        return self.n_tokens / self.cost if self.cost else 1.0


def speculator(curve: CostCurve, sources: Sequence[str] = ("lookup", "lookahead"),
               vocab: Optional["Vocabulary"] = None, model: Optional[AcceptanceModel] = None,
               loaded: Optional[Mapping[str, Any]] = None) -> Speculator:
    """The sources a replay can run (``sources`` of lookup and lookahead, and the heads given
    what their plugin loaded in ``loaded``; lookup compares text when given the ``vocab``) with a
    fresh acceptance model (or ``model``) and a planner on ``curve``; candidates end at the
    vocab's end-of-generation tokens."""
    registry = default_registry()
    setups = registry.setups(piece=vocab.piece if vocab is not None else None)
    setups = {n: replace(s, loaded=(loaded or {}).get(n)) for n, s in setups.items()}
    built = registry.build(frozenset(sources), setups)
    return Speculator(built, model if model is not None else AcceptanceModel(), Planner(CostModel(curve)),
                      vocab.eog_tokens if vocab is not None else frozenset())


def replay(prompt: Sequence[int], answer: Sequence[int], speculator: Speculator,
           max_rows: int = 512, max_leaves: int = MAX_LEAVES, perfect: bool = False,
           ask_cost: float = 0.0, hidden: Optional[np.ndarray] = None, logits: Optional[np.ndarray] = None,
           timed: bool = False) -> ReplayStats:
    """Run ``speculator`` over ``answer`` as if the target had generated it greedily after
    ``prompt``; charge each step the planner's cost of verifying its batch, and each step that
    asked the sources ``ask_cost`` more (llamaspec's own time for asking and planning, in
    single-token decodes; the speculator's gate learns it as measured).

    ``perfect``: plan with acceptance estimates that know the answer (1 for a candidate token
    on the answer's path, 0 elsewhere) instead of the acceptance model's. What the planner then
    reaches, against the copy oracle's bound, splits the gap to the bound in two: what better
    estimates could win, and what the candidates and the per-step planning leave.

    ``hidden[j]``: the target's hidden state at the row that chose ``answer[j]`` (recorded with
    the answer: training.data.answer), for the sources that read them (draft heads), and
    ``logits[j]`` that row's logits, where given.

    ``timed``: charge each step, in place of ``ask_cost``, the time its planning took here (the
    speculator's curve must have its milliseconds): what this host's own time would add to the
    curve's decodes, the sources' own gates and the speculator's acting on it as they would."""
    stats = ReplayStats()
    if not answer:
        return stats
    greedy = SamplingConfig(temperature=0)
    rng = np.random.default_rng(0)
    tokens = [*prompt, answer[0]]
    pos = 1
    costs = speculator.costs
    shape = Shape(costs.switch)  # the decodes' shapes, as the engine keeps them (planning/shape.py)
    while pos < len(answer):
        limits = Limits(max_depth=len(answer) - pos - 1, max_rows=max_rows, room=0, max_leaves=max_leaves,
                        length=len(tokens), shape=shape.kept, switch=shape.switch)
        t0 = time.perf_counter()
        plan = speculator.plan(tokens, limits, greedy, rng, estimate=_knows(answer, pos) if perfect else None)
        planned = time.perf_counter() - t0
        trie = plan.trie
        path, token = walk_greedy(trie.children, lambda v, base=pos: int(answer[base + trie.depth[v]]))
        emitted = [trie.token[v] for v in path] + [token]
        tokens += emitted
        pos += len(emitted)
        # asking's time as the speculator learns it, at the text's length: ask_cost decodes there
        ask_seconds = planned if timed else ask_cost * speculator.costs.ms(CostModel.TARGET, 1, len(tokens)) / 1000
        path_sources = tuple(trie.sources(v, plan.candidates) for v in path)
        speculator.learn(Outcome(tokens=tokens, candidates=plan.candidates, verified=plan.lengths,
                                 emitted=tuple(emitted), path_sources=path_sources, cost=plan.choice.cost, estimated=plan.choice.estimated,
                                 seconds=ask_seconds if plan.asked else 0.0,
                                 hidden=hidden[pos - 1] if hidden is not None else None,
                                 logits=logits[pos - 1] if logits is not None else None))
        stats.n_tokens += len(emitted)
        stats.n_steps += 1
        stats.n_asked += plan.asked
        stats.count(len(trie) - 1, trie.drafted(plan.candidates), path_sources)
        # what the decode costs: its rows (padded as the engine pads them), a change of shape in full
        rows = len(trie) + (len(plan.window.rows) if plan.window is not None else 0)
        length = len(tokens) - len(emitted)
        def verify(n: int) -> float:
            return costs.verify(n, length)
        decoded, _ = decode(rows, shape.kept, shape.switch, verify)
        changed = costs.switch if shape.rows and decoded != shape.rows else 0.0
        host = costs.units(planned, length) if timed else (ask_cost if plan.asked else 0.0)
        stats.cost += verify(decoded) + changed + host
        shape.decoded(decoded, len(path), verify, plan.choice.forgone)
    return stats


def _knows(answer: Sequence[int], pos: int) -> Callable[[Candidate], List[float]]:
    """Acceptance estimates of a step at ``answer[pos]`` that know the answer."""
    def estimate(cand: Candidate) -> List[float]:
        k = common_prefix(cand.tokens, answer[pos:])
        return [1.0] * k + [0.0] * (len(cand.tokens) - k)
    return estimate


def copy_oracle(prompt: Sequence[int], answer: Sequence[int], cost: Callable[[int, int], float],
                switch: float = 0.0, others: Sequence[Sequence[int]] = ()) -> float:
    """The best speed-up over plain decoding that verifying copied runs can give on ``answer``:
    each step may verify the next m answer tokens when they occur, in a row, in the prompt,
    the answer so far or one of the ``others`` (references, the prompt's escaped view), at
    ``cost(1 + m, length of the text)``, and emits them plus one more token. With a ``switch``
    cost (a GPU's shapes: planning/shape.py), a decode may also be padded to the last one's
    rows, and one of another row count costs ``switch`` more."""
    n_prompt, n = len(prompt), len(answer)
    longest = [0] * (n + 1)  # longest run answer[i:] that occurs in what may be copied at i
    for k, hay in enumerate([[*prompt, *answer], *others]):
        where: DefaultDict[int, List[int]] = defaultdict(list)
        for j, t in enumerate(hay):
            where[t].append(j)
        for i in range(1, n):
            end = n_prompt + i if k == 0 else len(hay)  # the answer only up to what is emitted
            best = longest[i]
            for j in where[answer[i]]:
                if j >= end:
                    break
                m = 0
                while i + m < n and j + m < end and hay[j + m] == answer[i + m]:
                    m += 1
                best = max(best, m)
            longest[i] = best
    if switch <= 0:
        total = [0.0] * (n + 1)  # cost of emitting answer[i:] with answer[:i] emitted
        for i in range(n - 1, 0, -1):
            total[i] = min(cost(1 + m, n_prompt + i) + total[min(i + m + 1, n)]
                           for m in range(min(longest[i], n - i) + 1))
        return (n - 1) / total[1] if n > 1 else 1.0
    # by the last decode's rows too (0: none yet, no switch), of at most N_MAX rows as the planner's
    widest = min(1 + max(longest), N_MAX)
    shaped = [[0.0] * (widest + 1) for _ in range(n + 1)]
    for i in range(n - 1, 0, -1):
        for last in range(widest + 1):
            options = []
            for m in range(min(longest[i], n - i, widest - 1) + 1):
                after = shaped[min(i + m + 1, n)]
                for rows in {1 + m, last} if last >= 1 + m else {1 + m}:
                    options.append(cost(rows, n_prompt + i) + (switch if last and rows != last else 0.0) + after[rows])
            shaped[i][last] = min(options)
    return (n - 1) / shaped[1][0] if n > 1 else 1.0
