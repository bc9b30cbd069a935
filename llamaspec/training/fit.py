"""Draft heads fitted to the target's states with numpy (Medusa-1: the target frozen, only the
heads' block trained), through K steps of the block at once (EAGLE's draft model, unrolled).

For a batch of rows h (B, d) and the tokens the text goes on with after them, x[t+1 .. t+K]
(the pending token, then the tokens the heads before each are taken to have guessed: the
text's), the rows e_k (B, d) of E_N of x[t+k] (zero off the map), and the target's
distributions k places after the pending token t_k (its TOP tokens renormalised on the map,
``soft``, else onehot of its choice)::

    z_0 = h     u_k = ([z_(k-1); e_k] - mu) / sd     (B, 2d): the block's input, standardised
    a_k = u_k V^T + c  (B, r)    g_k = SiLU(a_k)    z_k = z_(k-1) + g_k U^T  (B, d)
    l_k = z_k E_N^T  (B, N)      loss = sum_k w_k mean(-sum(t_k * log softmax(l_k)))

mu and sd are the training rows' [h; e]'s mean and deviation per column (the target's hidden
states are far from even: a few columns vary 3,000 times as much as others, and Adam on the raw
columns learned head 1 to 0.41 where it learned 0.48). Back through the steps, last first:

    dl_k = w_k (softmax(l_k) - t_k) / B      dz_k = dl_k E_N + dz'_k (from step k+1; 0 at K)
    dU += dz_k^T g_k     da_k = (dz_k U) * SiLU'(a_k)     dV += da_k^T u_k     dc += sum(da_k)
    dz'_(k-1) = dz_k + (da_k V)[:, :d] / sd[:d]

U starts at zero (each head then guesses as the target's own output matrix does), V at random
(N(0, 1 / 2d): a's units start apart), c at zero; Adam moves them, its step size falling
linearly to 0 by the training's end (its last step or its deadline, whichever comes first).
The file keeps V and c folded back onto [z; e]: V / sd and c - (V / sd) mu, so that using the
heads needs neither mu nor sd. A head whose token is outside the map, or past its piece's end,
is not trained on at that row (and counts as a miss in the held-out agreement).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..config import check
from ..draft_heads import MAX_HEADS, RANKS, Heads
from .data import States

COVERAGE = 0.95  # the map's default size: the fewest tokens that make this share of the target's
MIN_TOKENS, MAX_TOKENS = 1024, 8192
SCALE_ROWS = 16384  # training rows the block's input's mean and deviation are taken from
MIN_SD = 1e-3  # a column's deviation, at least
PRIOR_WEIGHT = 5.0  # the calibration's: rows of a decile's own value, d / 10, beside the held-out rows


@dataclass(frozen=True)
class TrainConfig:
    """``heads``: K, the block's steps; ``rank``: r, its inner units (at most the target's d); ``n_tokens``:
    the map's size (0: the fewest covering COVERAGE of the target's tokens on the training text,
    between MIN_TOKENS and MAX_TOKENS); ``epochs`` over the
    training rows; ``batch`` rows a step; ``lr`` Adam's first step size (it falls to 0 by the
    end); ``seed``; ``held_out``: the share of the pieces of text kept aside to measure the
    heads on; ``soft``: learn the target's distribution (its TOP tokens), else its choice alone."""

    heads: int = 3
    rank: int = 512
    n_tokens: int = 0
    epochs: float = 6.0
    batch: int = 256
    lr: float = 2e-3
    seed: int = 0
    held_out: float = 0.1
    soft: bool = True

    def __post_init__(self) -> None:
        check(1 <= self.heads <= MAX_HEADS, f"heads must be 1 to {MAX_HEADS}, got {self.heads}")
        check(self.rank >= 1, f"the heads' rank must be >= 1, got {self.rank}")
        check(self.n_tokens >= 0, f"the token map's size must be >= 0 (0: chosen), got {self.n_tokens}")
        check(self.epochs > 0, f"epochs must be > 0, got {self.epochs}")
        check(self.batch >= 1, f"batch must be >= 1, got {self.batch}")
        check(self.lr > 0, f"the learning rate must be > 0, got {self.lr}")
        check(0 <= self.held_out < 1, f"the held-out share must be in [0, 1), got {self.held_out}")


