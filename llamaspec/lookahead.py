"""Lookahead decoding (Fu et al., 2024): Jacobi iteration and an n-gram pool, one batch per step.

No draft model. Each step one ``llama_decode`` of the target carries

- the pending token ``I`` (the last accepted token, not yet in the cache);
- a lookahead window of W columns by N - 1 levels of guesses ``L``: column i is a little
  sequence (level 0 up to column i, then its own levels); the output of its last level is a
  fresh guess one position further, so each step refines the guesses (Jacobi iteration), and
  every column yields an N-gram for the pool;
- up to G candidates ``V`` from the pool (N-grams whose first token is ``I``), each verified
  on its own KV-cache sequence.

Batch layout for W = 4, N = 4, G = 2 (``x``: the row belongs to that KV-cache sequence;
offsets count from the pending token's position n_past)::

    row      0 |  1  2  3  4  5  6 |  7  8  9 10 11 12 13 14 15 16 17
    kind     I |  V  V  V  V  V  V |  L  L  L  L  L  L  L  L  L  L  L
    level    0 |                   |  0  0  0  1  1  1  1  2  2  2  2
    column   0 |                   |  1  2  3  0  1  2  3  0  1  2  3
    offset   0 |  1  2  3  1  2  3 |  1  2  3  1  2  3  4  2  3  4  5
    logits   1 |  1  1  1  1  1  1 |  0  0  0  0  0  0  0  1  1  1  1
    seq 0    x |  .  .  .  .  .  . |  .  .  .  .  .  .  .  .  .  .  .   accepted text
    seq 1    x |  .  .  .  .  .  . |  .  .  .  x  .  .  .  x  .  .  .   window column 0
    seq 2    x |  .  .  .  .  .  . |  x  .  .  .  x  .  .  .  x  .  .   window column 1
    seq 3    x |  .  .  .  .  .  . |  x  x  .  .  .  x  .  .  .  x  .   window column 2
    seq 4    x |  .  .  .  .  .  . |  x  x  x  .  .  .  x  .  .  .  x   window column 3
    seq 5    x |  x  x  x  .  .  . |  .  .  .  .  .  .  .  .  .  .  .   candidate 0
    seq 6    x |  .  .  .  x  x  x |  .  .  .  .  .  .  .  .  .  .  .   candidate 1

Column i reads, position by position: I, level 0 of columns 1..i, then its own levels 1..N-2;
its last level's output guesses the next position. Sequence ids: 0 the accepted text, 1..W the window columns,
W + 1..W + G the candidates, so a context needs ``W + G + 1`` sequences. Before the decode
every other sequence shares sequence 0's cells (the prefix); after it, the accepted
candidate's cells join sequence 0 and sequences 1..W + G are emptied: between steps only
sequence 0 holds anything (the window is decoded anew each step, as in llama.cpp).

After the decode: the target verifies the candidates (acceptance.verify_branches); each
column's N-gram (its level-0 token, its levels 1..N-2, the new guess) goes into the pool;
the levels move up by one and the new guesses become the last level; each further accepted
token moves them up once more, so every guess stays at its position.

On a small CPU a decode of n tokens costs far more than one, so by default (``adaptive``)
candidates are cut to the length the cost curve pays for (DraftLength, as lookup does), and
further candidates and the window ride along only where the curve says they are nearly
free. With ``adaptive=False`` every step carries the whole window and all G candidates, as
llama.cpp's ``llama-lookahead`` does; that is the setting for a GPU.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._llama import Context, Row, max_sequences
from .config import LookaheadConfig, SamplingConfig
from .draft_length import DraftLength
from .drafters import Proposal, Tree
from .errors import ConfigError
from .lookup import appended

# A row or branch is added "for free" when it makes the decode at most this much dearer.
FREE = 0.05


class NgramPool:
    """N-grams seen so far, keyed by their first token: the candidates to verify.

    Each n-gram also remembers the ``CONTEXT`` tokens before it. Candidates whose context
    matches the text's come first, longest match first (a match of several tokens is better
    evidence that the text is repeating), then the most recent. At most ``per_key``
    continuations are kept per first token; the oldest go.
    """

    CONTEXT = 3

    def __init__(self, n: int, per_key: int = 16) -> None:
        if n < 2:
            raise ConfigError(f"lookahead n-grams need N >= 2, got {n}")
        self.n, self.per_key = n, per_key
        # first token -> continuation (n - 1 tokens) -> the tokens before the n-gram
        self._grams: Dict[int, "OrderedDict[Tuple[int, ...], Tuple[int, ...]]"] = {}

    def __len__(self) -> int:
        return sum(len(c) for c in self._grams.values())

    def add(self, ngram: Sequence[int], before: Sequence[int] = ()) -> None:
        """Remember ``ngram`` (``n`` tokens), seen after the tokens ``before``."""
        if len(ngram) != self.n:
            raise ValueError(f"expected {self.n} tokens, got {len(ngram)}")
        conts = self._grams.setdefault(int(ngram[0]), OrderedDict())
        cont = tuple(int(t) for t in ngram[1:])
        conts.pop(cont, None)
        conts[cont] = tuple(int(t) for t in before[-self.CONTEXT:])  # most recent last
        if len(conts) > self.per_key:
            conts.popitem(last=False)

    def add_text(self, tokens: Sequence[int], start: int = 0) -> None:
        """Add every n-gram of ``tokens`` that ends at or after index ``start``."""
        for i in range(max(0, start - self.n + 1), len(tokens) - self.n + 1):
            self.add(tokens[i:i + self.n], tokens[max(0, i - self.CONTEXT):i])

    def candidates(self, before: Sequence[int], key: int, g: int) -> List[Tuple[List[int], int]]:
        """Up to ``g`` continuations of ``key``, best first, each with how many of the tokens
        before it match the end of ``before``."""
        conts = self._grams.get(int(key))
        if not conts:
            return []
        scored = [(list(cont), _suffix_match(ctx, before)) for cont, ctx in reversed(conts.items())]
        scored.sort(key=lambda item: -item[1])  # stable: the most recent first among equals
        return scored[:g]


def _suffix_match(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens at the end of ``a`` equal those at the end of ``b``."""
    n = 0
    while n < len(a) and n < len(b) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


