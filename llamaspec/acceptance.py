"""Which drafted tokens the target model accepts.

Notation of speculative sampling (Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding"; Chen et al. 2023, "Accelerating Large
Language Model Decoding with Speculative Sampling"): ``p`` is the target model's
distribution, ``q`` the draft's, ``x`` a drafted token. Accepting ``x ~ q`` with
probability ``min(1, p(x)/q(x))`` and otherwise drawing from
``norm(max(0, p - q))`` emits exactly a sample of ``p``.
"""

from __future__ import annotations

from typing import Callable, Sequence, Tuple

import numpy as np

from .sampling import Distribution, sample


def accept_greedy(target_tokens: np.ndarray, draft: np.ndarray) -> int:
    """Number of leading draft tokens equal to the target's argmax tokens."""
    n = min(len(target_tokens), len(draft))
    differ = np.flatnonzero(np.asarray(target_tokens[:n]) != np.asarray(draft[:n]))
    return int(differ[0]) if differ.size else n


def verify_greedy(target_tokens: np.ndarray, draft: np.ndarray) -> Tuple[int, int]:
    """Greedy verification: (number accepted, next token).

    ``target_tokens`` holds the target's argmax after each prefix, ``len(draft) + 1``
    of them; the next token is the target's own choice where the draft first
    disagrees, or the bonus token after a fully accepted draft.
    """
    n = accept_greedy(target_tokens[: len(draft)], draft)
    return n, int(target_tokens[n])


def align(p: Distribution, q: Distribution) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, p_dense, q_dense)``: both distributions over the union of their supports."""
    ids = np.union1d(p.ids, q.ids)
    return ids, _dense(p, ids), _dense(q, ids)


def _dense(d: Distribution, ids: np.ndarray) -> np.ndarray:
    out = np.zeros(len(ids))
    out[np.searchsorted(ids, d.ids)] = d.probs
    return out


def accept_probability(p_x: float, q_x: float) -> float:
    """``min(1, p(x) / q(x))``; ``q(x) > 0`` since ``x`` was drawn from ``q``."""
    return min(1.0, p_x / q_x)


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``norm(max(0, p - q))`` on aligned arrays: what to sample after a rejection.

    It is all zero only when ``p == q``, where no rejection can happen; ``p`` is then
    returned so the result is always a distribution.
    """
    r = np.maximum(p - q, 0.0)
    total = r.sum()
    return r / total if total > 0 else p


def verify_sampled(
    p_row: Callable[[int], Distribution],
    q_rows: Sequence[Distribution],
    draft: Sequence[int],
    rng: np.random.Generator,
) -> Tuple[int, int]:
    """Speculative sampling over one draft: (number accepted, next token).

    ``draft[i]`` was drawn from ``q_rows[i]``. ``p_row(i)`` is the target's
    distribution after the prefix plus ``draft[:i]``, for ``i`` in ``0..len(draft)``;
    it is a callable so the caller computes rows lazily: only rows up to the first
    rejection are asked for (the last row, the bonus token's, only when the whole
    draft is accepted). A caller holding a list passes ``rows.__getitem__``.

    At the first rejection, at ``i``, the next token is drawn from
    ``residual(p_i, q_i)``; if all ``k`` tokens are accepted it is drawn from ``p_k``.
    """
    for i, x in enumerate(draft):
        p, q = p_row(i), q_rows[i]
        if rng.random() < accept_probability(p.prob(x), q.prob(x)):
            continue
        ids, p_dense, q_dense = align(p, q)
        return i, sample(Distribution(ids, residual(p_dense, q_dense)), rng)
    return len(draft), sample(p_row(len(draft)), rng)


def verify_branches(choose: Callable[[int], int], branches: Sequence[Sequence[int]],
                    rows: Sequence[Sequence[int]]) -> Tuple[int, int, int]:
    """Verification of several candidate continuations at once: (branch, number accepted,
    next token).

    ``choose(r)`` is the target's token for output row ``r`` (its argmax, or a sample of p
    there); row 0 follows the accepted sequence, ``rows[b][j]`` follows ``branches[b][:j + 1]``.
    Walk down the branches that agree with the target so far: at each depth the target picks
    its token x from the row of one surviving branch (all survivors share that prefix, so the
    row is the same p), and only branches whose next token is x survive. Every emitted token
    is the target's own choice, so greedy output is plain greedy output and sampled output is
    distributed as p.
    """
    alive = list(range(len(branches)))
    best, depth, row = 0, 0, 0
    while True:
        x = choose(row)
        alive = [b for b in alive if len(branches[b]) > depth and branches[b][depth] == x]
        if not alive:
            return best, depth, x
        best = alive[0]
        row = rows[best][depth]
        depth += 1
