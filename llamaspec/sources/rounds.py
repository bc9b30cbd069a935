"""An expensive source's drafting as rounds of decodes, and several run together.

A draft model drafts one token per decode of its own model. Its proposal is written as a
generator (a ``Drafting``): each round it yields the tokens it needs read on its KV-cache
sequence (a ``Read``: the catch-up and the pending token first, then the token it drafted) and
receives the logits of the last of them; it returns its ``Proposal``. Run alone, each round is
one decode. Run together (the lanes of one engine step), each round is one decode that carries
every drafting still going, each on its own sequence::

    round        1                          2        3
    lane 0       [catch-up, pending] -> a   [a] -> b [b] -> .      (stops: path too unlikely)
    lane 1       [pending] -> x             [x] -> y [y] -> z
    decodes      one, both reads            one      one

Readings that start from the same text (the samples of one prompt catching up on it) read
their common part once: its rows carry every such sequence's id::

    row      0    1    2    3    4
    token    p1   p2   p3   A    B        A, B: two samples' own pending tokens
    pos      0    1    2    3    3
    seq 0    x    x    x    x    .
    seq 1    x    x    x    .    x
    logits   .    .    .    x    x

Each drafting is charged its share of a round (the rows it asked for over the rows all asked
for): that is what its proposal's ``decodes`` report to the cost model, so the planner prices a
drafted token at what it costs when the lanes draft together.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..sequences import BatchRow, common_prefix
from .base import Drafting, Proposal, Read


def alone(drafting: Drafting) -> Proposal:
    """Run one drafting, one decode a round."""
    ((proposal, _),) = together([drafting])
    return proposal


def together(draftings: Sequence[Drafting]) -> List[Tuple[Proposal, float]]:
    """Run ``draftings`` in lockstep, one decode a round (per model) for all those still going;
    return each one's proposal (its ``decodes``: its share of each round) and the seconds it is
    charged (its own work and its share of the decodes). They are started in order: each
    sees the sequences as the ones before left them, nothing of this call decoded yet."""
    n = len(draftings)
    results: List[Optional[Proposal]] = [None] * n
    seconds = [0.0] * n
    shares: List[List[Tuple[int, float]]] = [[] for _ in range(n)]
    reads: Dict[int, Read] = {}

    def advance(i: int, logits: Optional[np.ndarray]) -> None:
        t0 = time.perf_counter()
        try:
            reads[i] = draftings[i].send(logits)  # type: ignore[arg-type]
        except StopIteration as stop:
            results[i] = stop.value if stop.value is not None else Proposal()
        seconds[i] += time.perf_counter() - t0

    for i in range(n):
        advance(i, None)
    while reads:
        going = sorted(reads.items())
        reads.clear()
        t0 = time.perf_counter()
        rows = _round([read for _, read in going])
        dt = time.perf_counter() - t0
        asked = sum(len(read.tokens) for _, read in going)
        for (i, read), logits in zip(going, rows):
            share = dt * len(read.tokens) / asked
            shares[i].append((len(read.tokens), share))
            seconds[i] += share
            advance(i, logits)
    return [(replace(p, decodes=p.decodes + tuple(s)), t)  # type: ignore[arg-type]
            for p, s, t in zip(results, shares, seconds)]


def _round(reads: Sequence[Read]) -> List[np.ndarray]:
    """Decode every read, in as few decodes as the batches allow; the logits after each."""
    fitting = [_fit(read) for read in reads]
    out: List[Optional[np.ndarray]] = [None] * len(reads)
    pack: List[int] = []
    for i, read in enumerate(fitting):
        ctx = read.seq.ctx
        if pack and (fitting[pack[0]].seq.ctx is not ctx or
                     sum(len(fitting[j].tokens) for j in pack) + len(read.tokens) > ctx.n_batch):
            _decode(fitting, pack, out)
            pack = []
        pack.append(i)
    if pack:
        _decode(fitting, pack, out)
    return out  # type: ignore[return-value]


def _fit(read: Read) -> Read:
    """``read``, its tokens before the last batch's worth read first, one batch at a time."""
    n_batch = read.seq.ctx.n_batch
    if len(read.tokens) <= n_batch:
        return read
    read.seq.eval(read.tokens[:-n_batch])
    return replace(read, tokens=read.tokens[-n_batch:])


def _decode(reads: Sequence[Read], pack: Sequence[int], out: List[Optional[np.ndarray]]) -> None:
    """One decode of the reads in ``pack`` (one model's, fitting one batch); the first of several
    reads that start from the same text reads their common part for all of them."""
    rows: List[list] = []  # a BatchRow's fields, in lists: rows read again add their sequence ids
    first: Dict[int, int] = {}  # a read that owns its rows -> its first row
    last: Dict[int, int] = {}  # a read -> the row of its last token
    for i in pack:
        read, seq = reads[i], reads[i].seq
        alike = [j for j in first if reads[j].seq.tokens == seq.tokens]
        owner = max(alike, key=lambda j: common_prefix(reads[j].tokens, read.tokens), default=None)
        shared = common_prefix(reads[owner].tokens, read.tokens) if owner is not None else 0
        for r in range(shared):
            rows[first[owner] + r][2].append(seq.seq)  # type: ignore[index]
        if not shared:
            first[i] = len(rows)
        n = len(seq.tokens)
        rows += [[t, n + r, [seq.seq], False] for r, t in enumerate(read.tokens[shared:], shared)]
        last[i] = first[owner] + shared - 1 if shared == len(read.tokens) else len(rows) - 1  # type: ignore[index]
        rows[last[i]][3] = True
    ctx = reads[pack[0]].seq.ctx
    n_out = ctx.decode_rows([BatchRow(t, pos, tuple(seqs), logits) for t, pos, seqs, logits in rows])
    place = np.cumsum([row[3] for row in rows]) - 1  # a row's place among the output rows
    outputs = ctx.logits(n_out)
    for i in pack:
        reads[i].seq.tokens.extend(reads[i].tokens)
        out[i] = np.array(outputs[place[last[i]]])  # a copy: the next decode overwrites the context's