class Window:
    """The Jacobi guesses: ``levels[j, i]`` guesses the token at n_past + i + j (level 0,
    column 0 is the pending token itself)."""

    def __init__(self, w: int, n: int, seed_tokens: Sequence[int]) -> None:
        self.w, self.n = w, n
        rng = np.random.default_rng(0)  # guesses only change speed, never the output
        pool = np.asarray(seed_tokens if len(seed_tokens) else [0], dtype=np.int64)
        self.levels = rng.choice(pool, size=(n - 1, w))

    def rows(self, first_seq: int) -> List[Row]:
        """The window's batch rows, column i on sequence ``first_seq + i``; logits on the last level."""
        w, last = self.w, self.n - 2
        seqs = [first_seq + i for i in range(w)]
        rows: List[Row] = [(int(self.levels[0, i]), i, seqs[i:], last == 0) for i in range(1, w)]
        for j in range(1, self.n - 1):
            rows += [(int(self.levels[j, i]), i + j, [seqs[i]], j == last) for i in range(w)]
        return rows

    def advance(self, before: Sequence[int], guesses: np.ndarray,
                moves: int) -> List[Tuple[List[int], List[int]]]:
        """Take the new guesses (one per column), return each column's n-gram with the tokens
        before it, and move the levels up ``moves`` times (1 + the accepted draft tokens).
        ``before`` is the text up to the pending token, which is included."""
        self.levels[0, 0] = before[-1]
        line = [*before[-NgramPool.CONTEXT - 1:-1], *self.levels[0].tolist()]  # the text, then level 0
        offset = len(line) - self.w
        grams = [([*self.levels[:, i].tolist(), int(guesses[i])], line[max(0, offset + i - NgramPool.CONTEXT):offset + i])
                 for i in range(self.w)]
        for step in range(moves):
            refill = guesses if step == 0 else self.levels[0].copy()
            self.levels[:-1] = self.levels[1:].copy()
            self.levels[-1] = refill
        return grams


