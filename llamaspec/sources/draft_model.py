"""A small model with the target's vocabulary as a draft source (speculative decoding).

It drafts autoregressively: one decode of the draft model per token. That costs time before
anything is known of the proposal, so it is an *expensive* source: the planner asks it only when
a draft is expected to pay, and tells it when to stop (``Budget.stop_below``: once the chance
that its whole path is accepted, from the acceptance model's estimate per confidence decile, no
longer repays one more draft decode).

Its cache follows the text lazily: while it is not asked it decodes nothing, and when it is
asked next it catches up on every accepted token it missed in one batch, together with the
pending token. Draft tokens the target accepted stay in its cache; the engine cuts the rest.
Several texts decoded together (lanes) draft on one context, lane i on sequence i
(``DraftSequences``); a lane catching up first takes over what another lane's sequence holds
of its text. The lanes of one step draft together, one decode a round for all of them
(``drafting``, run by rounds.py; the samples of one prompt read it once there).

Evidence: the decile ``round(10 * c)`` of c, the draft's top probability at that position
(with sampling, the top probability of q after the sampler's transform). It depends on q only,
never on the token drawn from it, so choosing tokens by it keeps speculative sampling exact.

Under a grammar (a request's JSON schema), the draft follows its own copy of the text's grammar
state: q is the draft's distribution over the tokens the grammar allows, and where the grammar
forces the next tokens the draft takes them (evidence ``FORCED``, a point mass for q) and reads
them in the decode it makes anyway, then drafts on after them::

    text so far (pending token last)   {"name": "Ada", "
    the grammar forces                 age                taken: evidence FORCED
    the draft drafts                      ": 36,          q over what the grammar allows
    draft decodes                      [catch-up, pending, age] [":] [ ] [3] [6]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..llama.binding import Context, KVSequence
from ..llama.vocab import check_compatible
from . import rounds
from .base import FORCED, FORCED_PRIOR, Budget, Candidate, Drafting, Evidence, Proposal, Read, Source
from .registry import Hooks, Option, Plugin, Resources
from ..config import ModelConfig, SamplingConfig, check
from ..constraints import Constraint
from ..sequences import common_prefix
from ..sampling import Distribution, sample, transform


NAME = "draft"


@dataclass(frozen=True)
class DraftConfig:
    """Draft-model speculation, with llama.cpp's names.

    The draft proposes up to ``draft_max`` tokens; it stops earlier when the planner's
    estimate says one more token no longer pays, and when its own probability for the next
    token falls below ``draft_p_min`` (llama.cpp's rule; llama.cpp's default is 0.75, here 0:
    the planner decides). A proposal shorter than ``draft_min`` is dropped.
    """

    draft_max: int = 16
    draft_min: int = 0
    draft_p_min: float = 0.0

    def __post_init__(self) -> None:
        check(self.draft_max >= 1, f"draft-max must be >= 1, got {self.draft_max}")
        check(0 <= self.draft_min <= self.draft_max,
              f"draft-min must be in [0, draft-max={self.draft_max}], got {self.draft_min}")
        check(0 <= self.draft_p_min <= 1, f"draft-p-min must be in [0, 1], got {self.draft_p_min}")


def top_probability(logits: np.ndarray) -> float:
    """max softmax(logits), without materialising the softmax."""
    m = logits.max()
    return float(1.0 / np.exp(logits - m).sum())


class DraftModelSource(Source):
    """Draft tokens from a small model, each with the q it was drawn from when sampling."""

    name = NAME
    expensive = True

    def __init__(self, drafts: "DraftSequences", lane: int, config: DraftConfig,
                 constraint: Optional[Constraint] = None) -> None:
        self.drafts = drafts
        self.ctx = drafts.sequence(lane)
        self.config = config
        self.max_len = config.draft_max
        self.constraint = constraint

    def lag(self, tokens: Sequence[int]) -> int:
        """Accepted tokens (the pending one aside) the draft's cache does not hold (nor another
        lane's, to take over)."""
        return len(tokens) - 1 - self.drafts.held(tokens[:-1])

    def propose(self, tokens: Sequence[int], budget: Budget, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        return rounds.alone(self.drafting(tokens, budget, sampling, rng))

    def drafting(self, tokens: Sequence[int], budget: Budget, sampling: SamplingConfig,
                 rng: np.random.Generator) -> Drafting:
        cfg = self.config
        max_len = min(budget.max_len, cfg.draft_max, self.ctx.n_ctx - len(tokens))
        if max_len < max(1, cfg.draft_min):
            return Proposal()
        grammar = self.constraint.fork() if self.constraint is not None else None
        keep = self.drafts.follow(self.ctx, tokens[:-1])
        read = list(tokens[keep:])  # the catch-up and the pending token: one decode
        drafted: List[int] = []
        keys: List[Evidence] = []
        qs: List[Distribution] = []
        path = 1.0  # estimated chance that every token drafted so far is accepted
        while True:
            # what the grammar forces next is taken as it is and read in the same decode
            forced = grammar.forced()[:max_len - len(drafted)] if grammar is not None else []
            for x in forced:
                grammar.advance(x)
                path *= budget.rates.get(FORCED, FORCED_PRIOR)
            drafted += forced
            keys += [FORCED] * len(forced)
            qs += [Distribution.point(x) for x in forced]
            if len(drafted) == max_len:
                break
            logits = yield Read(self.ctx, tuple(read + forced))
            if grammar is not None:
                logits = grammar.mask(logits)  # q is the draft's over what the grammar allows
            if sampling.greedy:
                q = None
                confidence = top_probability(logits)
            else:
                q = transform(logits, sampling)
                confidence = float(q.probs.max())
            decile = int(round(10 * confidence))
            # decided before the token is drawn: the token then stays distributed as q
            path *= budget.rates.get(decile, confidence)
            if confidence < cfg.draft_p_min or path < budget.stop_below:
                break
            x = int(logits.argmax()) if q is None else sample(q, rng)
            drafted.append(x)
            keys.append(decile)
            if q is not None:
                qs.append(q)
            if grammar is not None:
                grammar.advance(x)
            if len(drafted) == max_len:
                break
            read = [x]
        if not drafted or len(drafted) < cfg.draft_min:
            return Proposal()
        return Proposal((Candidate(tuple(drafted), self.name, tuple(keys), None if sampling.greedy else tuple(qs)),))

    def contexts(self) -> List[KVSequence]:
        return [self.ctx]


class DraftSequences:
    """A draft model's context, lane i drafting on its sequence i (one text: sequence 0)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._sequences: Dict[int, KVSequence] = {}

    def sequence(self, lane: int) -> KVSequence:
        """Lane ``lane``'s sequence (the same object every time: its bookkeeping is one)."""
        if lane not in self._sequences:
            self._sequences[lane] = KVSequence(self.ctx, lane)
        return self._sequences[lane]

    def held(self, text: Sequence[int]) -> int:
        """How much of ``text`` some sequence holds."""
        return max((common_prefix(s.tokens, text) for s in self._sequences.values()), default=0)

    def follow(self, seq: KVSequence, text: Sequence[int]) -> int:
        """Cut ``seq`` to what it holds of ``text``, then take over more of it from another lane's
        sequence where one holds more; return how much of ``text`` it holds now."""
        seq.truncate(common_prefix(seq.tokens, text))
        best, most = None, len(seq.tokens)
        for other in self._sequences.values():
            n = common_prefix(other.tokens, text)
            if other is not seq and n > most:
                best, most = other, n
        if best is not None:
            seq.share(best, most)
        return len(seq.tokens)


class DraftModel:
    """What the draft source loads: the draft model's context (lane i drafting on its sequence
    i: ``sequences``) and what a decode on it costs (``curve``, in the target's single-token
    decodes: a planning.costs.CostCurve)."""

    def __init__(self, ctx: Context, curve: Any) -> None:
        self.ctx, self.curve = ctx, curve
        self.sequences = DraftSequences(ctx)

    def restart(self) -> None:
        """An empty cache, and sequences that hold nothing."""
        self.ctx.clear()
        self.sequences = DraftSequences(self.ctx)

    def for_lanes(self, n: int) -> "DraftModel":
        """A context of its own for ``n`` texts decoded together, each with this one's size."""
        c = self.ctx
        return DraftModel(c.model.context(c.n_ctx * n, c.threads, c.n_batch, n), self.curve)

    def close(self) -> None:
        self.ctx.close()


class DraftHooks(Hooks):
    loads = "a draft model (-md)"

    def available(self, config: DraftConfig, draft: Optional[ModelConfig]) -> bool:
        return draft is not None

    def load(self, config: DraftConfig, resources: Resources, checked: None) -> DraftModel:
        """The draft model (-md), checked against the target's vocabulary, a sequence per lane,
        and its cost curve (measured once)."""
        given = resources.draft
        assert given is not None  # available() said so
        model = resources.model(given)
        check_compatible(resources.target, model)
        ctx = resources.context(model, given, resources.lanes)
        return DraftModel(ctx, resources.curve(ctx))


PLUGIN = Plugin(
    name=NAME, describe="the draft model alone", config=DraftConfig(),
    options=(Option("draft_max", "draft_max", "Most tokens the draft model proposes per step.", flag="--draft-max"),
             Option("draft_min", "draft_min", "Shorter draft-model proposals are not verified.", flag="--draft-min"),
             Option("draft_p_min", "draft_p_min", "The draft model also stops when its top probability falls below "
                    "this (llama.cpp: 0.75; 0 leaves it to the planner).", flag="--draft-p-min")),
    hooks=DraftHooks(),
    build=lambda setup, text: DraftModelSource(setup.loaded.sequences, text.lane, setup.config, text.constraint),
    priors={**{decile: min(0.95, 0.05 + 0.09 * decile) for decile in range(11)}, FORCED: FORCED_PRIOR}, overall=0.6)