@dataclass(frozen=True)
class Report:
    """What a training run did and how the heads do on the held-out text: ``top1[k-1]`` and
    ``top5[k-1]``, how often head k's best token (one of its best five) is the target's token k
    places ahead; ``base_top1``: the same for the untrained heads (the target's own output
    matrix on its hidden state). ``interrupted``: stopped by a Ctrl-C; ``out_of_time``: by the
    deadline, before its epochs."""

    rows: int
    held_out_rows: int
    n_tokens: int
    coverage: float
    steps: int
    interrupted: bool
    out_of_time: bool
    seconds: float
    top1: Tuple[float, ...]
    top5: Tuple[float, ...]
    base_top1: Tuple[float, ...]

    def as_dict(self) -> Dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def token_map(labels: np.ndarray, n_tokens: int, n_vocab: int) -> Tuple[np.ndarray, float]:
    """The N most frequent of the target's tokens (N = ``n_tokens``, or chosen by COVERAGE) and the
    share of ``labels`` they cover."""
    counts = np.bincount(labels, minlength=n_vocab)
    order = np.argsort(-counts, kind="stable")
    if n_tokens == 0:
        covered = np.cumsum(counts[order]) / max(1, counts.sum())
        n_tokens = int(np.clip(np.searchsorted(covered, COVERAGE) + 1, MIN_TOKENS, MAX_TOKENS))
    tokens = np.sort(order[:min(n_tokens, n_vocab)])
    return tokens, float(counts[tokens].sum() / max(1, counts.sum()))


