"""How closely a candidate model follows a reference, position by position: pure numpy.

At each scored position both models read the same text; ``p`` is the reference's distribution
of the next token, ``q`` the candidate's (notation of speculative sampling: p target, q draft).

- agree: argmax p == argmax q, the greedy acceptance of a drafted token;
- accept: sum over x of min(p'(x), q'(x)), where p' and q' are p and q after the sampler's
  transform (top-k, top-p, min-p, temperature): the probability that speculative sampling
  accepts q's token, min(1, p'/q') averaged over x ~ q'. Greedy, it equals agree;
- kl: KL(p || q) = sum over x of p(x) (log p(x) - log q(x)), at temperature 1, whole vocabulary;
- nll_p, nll_q: -log p(next), -log q(next), whose mean gives each model's perplexity.

From the per-position acceptance a_t follow the tokens a step yields with a chain draft of k
tokens started at t: 1 + sum_{j=1..k} prod_{i<j} a_{t+i} (the accepted run, then the target's
own token), and with a cost model, the speed-up of drafting k tokens per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..engine.verification import align
from ..config import SamplingConfig
from ..planning.costs import CostModel
from ..sampling import transform
from ..sources import default_registry

ROWS = 32  # rows converted to float64 at a time (a row of a 150k vocabulary: 1.2 MB)

# the source a draft model drafts as (its cost curve's name in a CostModel)
DRAFT = default_registry().on_draft_model()[0]


@dataclass(frozen=True)
class Positions:
    """Per-position measures of one candidate against the reference (see the module)."""

    agree: np.ndarray
    accept: np.ndarray
    kl: np.ndarray
    nll_p: np.ndarray
    nll_q: np.ndarray

    @staticmethod
    def concat(parts: Sequence["Positions"]) -> "Positions":
        return Positions(*(np.concatenate([getattr(p, name) for p in parts])
                           for name in ("agree", "accept", "kl", "nll_p", "nll_q")))


def compare(p_logits: np.ndarray, q_logits: np.ndarray, next_tokens: Sequence[int],
            sampling: SamplingConfig) -> Positions:
    """The measures of rows of logits (one row per position; the vocabularies may differ in
    size by a few padding tokens: the shorter one is compared)."""
    n_vocab = min(p_logits.shape[1], q_logits.shape[1])
    parts = []
    for start in range(0, len(p_logits), ROWS):
        p = p_logits[start:start + ROWS, :n_vocab].astype(np.float64)
        q = q_logits[start:start + ROWS, :n_vocab].astype(np.float64)
        nxt = np.asarray(next_tokens[start:start + ROWS])
        log_p, log_q = _log_softmax(p), _log_softmax(q)
        rows = np.arange(len(p))
        agree = p.argmax(axis=1) == q.argmax(axis=1)
        accept = agree.astype(np.float64) if sampling.greedy else np.array(
            [_overlap(p_row, q_row, sampling) for p_row, q_row in zip(p, q)])
        parts.append(Positions(agree, accept, (np.exp(log_p) * (log_p - log_q)).sum(axis=1),
                               -log_p[rows, nxt], -log_q[rows, nxt]))
    return Positions.concat(parts)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def _overlap(p_row: np.ndarray, q_row: np.ndarray, sampling: SamplingConfig) -> float:
    """sum over x of min(p'(x), q'(x)) after the sampler's transform."""
    _, p, q = align(transform(p_row, sampling), transform(q_row, sampling))
    return float(np.minimum(p, q).sum())


def full_runs(accepts: Sequence[np.ndarray], k_max: int = 16) -> np.ndarray:
    """``out[k - 1]``: the probability that a chain draft's first k tokens are all accepted,
    prod_{i<k} a_{t+i}, averaged over every start position t of every stream (``accepts``: each
    stream's per-position acceptance; a draft does not run past its stream's end)."""
    total, starts = np.zeros(k_max), 0
    for a in accepts:
        a = np.asarray(a, dtype=np.float64)
        run = np.ones(len(a))
        for k in range(1, k_max + 1):
            ahead = np.zeros(len(a))
            ahead[:len(a) - k + 1] = a[k - 1:]  # a_{t+k-1}, 0 past the end
            run = run * ahead
            total[k - 1] += run.sum()
        starts += len(a)
    return total / max(starts, 1)


def tokens_per_step(full: np.ndarray) -> np.ndarray:
    """``out[k - 1]``: the mean tokens a step yields with a chain draft of k tokens: the accepted
    run (sum over j <= k of the chance that the first j are accepted), then the target's own."""
    return 1 + np.cumsum(full)


def speedups(full: np.ndarray, costs: CostModel) -> np.ndarray:
    """``out[k - 1]``: tokens per unit of time drafting k tokens every step over plain decoding's
    (``costs`` has the candidate's curve as the draft model's).
    A step costs a target decode of k + 1 rows and the draft's k decodes. The first of these
    reads the target's own token of the step before and, when that step accepted its whole draft,
    the draft's last token too (which the draft proposed but never read)."""
    per_step = tokens_per_step(full)
    return np.array([per_step[k - 1] / (costs.verify(k + 1) + (1 - full[k - 1]) * costs.proposing(DRAFT, k, lag=0)
                                        + full[k - 1] * costs.proposing(DRAFT, k, lag=1))
                     for k in range(1, len(full) + 1)])
