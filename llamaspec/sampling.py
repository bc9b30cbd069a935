"""The distribution a token is sampled from, computed from raw logits with numpy.

:func:`transform` reproduces llama.cpp's sampler chain top-k -> top-p -> min-p ->
temperature (``llama_sampler_init_top_k/top_p/min_p/temp``) and returns the sparse
distribution that ``llama_sampler_init_dist`` would draw from. Speculative sampling
needs that distribution itself, not just a draw from it.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def transform(logits: np.ndarray, cfg: SamplingConfig) -> Distribution:
    """The distribution llama.cpp's chain top-k, top-p, min-p, temp would sample from.

    ``logits`` (one vocab-sized row, usually a float32 view of llama.cpp's buffer) is
    not modified. Greedy configs (``temperature == 0``) give a point mass on the
    argmax (the first one on ties, as llama.cpp does).

    The steps, each on the candidates the previous one left:

    1. top-k: the ``top_k`` largest logits (``np.argpartition``, no sort).
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
    sorted, which avoids sorting the whole vocabulary when ``top_k == 0`` and
    ``min_p > 0``. (Only ``top_k == 0, min_p == 0, top_p < 1`` sorts everything.)
    """
    if cfg.greedy:
        return Distribution.point(int(np.argmax(logits)))

    n_vocab = logits.shape[0]
    if 0 < cfg.top_k < n_vocab:
        ids = np.argpartition(logits, n_vocab - cfg.top_k)[n_vocab - cfg.top_k:].astype(np.int64)
    else:
        ids = np.arange(n_vocab, dtype=np.int64)
    cand = logits[ids]  # a copy: the caller's buffer is left alone
    max_logit = cand.max()

    ids_kept, kept = ids, cand
    if cfg.min_p > 0:
        # llama.cpp compares in float32 against max + logf(min_p); so do we.
        survive = cand >= max_logit + np.log(np.float32(cfg.min_p))
        ids_kept, kept = ids[survive], cand[survive]

    if cfg.top_p < 1:
        z = np.exp(cand.astype(np.float64) - max_logit).sum()  # over all candidates
        order = np.argsort(-kept, kind="stable")
        ids_kept, kept = ids_kept[order], kept[order]
        cum = np.cumsum(np.exp(kept.astype(np.float64) - max_logit)) / z
        n = int(np.searchsorted(cum, cfg.top_p, side="left")) + 1  # first cum >= top_p
        ids_kept, kept = ids_kept[:n], kept[:n]

    scaled = kept.astype(np.float64) / cfg.temperature
    probs = np.exp(scaled - scaled.max())
    return Distribution(ids_kept, probs / probs.sum())


def sample(dist: Distribution, rng: np.random.Generator) -> int:
    """Draw one token from ``dist`` (inverse CDF; zero-probability tokens are never drawn)."""
    cdf = np.cumsum(dist.probs)
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(dist.ids[min(i, len(cdf) - 1)])
