"""The distribution a token is sampled from, computed from raw logits with numpy.

:func:`shape` applies llama.cpp's logit biases and penalties, which depend on the text before
the row; :func:`transform` then reproduces llama.cpp's sampler chain top-k -> top-p -> min-p ->
temperature (``llama_sampler_init_top_k/top_p/min_p/temp``) and returns the sparse
distribution that ``llama_sampler_init_dist`` would draw from. Speculative sampling
needs that distribution itself, not just a draw from it. :class:`Mirostat` replaces that chain
when asked for: its distribution depends on the surprise of the tokens drawn before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import math

import numpy as np

from .config import SamplingConfig


@dataclass(frozen=True, eq=False)
class Distribution:
    """A distribution over the vocabulary, stored sparsely.

    ``ids`` (int64) are the tokens with nonzero probability, in no particular order;
    ``probs`` (float64, sums to 1) are their probabilities. Every other token has
    probability 0.
    """

    ids: np.ndarray
    probs: np.ndarray

    @staticmethod
    def point(token: int) -> "Distribution":
        """Probability 1 on ``token``: the 'distribution' of a deterministic draft."""
        return Distribution(np.array([token], dtype=np.int64), np.array([1.0]))

    def prob(self, token: int) -> float:
        """Probability of ``token`` (0 when it is not in the support)."""
        hit = self.probs[self.ids == token]
        return float(hit[0]) if hit.size else 0.0


def recent(text: Sequence[int], cfg: SamplingConfig) -> List[int]:
    """The end of ``text`` the penalties look back on (``shape`` of a row after ``text`` + more
    tokens needs only this + them): its last ``penalty_last_n`` tokens, all with -1, none without
    penalties."""
    if not cfg.penalized:
        return []
    return list(text if cfg.penalty_last_n < 0 else text[-cfg.penalty_last_n:])


def shape(logits: np.ndarray, cfg: SamplingConfig, text: Sequence[int]) -> np.ndarray:
    """``logits`` after llama.cpp's first samplers, logit bias then penalties, for a row that
    follows ``text`` (see SamplingConfig); ``logits`` itself when neither applies. In float32,
    as llama.cpp computes them, so that near-ties fall the same way."""
    if not cfg.shaped:
        return logits
    row = np.array(logits, dtype=np.float32)
    for token, bias in cfg.logit_bias:
        if token < len(row):
            row[token] += np.float32(bias)
    if cfg.penalized and len(text):
        window = text if cfg.penalty_last_n < 0 else text[-cfg.penalty_last_n:]
        ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
        x = row[ids]
        x = np.where(x <= 0, x * np.float32(cfg.repeat_penalty), x / np.float32(cfg.repeat_penalty))
        x -= counts.astype(np.float32) * np.float32(cfg.frequency_penalty) + np.float32(cfg.presence_penalty)
        row[ids] = x
    return row


@dataclass(frozen=True)
class TokenLogprob:
    """A chosen token's log-probability and the ``top`` most probable tokens' (token, logprob),
    best first, under the distribution a row gives at temperature 1."""

    token: int
    logprob: float
    top: Tuple[Tuple[int, float], ...] = ()


def logprob_of(row: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """``token``'s log-probability under softmax(``row``) and the ``n_top`` best tokens'."""
    x = row.astype(np.float64)
    peak = x.max()
    norm = peak + np.log(np.exp(x - peak).sum())
    top: Tuple[Tuple[int, float], ...] = ()
    if n_top > 0:
        best = np.argpartition(-x, min(n_top, len(x) - 1))[:n_top]
        best = best[np.argsort(-x[best], kind="stable")]
        top = tuple((int(t), float(x[t] - norm)) for t in best)
    return TokenLogprob(token, float(x[token] - norm), top)


def transform(logits: np.ndarray, cfg: SamplingConfig) -> Distribution:
    """The distribution llama.cpp's chain top-k, top-p, min-p, temp would sample from.

    ``logits`` (one vocab-sized row, usually a float32 view of llama.cpp's buffer) is
    not modified. Greedy configs (``temperature == 0``) give a point mass on the
    argmax (the first one on ties, as llama.cpp does).

    The steps, each on the candidates the previous one left:

    1. top-k: the ``top_k`` largest logits.
    2. top-p: softmax at temperature 1 over those candidates; keep the shortest run of
       most probable tokens whose cumulative probability reaches ``top_p``.
    3. min-p: keep tokens with ``logit >= max_logit + log(min_p)``.
    4. temperature: ``probs = softmax(kept_logits / temperature)``.

    Steps 2 and 3 each keep a prefix of the candidates sorted by logit, and min-p's
    threshold only depends on the maximum logit, which top-p always keeps. So the
    result is the shorter of the two prefixes, and min-p can be applied first as an
    exact prefilter, provided top-p's softmax is still normalised over all
    candidates left by top-k (not only over the min-p survivors). That is what is
    done here: one O(n) pass computes the normaliser, and only min-p's survivors are
    ever sorted. Without min-p, top-p sorts partially, as llama.cpp does.
    """
    if cfg.greedy and cfg.typical_p >= 1:
        return Distribution.point(int(np.argmax(logits)))

    top = _top_k(logits, cfg.top_k)  # candidate token ids; None: every token
    if cfg.typical_p < 1:
        top = _typical(logits, np.arange(len(logits)) if top is None else top, cfg.typical_p)
        if cfg.greedy:  # llama.cpp's temperature 0 keeps the best token left
            return Distribution.point(int(top[np.argmax(logits[top])]))
    cand = logits if top is None else logits[top]
    max_logit = cand.max()
    keep, kept = np.arange(len(cand)), cand  # positions in cand, and their logits

    if cfg.min_p > 0:
        # llama.cpp compares in float32 against max + logf(min_p); so do we.
        keep = np.flatnonzero(cand >= max_logit + np.log(np.float32(cfg.min_p)))
        kept = cand[keep]
    if cfg.top_p < 1:
        z = np.exp(cand - max_logit).sum(dtype=np.float64)  # over all candidates
        first = _top_p(kept, max_logit, z, cfg.top_p)
        keep, kept = keep[first], kept[first]

    ids = keep if top is None else top[keep]
    weights = np.exp((kept - kept.max()) / cfg.temperature).astype(np.float64)
    return Distribution(ids.astype(np.int64, copy=False), weights / weights.sum())


def _typical(logits: np.ndarray, ids: np.ndarray, p: float) -> np.ndarray:
    """Of the candidates ``ids``, llama.cpp's locally typical ones: by how far each one's surprise
    ``-log p`` is from the entropy, nearest first, until their probability exceeds ``p``."""
    x = logits[ids].astype(np.float64)
    probs = np.exp(x - x.max())
    probs /= probs.sum()
    with np.errstate(divide="ignore", invalid="ignore"):  # a token of probability 0: infinitely surprising
        surprise = -np.log(probs)
        entropy = float(np.sum(np.where(probs > 0, probs * surprise, 0.0)))
    order = np.argsort(np.abs(surprise - entropy), kind="stable")
    n = int(np.searchsorted(np.cumsum(probs[order]), p, side="right")) + 1  # first cum > p
    return ids[order[:min(n, len(order))]]


def _top_k(logits: np.ndarray, k: int) -> Optional[np.ndarray]:
    """Ids of the ``k`` largest logits, unordered; None when top-k keeps every token.

    An exact prefilter spares partitioning the whole vocabulary: split it into
    ``groups`` disjoint groups (strided, so clustered large logits spread out); the
    k-th largest group maximum is <= the k-th largest logit, because k distinct
    logits (those group maxima) reach it. So every top-k logit passes the threshold.
    """
    n = logits.shape[0]
    if k <= 0 or k >= n:
        return None
    groups = 1024
    if k <= groups and n >= 4 * groups:
        size = n // groups
        maxima = logits[: groups * size].reshape(size, groups).max(axis=0)
        ids = np.flatnonzero(logits >= np.partition(maxima, groups - k)[groups - k])
    else:
        ids = np.arange(n)
    return ids[np.argpartition(logits[ids], len(ids) - k)[len(ids) - k:]]


def _top_p(kept: np.ndarray, max_logit: float, z: float, top_p: float) -> np.ndarray:
    """Positions in ``kept`` of its largest logits, best first, while the probabilities
    ``exp(logit - max_logit) / z`` have not yet summed to ``top_p`` (all if they never do).

    Sorts only the best 256 first and widens when they hold less than ``top_p``.
    """
    m = 256
    while True:
        if m < len(kept):
            best = np.argpartition(kept, len(kept) - m)[len(kept) - m:]
        else:
            best = np.arange(len(kept))
        best = best[np.argsort(-kept[best], kind="stable")]
        cum = np.cumsum(np.exp(kept[best].astype(np.float64) - max_logit)) / z
        n = int(np.searchsorted(cum, top_p, side="left")) + 1  # first cum >= top_p
        if n <= len(best) or len(best) == len(kept):
            return best[:n]
        m *= 16


# Mirostat 1 estimates the distribution's Zipf exponent from its best tokens (llama.cpp's m).
MIROSTAT_M = 100


@dataclass(eq=False)
class Mirostat:
    """Mirostat's state along one text (Basu et al. 2021, "Mirostat: a neural text decoding
    algorithm that directly controls perplexity"), as llama.cpp's samplers compute it: ``mu``, the
    most surprise (in bits) a token may carry, starts at 2 tau; after each token x drawn from the
    distribution d it gave, ``mu -= eta * (-log2 d(x) - tau)``. So the distribution at a position
    depends on the tokens before it and on the rows they were drawn from: a verified trie's
    walk carries one state down the path it takes (engine/target.py).

    Version 2 keeps the tokens whose surprise is at most mu; version 1 keeps the k best, k from
    mu and the Zipf exponent estimated from the ``MIROSTAT_M`` best tokens. Both renormalize. The
    logits are divided by the temperature first (``SamplingConfig.temperature``)."""

    cfg: SamplingConfig
    mu: float

    @staticmethod
    def start(cfg: SamplingConfig) -> Optional["Mirostat"]:
        """The state a text starts with, None when ``cfg`` samples without mirostat."""
        return Mirostat(cfg, 2.0 * cfg.mirostat_tau) if cfg.mirostat and not cfg.greedy else None

    def distribution(self, logits: np.ndarray) -> Distribution:
        """The distribution mirostat draws the next token from, at the present ``mu``."""
        x = logits.astype(np.float64) / self.cfg.temperature
        peak = x.max()
        if self.cfg.mirostat == 2:  # surprise -log2 p <= mu  <=>  x >= peak + log z - mu ln 2
            log_z = peak + math.log(np.exp(x - peak).sum())
            ids = np.flatnonzero(x >= log_z - self.mu * math.log(2))
            if not len(ids):
                ids = np.array([int(np.argmax(x))])
        else:
            k = self._k(x)
            ids = np.argpartition(-x, k - 1)[:k] if k < len(x) else np.arange(len(x))
        weights = np.exp(x[ids] - x[ids].max())
        return Distribution(ids.astype(np.int64), weights / weights.sum())

    def _k(self, x: np.ndarray) -> int:
        """Version 1's k: from the exponent s of a Zipf law fitted to the best tokens' log-ratios
        (``b_i = log p_i / p_i+1`` against ``t_i = log (i+2) / (i+1)``) and mu."""
        n = len(x)
        m = min(MIROSTAT_M, n)
        best = np.sort(np.partition(x, n - m)[n - m:])[::-1]
        i = np.arange(m - 1)
        t = np.log((i + 2) / (i + 1))
        s = float(np.dot(t, best[:-1] - best[1:]) / np.dot(t, t)) if m > 1 else 1.0
        eps = s - 1
        with np.errstate(all="ignore"):
            k = (eps * 2.0 ** self.mu / (1 - float(n) ** -eps)) ** (1 / s) if s > 0 else math.inf
        return max(int(k), 1) if math.isfinite(k) else n

    def advance(self, dist: Distribution, token: int) -> None:
        """``token`` was drawn from ``dist`` (this state's distribution at its position)."""
        self.mu -= self.cfg.mirostat_eta * (-math.log2(dist.prob(token)) - self.cfg.mirostat_tau)


def sample(dist: Distribution, rng: np.random.Generator) -> int:
    """Draw one token from ``dist`` with the next number of ``rng``."""
    return sample_at(dist, rng.random())


def sample_at(dist: Distribution, u: float) -> int:
    """The token at ``u`` in [0, 1) of ``dist``'s inverse CDF (zero-probability tokens never)."""
    cdf = np.cumsum(dist.probs)
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return int(dist.ids[min(i, len(cdf) - 1)])


class Uniforms:
    """One uniform number per position of the text, a function of (seed, position) alone.

    Every token sampled from the target's p at a position uses that position's number, so what
    the target samples there does not depend on what was drafted or verified before it: with
    deterministic candidates (sample-and-match) a seed gives the text plain sampling gives."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __call__(self, position: int) -> float:
        return float(np.random.default_rng([self.seed, position]).random())
