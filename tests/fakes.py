"""A fake target context: logits are a function of the prefix, the KV cache is cells with
sequence ids. Fast tests of the engine's bookkeeping drive it instead of a model."""

from __future__ import annotations

from typing import List, Sequence, Set, Tuple

import numpy as np

V = 16  # vocabulary
EOS = 15


class FakeModel:
    n_vocab = V
    eos = EOS
    bos = 0
    path = None
    eog_tokens = frozenset({EOS})

    def piece(self, token: int) -> bytes:
        return b"<eos>" if token == EOS else f"{chr(ord('a') + token)}".encode()

    def is_control(self, token: int) -> bool:
        return token == EOS

    def tokenize_bytes(self, data: bytes) -> List[int]:
        """One token per letter a..o (what a grammar's matcher asks of a tokenizer)."""
        return [ord(c) - ord("a") for c in data.decode()]


def logits_of(prefix: Sequence[int], sharp: bool = True) -> np.ndarray:
    """The fake model: its distribution after ``prefix`` depends on the last two tokens only (a
    second-order chain, so texts repeat and lookup has something to copy). ``sharp``: one token
    far ahead (greedy is obvious); else a softer random distribution, the same for the same pair."""
    a, b = (list(prefix[-2:]) + [0, 0])[:2] if len(prefix) < 2 else prefix[-2:]
    rng = np.random.default_rng(1000 + 31 * int(a) + int(b))
    row = rng.normal(0, 1.0, V).astype(np.float32)
    row[EOS] = -30.0  # never ends by itself
    if sharp:
        row[(3 * int(b) + int(a) + 1) % (V - 1)] += 8.0
    return row


class FakeContext:
    """Enough of ``llama.binding.Context`` for the engine: decode_rows, seq_rm, seq_cp, logits.

    The cache is a list of cells ``(position, token, sequence ids)``; ``cells(seq)`` reads a
    sequence back, so tests check the engine's KV bookkeeping like the real-model tests do."""

    def __init__(self, n_ctx: int = 256, n_batch: int = 64, n_seq_max: int = 16, sharp: bool = True) -> None:
        self.model = FakeModel()
        self.n_ctx, self.n_batch, self.n_seq_max = n_ctx, n_batch, n_seq_max
        self.threads = 1
        self.sharp = sharp
        self.t_llama = 0.0
        self._cells: List[Tuple[int, int, Set[int]]] = []
        self._out: np.ndarray = np.zeros((0, V), dtype=np.float32)
        self.decodes: List[int] = []  # rows per decode

    # --- the cache ----------------------------------------------------------------------
    def cells(self, seq: int) -> List[int]:
        """Tokens of sequence ``seq`` by position (a gap or a duplicate fails)."""
        mine = sorted((pos, tok) for pos, tok, seqs in self._cells if seq in seqs)
        assert [p for p, _ in mine] == list(range(len(mine))), f"sequence {seq} is not contiguous: {mine}"
        return [t for _, t in mine]

    def used_seqs(self) -> Set[int]:
        return {s for _, _, seqs in self._cells for s in seqs}

    def _prefix(self, pos: int, seq: int) -> List[int]:
        row = {p: t for p, t, seqs in self._cells if seq in seqs and p < pos}
        assert sorted(row) == list(range(pos)), f"sequence {seq} lacks cells before {pos}"
        return [row[p] for p in range(pos)]

    # --- decoding -----------------------------------------------------------------------
    def _decode(self, rows: List[Tuple[int, int, Sequence[int], bool]]) -> None:
        if len(rows) > self.n_batch or len(self._cells) + len(rows) > self.n_ctx:
            raise AssertionError("batch or cache overflow")
        self.decodes.append(len(rows))
        out = []
        for token, pos, seqs, logits in rows:
            assert 0 <= token < V and pos < self.n_ctx
            self._cells.append((pos, token, set(seqs)))
        for token, pos, seqs, logits in rows:
            if logits:
                out.append(logits_of(self._prefix(pos + 1, seqs[0]), self.sharp))
        self._out = np.array(out, dtype=np.float32).reshape(-1, V)

    # --- sequences (engine.py) ------------------------------------------------------------
    def decode_rows(self, rows: Sequence[Tuple[int, int, Sequence[int], bool]]) -> int:
        self._decode([(t, pos, tuple(ids), lg) for t, pos, ids, lg in rows])
        return len(self._out)

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        lo, hi = (p0 if p0 >= 0 else 0), (p1 if p1 >= 0 else 1 << 30)
        for _, _, seqs in [c for c in self._cells if lo <= c[0] < hi]:
            seqs.discard(seq)
        self._cells = [c for c in self._cells if c[2]]

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        lo, hi = (p0 if p0 >= 0 else 0), (p1 if p1 >= 0 else 1 << 30)
        for p, _, seqs in self._cells:
            if src in seqs and lo <= p < hi:
                seqs.add(dst)

    def logits(self, n_rows: int) -> np.ndarray:
        return self._out[:n_rows]

    def logits_ith(self, i: int) -> np.ndarray:
        return self._out[i]

    def pos_max(self, seq: int = 0) -> int:
        return max((p for p, _, seqs in self._cells if seq in seqs), default=-1)


def greedy_text(prompt: Sequence[int], n: int) -> List[int]:
    """What plain greedy decoding of the fake model emits after ``prompt``."""
    text = list(prompt)
    for _ in range(n):
        text.append(int(logits_of(text).argmax()))
    return text[len(prompt):]


def fake_prompt(n: int = 40, seed: int = 0) -> List[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, V - 1, n)]


def copying_prompt() -> List[int]:
    """A prompt whose greedy continuation repeats text of the prompt (the fake chain loops)."""
    start = [1, 2]
    return start + greedy_text(start, 60)


def check_kv(ctx: FakeContext, tokens: Sequence[int]) -> None:
    """Between steps: sequence 0 holds exactly tokens[:-1], no other sequence holds anything."""
    assert ctx.cells(0) == list(tokens[:-1])
    assert ctx.used_seqs() <= {0}, f"stale sequences {ctx.used_seqs()}"