def split(states: States, share: float, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """Rows to train on and rows held out: whole pieces of text, ``share`` of them, chosen by ``seed``."""
    pieces = np.unique(states.piece)
    rng = np.random.default_rng(seed)
    held = rng.permutation(pieces)[:int(round(share * len(pieces)))] if share > 0 else pieces[:0]
    out = np.isin(states.piece, held)
    return np.flatnonzero(~out), np.flatnonzero(out)


class Adam:
    """Adam (Kingma and Ba) over float32 arrays, in place: each step works in one scratch array
    per shape instead of fresh temporaries as large as W_k (allocating them took half of an
    update's time)."""

    def __init__(self, shapes: List[Tuple[int, ...]]) -> None:
        self.t = 0
        self.m = [np.zeros(s, np.float32) for s in shapes]
        self.v = [np.zeros(s, np.float32) for s in shapes]
        self.scratch = {s: np.zeros(s, np.float32) for s in shapes}

    def step(self, params: List[np.ndarray], grads: List[np.ndarray], lr: float, b1: float = 0.9, b2: float = 0.999
             ) -> None:
        """m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,  p -= lr m^ / (sqrt(v^) + eps), where
        m^ = m / (1 - b1^t) and v^ = v / (1 - b2^t)"""
        self.t += 1
        c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for p, g, m, v in zip(params, grads, self.m, self.v):
            tmp = self.scratch[p.shape]
            m *= b1
            np.multiply(g, 1 - b1, out=tmp)
            m += tmp
            v *= b2
            np.multiply(g, g, out=tmp)
            tmp *= 1 - b2
            v += tmp
            np.sqrt(v, out=tmp)
            tmp *= 1 / math.sqrt(c2)
            tmp += 1e-8
            np.divide(m, tmp, out=tmp)
            tmp *= lr / c1
            p -= tmp


def targets(y: np.ndarray, n: int, soft: Optional[Tuple[np.ndarray, np.ndarray]] = None) -> np.ndarray:
    """The distributions a batch learns (B, n): onehot(y), or ``soft`` = (map indices, -1 off the
    map; probabilities) renormalised on the map (onehot(y) where none is on it)."""
    t = np.zeros((len(y), n), np.float64)
    if soft is None:
        t[np.arange(len(y)), y] = 1.0
        return t
    ids, p = soft
    rows = np.repeat(np.arange(len(y)), ids.shape[1])
    on = ids.ravel() >= 0
    np.add.at(t, (rows[on], ids.ravel()[on]), p.ravel()[on])
    total = t.sum(axis=1)
    t[total == 0, y[total == 0]] = 1.0
    return t / t.sum(axis=1, keepdims=True)


DEPTH_1 = 2.0  # w_1, head 1's weight in the loss (the others': 1): 0.358 -> 0.368 held out, deeper heads alike


def chain_step(v: np.ndarray, c: np.ndarray, u: np.ndarray, out: np.ndarray, h: np.ndarray, e: Sequence[np.ndarray],
               t: Sequence[np.ndarray], mu: np.ndarray, sd: np.ndarray
               ) -> Tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """The loss of K steps of the block on a batch of hidden states h (B, d), the rows e[k-1]
    (B, d) of the tokens read, and the distributions t[k-1] (B, N) each step learns (a row of
    zeros: none there), and its gradients (dV, dc, dU); the block acts on ([z; e] - mu) / sd."""
    d, n = h.shape[1], len(h)
    z, saved, loss, dz_out = h, [], 0.0, []
    for k, (e_k, t_k) in enumerate(zip(e, t), start=1):
        x = (np.concatenate([z, e_k], axis=1) - mu) / sd
        a = x @ v.T + c
        s = 1.0 / (1.0 + np.exp(-a))
        g = a * s
        z = z + g @ u.T
        logits = z @ out.T
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        w = DEPTH_1 if k == 1 else 1.0
        loss += w * float(-(t_k * np.log(p + 1e-30)).sum(axis=1).sum() / n)
        p *= t_k.sum(axis=1, keepdims=True)  # rows with nothing to learn here: no gradient
        p -= t_k
        p *= w / n
        dz_out.append(p @ out)
        saved.append((x, a, s, g))
    dv, dc, du = np.zeros_like(v), np.zeros_like(c), np.zeros_like(u)
    dz = np.zeros_like(h)
    for (x, a, s, g), dz_k in zip(reversed(saved), reversed(dz_out)):
        dz = dz + dz_k
        du += dz.T @ g
        da = (dz @ u) * (s * (1.0 + a * (1.0 - s)))
        dv += da.T @ x
        dc += da.sum(axis=0)
        dz = dz + (da @ v[:, :d]) / sd[:d]
    return loss, dv, dc, du


def scale(x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """mu and sd of the columns of x (n, 2d): the block's inputs are (x - mu) / sd."""
    if not len(x):
        return np.zeros(x.shape[1], np.float32), np.ones(x.shape[1], np.float32)
    return x.mean(axis=0), np.maximum(x.std(axis=0), MIN_SD)


def folded(w: np.ndarray, b: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """A block's first layer (r, 2d), (r,) trained on (x - mu) / sd as layers on x: W / sd,
    rounded as the file keeps it (float16, held within its range where a column barely varies),
    and b - (W / sd) mu with that rounding, so the two cancel on mu exactly."""
    big = float(np.finfo(np.float16).max)
    w_x = np.clip(w / sd, -big, big).astype(np.float16).astype(np.float32)
    return w_x, b - w_x @ mu


def held_out(heads: Heads, states: States, rows: np.ndarray, weight: float = PRIOR_WEIGHT, chunk: int = 512
             ) -> Tuple[List[float], List[float], np.ndarray]:
    """The heads measured on ``rows``, in one pass, each head reading the text's tokens (the
    pending one, then the ones after it): each head's top-1 and top-5 agreement with the
    target's token k places after the pending one, and its calibration (K, 11): ``[k - 1, d]``,
    how often head k's best RANKS tokens whose probability rounds to d / 10 were the target's (a
    decile seen on few rows leans on d / 10, as if seen ``weight`` times)."""
    n, hit1, hit5 = np.zeros(heads.k), np.zeros(heads.k), np.zeros(heads.k)
    hits, seen = np.zeros((heads.k, 11)), np.zeros((heads.k, 11))
    for start in range(0, len(rows), chunk):
        part = rows[start:start + chunk]
        z = states.hidden[part]
        for k in range(1, heads.k + 1):
            z = heads.step(z, heads.pending(states.next[states.along(part, k - 1)[0]]))
            ahead, valid = states.along(part, k)
            logits = z[valid] @ heads.out.T
            labels = states.labels[ahead[valid]]
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            top = np.argpartition(-p, min(5, p.shape[1]) - 1, axis=1)[:, :5]  # the best five (RANKS <= 5)
            order = np.take_along_axis(top, np.argsort(-np.take_along_axis(p, top, axis=1), axis=1), axis=1)
            right = heads.tokens[order] == labels[:, None]
            n[k - 1] += len(labels)
            hit1[k - 1] += right[:, 0].sum()
            hit5[k - 1] += right[:, :5].any(axis=1).sum()
            decile = np.rint(10 * np.take_along_axis(p, order[:, :RANKS], axis=1)).astype(np.int64)
            np.add.at(hits[k - 1], decile.ravel(), right[:, :RANKS].ravel())
            np.add.at(seen[k - 1], decile.ravel(), 1)
    n = np.maximum(n, 1)
    return list(hit1 / n), list(hit5 / n), (hits + weight * np.arange(11) / 10) / (seen + weight)


def train(states: States, n_vocab: int, out_rows: Callable[[np.ndarray], np.ndarray], config: TrainConfig,
          meta: Dict[str, Any], progress: Callable[[int, int, float], None] = lambda step, steps, loss: None,
          deadline: float = math.inf) -> Tuple[Heads, Report]:
    """Heads fitted to ``states`` (``out_rows(tokens)``: the output matrix's rows for the map).
    A Ctrl-C stops the training and keeps the heads as they are (``Report.interrupted``); so
    does ``deadline`` (``time.perf_counter``'s), early enough to measure them on the held-out
    rows by then (as long as measuring the untrained heads took)."""
    t0 = time.perf_counter()
    d, k = states.hidden.shape[1], config.heads
    train_rows, held_rows = split(states, config.held_out, config.seed)
    tokens, coverage = token_map(states.labels[train_rows], config.n_tokens, n_vocab)
    index = np.full(n_vocab, -1, np.int64)
    index[tokens] = np.arange(len(tokens))
    out = np.asarray(out_rows(tokens)).astype(np.float16).astype(np.float32)  # as the file keeps it
    r = min(config.rank, d)
    rng = np.random.default_rng(config.seed)
    v = (rng.normal(0, 1, (r, 2 * d)) / math.sqrt(2 * d)).astype(np.float32)  # on (x - mu) / sd
    c, u = np.zeros(r, np.float32), np.zeros((d, r), np.float32)
    heads = Heads(np.zeros_like(v), np.zeros_like(c), np.zeros_like(u), tokens, out, k, dict(meta))  # untrained: z = h

    def learned(rows: np.ndarray, j: int) -> np.ndarray:
        """What step j learns at ``rows`` (B, N): the target's distribution j places after the
        pending token, zero where its token is off the map or past the piece's end."""
        ahead, valid = states.along(rows, j)
        y = index[states.labels[ahead]]
        valid &= y >= 0
        t = targets(np.maximum(y, 0), len(tokens), (index[states.top[ahead]], states.top_p[ahead]) if config.soft
                    else None)
        t[~valid] = 0.0
        return t

    t1 = time.perf_counter()
    base1, _, _ = held_out(heads, states, held_rows)
    stop = deadline - (time.perf_counter() - t1)
    rows, _ = states.ahead(1, train_rows)  # rows where head 1 has a token to learn
    steps = int(np.ceil(config.epochs * len(rows) / config.batch)) if len(rows) else 0
    sample = rng.permutation(train_rows)[:SCALE_ROWS]
    mu, sd = scale(np.concatenate([states.hidden[sample], heads.pending(states.next[sample])], axis=1))
    adam = Adam([v.shape, c.shape, u.shape])
    done, interrupted, out_of_time = 0, False, False
    begun = time.perf_counter()
    try:
        for step in range(steps):
            now = time.perf_counter()
            if now >= stop:
                out_of_time = True
                break
            pick = rows[rng.integers(0, len(rows), min(config.batch, len(rows)))]
            e = [heads.pending(states.next[states.along(pick, j - 1)[0]]) for j in range(1, k + 1)]
            loss, dv, dc, du = chain_step(v, c, u, out, states.hidden[pick], e,
                                          [learned(pick, j) for j in range(1, k + 1)], mu, sd)
            adam.step([v, c, u], [dv, dc, du], config.lr * (1 - max(step / steps, (now - begun) / (stop - begun))))
            done = step + 1
            progress(done, steps, loss)
    except KeyboardInterrupt:
        interrupted = True
    (heads.w, heads.b), heads.u = folded(v, c, mu, sd), u
    top1, top5, heads.calibration = held_out(heads, states, held_rows)
    report = Report(rows=len(train_rows), held_out_rows=len(held_rows), n_tokens=len(tokens), coverage=coverage,
                    steps=done, interrupted=interrupted, out_of_time=out_of_time, seconds=time.perf_counter() - t0,
                    top1=tuple(top1), top5=tuple(top5), base_top1=tuple(base1))
    heads.meta.update(n_tokens=len(tokens), heads=config.heads, report=report.as_dict(),
                      settings={k: v for k, v in config.__dict__.items()})
    return heads, report