class LookaheadDrafter:
    """Proposes pool candidates and carries the lookahead window in the same decode."""

    name = "lookahead"

    def __init__(self, target: Context, config: LookaheadConfig, length: DraftLength,
                 references: Sequence[Sequence[int]] = ()) -> None:
        check_fits(config, target.n_ctx, target.n_batch)
        if target.n_seq_max < config.w + config.g + 1:
            raise ConfigError(f"lookahead needs a context with W + G + 1 = {config.w + config.g + 1} sequences")
        self.target, self.config, self.length = target, config, length
        self.pool = NgramPool(config.n, per_key=max(16, config.g))
        for ref in references:
            self.pool.add_text(ref)
        self.window: Optional[Window] = None
        self._seen: List[int] = []  # the text already added to the pool
        self._guesses: Optional[np.ndarray] = None
        self._first = -1  # the best candidate's first token, when it was not verified
        self._match = 0
        self.hits = 0

    def contexts(self) -> List[Context]:
        return []  # the window and the candidates live in the target's context

    def prefill(self, tokens: Sequence[int]) -> None:
        self.hits = 0  # per generation; the pool lives on
        self._learn_text(tokens)
        if self.window is None and self.config.w > 0:
            self.window = Window(self.config.w, self.config.n, tokens)

    def _learn_text(self, tokens: Sequence[int]) -> None:
        new = appended(self._seen, tokens)
        start = len(self._seen) if new is not None else 0
        self.pool.add_text(tokens, start)
        self._seen = list(tokens)

    def propose(self, tokens: Sequence[int], max_len: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        cfg = self.config
        cands = self.pool.candidates(tokens[-1 - NgramPool.CONTEXT:-1], tokens[-1], cfg.g)
        self._match = 1 + cands[0][1] if cands else 0
        self._first = cands[0][0][0] if cands else -1
        k = min(cfg.n - 1, max_len)
        if cfg.adaptive and cands:
            k = self.length.choose(k, self._match)
        branches = [c[:k] for c, _ in cands] if k > 0 else []
        if cfg.adaptive and branches:
            branches = branches[: self._free_branches(len(branches), k)]
        room = min(self.target.n_ctx - len(tokens), self.target.n_batch) - 1
        n_rows = sum(len(b) for b in branches)
        window = self.window is not None and n_rows + cfg.w * (cfg.n - 1) - 1 <= room
        if window and cfg.adaptive:
            window = self._free(1 + n_rows, cfg.w * (cfg.n - 1) - 1)
        if not window and len(branches) <= 1:
            return Proposal(branches[0] if branches else [])  # the plain path: one draft on seq 0
        return Proposal(tree=self._tree(branches, window))

    def _free(self, n_rows: int, extra: int) -> bool:
        costs = self.length.costs
        return costs.cost(n_rows + extra) <= (1 + FREE) * costs.cost(n_rows)

    def _free_branches(self, n: int, k: int) -> int:
        used = 1
        while used < n and self._free(1 + used * k, k):
            used += 1
        return used

    def _tree(self, branches: List[List[int]], window: bool) -> Tree:
        w = self.config.w
        rows: List[Row] = []
        outputs: List[List[int]] = []
        seqs = [1 + w + g for g in range(len(branches))]
        for seq, branch in zip(seqs, branches):
            outputs.append([1 + len(rows) + j for j in range(len(branch))])
            rows += [(t, j + 1, [seq], True) for j, t in enumerate(branch)]
        first_guess = 1 + len(rows)
        if window and self.window is not None:
            rows += self.window.rows(first_seq=1)

        def on_decoded(logits: np.ndarray) -> None:
            if not window:
                return
            out = logits[first_guess:].argmax(axis=1)
            if self.config.n == 2:  # the last level is level 0: column 0's guess is the pending row's
                out = np.concatenate([[logits[0].argmax()], out])
            self._guesses = out

        return Tree(branches, seqs or [0], outputs, rows, on_decoded)

    def accepted(self, tokens: Sequence[int], n_drafted: int, n_accepted: int) -> None:
        if n_drafted and self.config.adaptive:
            self.length.record(self._match, min(n_drafted, self.config.n - 1), n_accepted)
        elif not n_drafted and self._first >= 0:
            # Not verified, but this step shows whether the best candidate's first token was
            # right: free evidence, so lookahead that stopped proposing can learn to start again.
            self.length.record(self._match, 1, int(self._first == tokens[-1]))
        self._first = -1
        self.hits += n_accepted > 0  # steps that accepted a pool candidate
        if self._guesses is not None and self.window is not None:
            before = tokens[-NgramPool.CONTEXT - 2 - n_accepted:len(tokens) - 1 - n_accepted]
            for gram, before in self.window.advance(before, self._guesses, 1 + n_accepted):
                self.pool.add(gram, before)
        self._guesses = None
        self._learn_text(tokens)

    def finish(self, tokens: Sequence[int]) -> None:
        pass

    def extra_stats(self) -> Dict[str, int]:
        return {"pool_size": len(self.pool), "pool_hits": self.hits}


def check_fits(config: LookaheadConfig, n_ctx: int, n_batch: int) -> int:
    """Refuse, before anything is loaded or decoded, a window and candidates that a context of
    ``n_ctx`` tokens and batches of ``n_batch`` cannot hold. Returns the sequences needed."""
    n_seq = config.w + config.g + 1
    if n_seq > max_sequences():
        raise ConfigError(f"lookahead needs W + G + 1 = {n_seq} KV-cache sequences; llama.cpp allows "
                          f"at most {max_sequences()}")
    rows = (config.w + config.g) * (config.n - 1)
    if rows > n_batch:
        raise ConfigError(f"a lookahead step decodes up to (W + G) * (N - 1) = {rows} tokens but a batch "
                          f"holds {n_batch}; lower W, G or N")
    if rows + 1 > n_ctx // 2:
        raise ConfigError(f"a lookahead step needs {rows + 1} cells beyond the text, more than half the "
                          f"{n_ctx}-token context; lower W, G or N or raise the context size (-c)")
    return n_seq
