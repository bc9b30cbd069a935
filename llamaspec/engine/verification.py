"""Which drafted tokens the target model accepts.

Notation of speculative sampling (Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding"; Chen et al. 2023, "Accelerating Large
Language Model Decoding with Speculative Sampling"): ``p`` is the target model's
distribution, ``q`` the draft's, ``x`` a drafted token. Accepting ``x ~ q`` with
probability ``min(1, p(x)/q(x))`` and otherwise drawing from
``norm(max(0, p - q))`` emits exactly a sample of ``p``.
"""

from __future__ import annotations

from typing import Callable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..sampling import Distribution, sample, sample_at


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


def walk_greedy(children: Sequence[Mapping[int, int]], argmax: Callable[[int], int]) -> Tuple[List[int], int]:
    """Greedy verification of a token trie: (accepted nodes, next token).

    ``children[v]`` maps a token to the child node of v; ``argmax(v)`` is the target's greedy
    token after the path to v (node 0 is the root, the pending token). From the root, the
    target's own token is taken at every node; while a child carries that token the walk goes
    on. The next token is the target's choice where no candidate agrees (the correction), or
    after a whole accepted path (the bonus token). A linear draft is a one-branch trie.
    """
    path: List[int] = []
    node = 0
    while True:
        x = argmax(node)
        child = children[node].get(x)
        if child is None:
            return path, x
        path.append(child)
        node = child


def walk_sampled(children: Sequence[Mapping[int, int]], q: Sequence[Optional[Distribution]],
                 p: Callable[[int], Distribution], rng: np.random.Generator,
                 uniform: Optional[Callable[[int], float]] = None) -> Tuple[List[int], int]:
    """Sampled verification of a token trie: (accepted nodes, next token), every emitted token
    distributed as the target's p.

    ``q[c]`` is set when child c was drawn from a draft model's q (at most one such child per
    node); other children are deterministic candidates. ``p(v)`` is the target's distribution
    after the path to v, asked for only at nodes the walk reaches. At node v with p = p(v):

    - a sampled child x ~ q is accepted with probability min(1, p(x) / q(x)) (speculative
      sampling); on rejection the token is drawn from the residual norm(max(0, p - q));
    - with no sampled child the token is drawn from p itself;
    - either way, when the drawn token is a deterministic child the walk goes on there
      (sample-and-match: the child's row is p after that token, however it was chosen).

    A rejected sampled child cannot be drawn from the residual (where p(x) > q(x) it is always
    accepted), so each emitted token is exactly a sample of p given the tokens before it.
    ``uniform(depth)``, when given, is the number each draw at that depth uses (the acceptance
    tests still use ``rng``), so draws do not depend on how many numbers earlier steps took.
    """
    path: List[int] = []
    node = 0
    while True:
        dist = p(node)
        drafted = [c for c in children[node].values() if q[c] is not None]
        if drafted:
            (c,) = drafted
            qc = q[c]
            x = _token_of(children[node], c)
            if rng.random() < accept_probability(dist.prob(x), qc.prob(x)):
                path.append(c)
                node = c
                continue
            ids, p_dense, q_dense = align(dist, qc)
            dist = Distribution(ids, residual(p_dense, q_dense))
        x = sample_at(dist, uniform(len(path))) if uniform is not None else sample(dist, rng)
        child = children[node].get(x)
        if child is None:
            return path, x
        path.append(child)
        node = child


def _token_of(children: Mapping[int, int], node: int) -> int:
    return next(t for t, c in children.items() if c == node)
