"""The verify loop: one llama_decode of the target per step, one place that rolls caches back.

State between steps: ``tokens`` is the text. Its last token is *pending*: it was just chosen
and no cache holds it yet. The target's sequence 0 holds exactly ``tokens[:-1]`` and no other
sequence holds anything; a draft model's cache holds a prefix of ``tokens[:-1]``.

The prompt is evaluated whole, in batches of n_batch, as llama.cpp's programs do, and the
first token comes from its last row. Then one step::

    plan = speculator.plan(tokens)                 # the sources' candidates, merged into a trie
    target.decode([tokens[-1], trie rows.., rider rows..])    # ONE llama_decode
    walk the trie: at each node the target's own choice (greedy: argmax; sampling: exact
        speculative sampling), down the child holding it; the accepted path, then one token
        of the target's (the correction, or the bonus token after a whole path)
    keep the accepted path's cells in sequence 0, drop every other sequence
    roll every cache back to tokens[:-1]           # Engine._rewind, the only place that trims
    speculator.learn(outcome)                      # one outcome, everyone learns

A linear draft is a one-branch trie; a plan with no candidate is a plain step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..llama.binding import Context
from .acceptance import walk_greedy, walk_sampled
from ..sources.base import Outcome
from ..config import SamplingConfig
from ..errors import PromptError
from ..sequences import common_prefix
from ..planning.costs import CostModel
from ..planning.planner import Limits
from ..sampling import Uniforms, sample_at, transform
from ..planning.speculator import Plan, Speculator
from ..planning.trie import Trie


@dataclass(frozen=True)
class Step:
    """One target decode (or the prompt's, for the first token).

    ``tokens``: the new tokens, accepted candidate tokens first, then the target's own.
    ``drafted``: candidate tokens verified, per source (a token proposed by two sources counts
    for both); ``path_sources[i]``: the sources that proposed accepted token i; ``depth``: the
    deepest verified candidate token; ``t_draft``: time an expensive source spent drafting.
    """

    tokens: List[int]
    n_drafted: int = 0
    drafted: Dict[str, int] = field(default_factory=dict)
    path_sources: Tuple[Tuple[str, ...], ...] = ()
    depth: int = 0
    t_plan: float = 0.0
    t_draft: float = 0.0
    idle: Dict[str, str] = field(default_factory=dict)

    @property
    def n_accepted(self) -> int:
        return len(self.tokens) - 1


class Engine:
    """A target context and a speculator, driven step by step."""

    def __init__(self, target: Context, speculator: Speculator, max_leaves: int = 8) -> None:
        self.target = target
        self.speculator = speculator
        self.max_leaves = max_leaves
        self.tokens: List[int] = []
        self._first: Optional[np.ndarray] = None  # the prompt's last row, until the first token is chosen

    def contexts(self) -> List[Context]:
        return [self.target, *self.speculator.contexts()]

    def prefill(self, prompt: Sequence[int]) -> int:
        """Evaluate the whole prompt, reusing whatever prefix the target's cache holds; return
        how many tokens were evaluated. The first step chooses the first token from the last row."""
        if not prompt:
            raise PromptError("the prompt is empty")
        n_ctx = min(ctx.n_ctx for ctx in self.contexts())
        if len(prompt) >= n_ctx:
            raise PromptError(f"the prompt has {len(prompt)} tokens but the context holds {n_ctx}; "
                              f"raise the context size (-c) or shorten the prompt")
        if self.tokens and common_prefix(self.tokens, prompt) < len(self.tokens) - 1:
            self.speculator.new_text()
        self._first = None
        self.tokens = list(prompt)
        self._rewind(len(self.tokens))  # every cache: a prefix of the prompt but its last token
        keep = len(self.target.tokens)
        try:
            self.target.eval(self.tokens[keep:], logits="last")
            self._first = self.target.logits_ith(-1).copy()
        except BaseException:
            self._rewind(len(self.tokens))
            raise
        return len(prompt) - keep

    def steps(self, sampling: SamplingConfig, rng: np.random.Generator, max_new: int,
              uniforms: Optional[Uniforms] = None) -> Iterator[Step]:
        """Yield a Step after each target decode (the first: the prompt's).

        With sampling, ``uniforms`` gives the number each position's token is drawn with (by
        default numbers of ``rng``); ``rng`` decides speculative acceptance tests.
        Stops by itself only when the context is full or ``max_new`` tokens were emitted; the
        caller stops it earlier by closing the generator (the caches stay consistent).
        """
        uniform = uniforms or (lambda position: float(rng.random()))
        n_ctx = self.target.n_ctx
        emitted = 0
        try:
            if self._first is not None and max_new > 0:
                # the cache holds the whole prompt: the first token comes from its last row
                row, self._first = self._first, None
                first = int(row.argmax()) if sampling.greedy else sample_at(transform(row, sampling),
                                                                                uniform(len(self.tokens)))
                self.tokens.append(first)
                emitted = 1
                yield Step([first])
            while emitted < max_new and len(self.tokens) <= n_ctx:
                step = self._step(sampling, rng, max_new - emitted, uniform)
                emitted += len(step.tokens)
                yield step
        finally:
            self._first = None  # unused, the prompt's last token is pending again
            self._rewind(len(self.tokens))

    def _step(self, sampling: SamplingConfig, rng: np.random.Generator, left: int,
              uniform: Callable[[int], float]) -> Step:
        t0 = time.perf_counter()
        n = len(self.tokens)
        room = self.target.n_ctx - n
        limits = Limits(max_depth=min(left - 1, room), max_rows=min(self.target.n_batch, room + 1),
                        room=room, max_leaves=self.max_leaves)
        plan = self.speculator.plan(self.tokens, limits, sampling, rng)
        t_plan = time.perf_counter() - t0
        path, token, rider_tokens = self._verify(plan, sampling, rng, lambda depth: uniform(n + depth))
        accepted = [plan.trie.token[v] for v in path]
        self.tokens += accepted + [token]
        self._rewind(len(self.tokens))
        outcome, step = settle(plan, path, token, rider_tokens, self.tokens, t_plan, plan.choice.cost)
        self.speculator.learn(outcome)
        return step

    def _verify(self, plan: Plan, sampling: SamplingConfig, rng: np.random.Generator,
                uniform: Callable[[int], float]) -> Tuple[List[int], int, Optional[Tuple[int, ...]]]:
        """One decode of the pending token, the trie and the rider; walk the trie. Returns
        (accepted nodes, the target's next token, the target's greedy tokens at the rider's rows)."""
        trie = plan.trie
        layout = trie.layout()
        rows = list(layout.rows)
        n_seqs = layout.n_seqs
        if plan.rider is not None:
            rows += plan.rider.after(n_seqs)
            n_seqs += plan.rider.n_seqs
        busy = self.target.t_llama
        n_out = self.target.eval_tree(self.tokens[-1], rows, n_seqs)
        self.speculator.costs.observe(CostModel.TARGET, 1 + len(rows), self.target.t_llama - busy, len(self.tokens))
        logits = self.target.logits(n_out)
        path, token = walk(trie, logits, sampling, rng, uniform)
        rider_tokens = None
        if plan.rider is not None:
            rider_tokens = tuple(int(t) for t in logits[len(trie):n_out].argmax(axis=1))
        self.target.keep_path(layout.seq[path[-1]] if path else 0, [trie.token[v] for v in path], n_seqs)
        return path, token, rider_tokens

    def adopt(self, tokens: Sequence[int]) -> None:
        """Go on with ``tokens`` as the text: the target's sequence 0 holds a prefix of it (a
        BatchEngine decoded on the context meanwhile); whatever else it holds is dropped."""
        self._first = None
        self.tokens = list(tokens)
        self._rewind(len(self.tokens))

    def rewind(self, n: int) -> None:
        """Keep the first ``n`` tokens of the text (the n-th becomes the pending one)."""
        del self.tokens[n:]
        self._rewind(n)

    def _rewind(self, n: int) -> None:
        # Every cache must hold a prefix of tokens[:n - 1]; whatever lies past it is dropped here.
        text = self.tokens[:max(n - 1, 0)]
        for ctx in self.contexts():
            ctx.truncate(common_prefix(ctx.tokens, text))

    def restart(self, speculator: Speculator) -> None:
        """Empty every cache and go on with ``speculator`` (fresh sources)."""
        self.rewind(0)
        self.speculator = speculator
        self.rewind(0)

    def finish(self) -> None:
        self.speculator.finish(self.tokens)


def walk(trie: Trie, logits: np.ndarray, sampling: SamplingConfig, rng: np.random.Generator,
         uniform: Callable[[int], float]) -> Tuple[List[int], int]:
    """The target's choice down the trie, ``logits[v]`` its row after node v's path:
    (accepted nodes, the target's next token)."""
    if sampling.greedy:
        return walk_greedy(trie.children, lambda v: int(logits[v].argmax()))
    return walk_sampled(trie.children, trie.q, lambda v: transform(logits[v], sampling), rng, uniform)


def settle(plan: Plan, path: Sequence[int], token: int, rider_tokens: Optional[Tuple[int, ...]],
           tokens: Sequence[int], t_plan: float, cost: float) -> Tuple[Outcome, Step]:
    """What a verified step showed (for learning) and what it emitted (for the caller).
    ``tokens``: the text after the step; ``cost``: the step's cost, in single-token decodes."""
    trie, candidates = plan.trie, plan.candidates
    accepted = [trie.token[v] for v in path]
    path_sources = tuple(trie.sources(v, candidates) for v in path)
    outcome = Outcome(tokens, candidates, plan.lengths, tuple(accepted + [token]), path_sources, rider_tokens, cost,
                      plan.choice.estimated)
    drafted: Dict[str, int] = {}
    for v in range(1, len(trie)):
        for name in trie.sources(v, candidates):
            drafted[name] = drafted.get(name, 0) + 1
    step = Step(accepted + [token], len(trie) - 1, drafted, path_sources, max(trie.depth), t_plan, plan.t_draft,
                plan.idle)
    return outcome, step
