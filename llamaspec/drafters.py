"""Draft sources. Every strategy is a Drafter: it proposes tokens and learns what was accepted.

"No proposal" is always a valid answer: the engine then decodes one token plainly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Protocol, Sequence

import numpy as np

from ._llama import Context, Row
from .config import DraftConfig, SamplingConfig
from .draft_length import DraftLength
from .lookup import PromptLookup
from .sampling import Distribution, sample, transform

if TYPE_CHECKING:
    from .ngram_cache import NgramCaches


@dataclass
class Tree:
    """Candidates verified side by side in one decode, each on its own KV-cache sequence, and
    rows that only ride along (lookahead's window). The drafter lays out the batch:

    - ``rows``: every row after the pending token, ``(token, offset, sequence ids, logits?)``;
    - ``branches[b]`` lives on sequence ``seqs[b]``; ``outputs[b][j]`` is the output row
      (row 0: the pending token's) of ``branches[b][j]``;
    - ``on_decoded(logits)`` sees every output row right after the decode.
    """

    branches: List[List[int]]
    seqs: List[int]
    outputs: List[List[int]]
    rows: List[Row]
    on_decoded: Callable[[np.ndarray], None]


@dataclass
class Proposal:
    """Draft tokens, and for sampled drafts the distribution q each one was drawn from.

    ``q`` is None for deterministic drafts (q is a point mass on the drafted token).
    A ``tree`` replaces ``tokens`` when several candidates are verified at once.
    """

    tokens: List[int] = field(default_factory=list)
    q: Optional[List[Distribution]] = None
    tree: Optional[Tree] = None

    def __len__(self) -> int:
        """Drafted tokens the target verifies."""
        if self.tree is not None:
            return sum(len(b) for b in self.tree.branches)
        return len(self.tokens)

    @property
    def depth(self) -> int:
        """The most tokens this step can accept from the proposal."""
        if self.tree is not None:
            return max((len(b) for b in self.tree.branches), default=0)
        return len(self.tokens)


class Drafter(Protocol):
    name: str

    def contexts(self) -> List[Context]:
        """The llama.cpp contexts this drafter owns (the engine keeps their caches in step)."""

    def prefill(self, tokens: Sequence[int]) -> None:
        """A new prompt: ``tokens[-1]`` is pending, everything before it is accepted."""

    def propose(self, tokens: Sequence[int], max_len: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        """Up to ``max_len`` tokens to follow ``tokens``."""

    def accepted(self, tokens: Sequence[int], n_drafted: int, n_accepted: int) -> None:
        """The step is over: ``tokens`` is the accepted sequence, its last token pending."""

    def finish(self, tokens: Sequence[int]) -> None:
        """The generation is over; keep what should outlive it (a dynamic n-gram cache)."""

    def extra_stats(self) -> Dict[str, int]:
        """Counters of this strategy for the statistics (lookahead: pool size and hits)."""


class NoDrafter:
    """Plain decoding: never proposes."""

    name = "plain"

    def contexts(self) -> List[Context]:
        return []

    def prefill(self, tokens: Sequence[int]) -> None:
        pass

    def propose(self, tokens: Sequence[int], max_len: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        return Proposal()

    def accepted(self, tokens: Sequence[int], n_drafted: int, n_accepted: int) -> None:
        pass

    def finish(self, tokens: Sequence[int]) -> None:
        pass

    def extra_stats(self) -> Dict[str, int]:
        return {}


def top_probability(logits: np.ndarray) -> float:
    """max softmax(logits), without materialising the softmax."""
    m = logits.max()
    return float(1.0 / np.exp(logits - m).sum())


class DraftModelDrafter:
    """A small model with the target's vocabulary drafts autoregressively.

    Its cache holds exactly the accepted tokens but the pending one, like the target's.
    """

    name = "draft"

    def __init__(self, ctx: Context, config: DraftConfig) -> None:
        self.ctx = ctx
        self.config = config

    def contexts(self) -> List[Context]:
        return [self.ctx]

    def prefill(self, tokens: Sequence[int]) -> None:
        self.ctx.sync(tokens, len(tokens) - 1)

    def propose(self, tokens: Sequence[int], max_len: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        cfg = self.config
        max_len = min(max_len, cfg.draft_max, self.ctx.n_ctx - len(tokens))
        if max_len < max(1, cfg.draft_min):
            return Proposal()
        drafted: List[int] = []
        qs: List[Distribution] = []
        self.ctx.sync(tokens, len(tokens) - 1)
        self.ctx.eval(tokens[-1:], logits="last")
        while True:
            logits = self.ctx.logits_ith(-1)
            if sampling.greedy:
                x = int(logits.argmax())
                confidence = top_probability(logits) if cfg.draft_p_min > 0 else 1.0
            else:
                q = transform(logits, sampling)
                # Stop on q's top probability, not on the drawn token's: the decision must not
                # depend on x, or x would no longer be distributed as q.
                confidence = float(q.probs.max())
                x = sample(q, rng)
                qs.append(q)
            if confidence < cfg.draft_p_min:
                qs = qs[: len(drafted)]
                break
            drafted.append(x)
            if len(drafted) == max_len:
                break
            self.ctx.eval([x], logits="last")
        if len(drafted) < cfg.draft_min:
            return Proposal()
        return Proposal(drafted, None if sampling.greedy else qs)

    def accepted(self, tokens: Sequence[int], n_drafted: int, n_accepted: int) -> None:
        # Drop rejected drafts; after a fully accepted draft, catch up on its last token,
        # which the draft proposed but never evaluated.
        self.ctx.sync(tokens, len(tokens) - 1)

    def finish(self, tokens: Sequence[int]) -> None:
        pass

    def extra_stats(self) -> Dict[str, int]:
        return {}


class LookupDrafter:
    """Drafts copied from what the model has seen: the prompt, its own output, reference
    documents (prompt lookup) and, when given, n-gram caches. No model runs.

    The draft length is chosen per step by DraftLength from the match length, how recent
    drafts fared and the measured cost of verifying n tokens.
    """

    name = "lookup"

    def __init__(self, lookup: PromptLookup, length: DraftLength, k_max: int = 31,
                 caches: Optional[NgramCaches] = None) -> None:
        self.lookup, self.length, self.k_max, self.caches = lookup, length, k_max, caches
        self._match = 0
        self._candidate: List[int] = []

    def contexts(self) -> List[Context]:
        return []

    def prefill(self, tokens: Sequence[int]) -> None:
        if self.lookup.sync(tokens):
            self.length.reset()  # another text: the evidence about the old one does not apply
        if self.caches is not None:
            self.caches.follow(tokens)

    def propose(self, tokens: Sequence[int], max_len: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        self.lookup.sync(tokens)
        draft, self._match = self.lookup.find(min(max_len, self.k_max))
        if not draft and self.caches is not None:
            self.caches.follow(tokens)
            draft, self._match = self.caches.draft(tokens, min(max_len, self.k_max)), 0
        self._candidate = draft
        return Proposal(draft[: self.length.choose(len(draft), self._match)])

    def accepted(self, tokens: Sequence[int], n_drafted: int, n_accepted: int) -> None:
        if n_drafted:
            self.length.record(self._match, n_drafted, n_accepted)
        elif self._candidate:
            # Not worth verifying, but the step shows whether its first token was right:
            # free evidence, so a drafter that stopped drafting can learn to start again.
            self.length.record(self._match, 1, int(self._candidate[0] == tokens[-1]))
        self._candidate = []

    def finish(self, tokens: Sequence[int]) -> None:
        if self.caches is not None:
            self.caches.finish(tokens)

    def extra_stats(self) -> Dict[str, int]:
        return {}


class ChainDrafter:
    """Asks each drafter in turn and verifies the first proposal (lookup before a draft model)."""

    def __init__(self, *drafters: Drafter) -> None:
        self.drafters = drafters
        self.name = "+".join(d.name for d in drafters)
        self._used: Optional[Drafter] = None

    def contexts(self) -> List[Context]:
        return [ctx for d in self.drafters for ctx in d.contexts()]

    def prefill(self, tokens: Sequence[int]) -> None:
        for d in self.drafters:
            d.prefill(tokens)

    def propose(self, tokens: Sequence[int], max_len: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        for d in self.drafters:
            proposal = d.propose(tokens, max_len, sampling, rng)
            if proposal.tokens or proposal.tree is not None:
                self._used = d
                return proposal
        self._used = None
        return Proposal()

    def accepted(self, tokens: Sequence[int], n_drafted: int, n_accepted: int) -> None:
        for d in self.drafters:
            used = d is self._used
            d.accepted(tokens, n_drafted if used else 0, n_accepted if used else 0)

    def finish(self, tokens: Sequence[int]) -> None:
        for d in self.drafters:
            d.finish(tokens)

    def extra_stats(self) -> Dict[str, int]:
        return {k: v for d in self.drafters for k, v in d.extra_stats().items()}
