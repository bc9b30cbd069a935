"""What draft heads learn from: the target's last hidden state at every row of a text and the
target's own token there (its argmax: the token it would emit next), read in the same decodes.

Head k at row i learns ``labels[i + k]``: the token the target would choose k places later, in
the same piece of text. On the target's own answers that is the text itself; on other text
(source code, documentation) it is what the target would have written next at each place.

    piece       rows: hidden states (d floats each)   labels: the target's argmax per row
    answer      the prompt's last row, then one row per generated token (greedy, plain decoding)
    text        windows of n_batch tokens, each read from position 0 in one decode
"""

from __future__ import annotations

import importlib.metadata
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError
from ..llama.binding import Context, Model
from ..llama.chat import ChatTemplate

PROMPTS = Path(__file__).resolve().parent.parent / "data" / "heads_prompts.txt"


@dataclass(frozen=True)
class Piece:
    """A text to read (``kind`` "text") or a prompt the target answers (``kind`` "answer",
    ``text`` the user's message)."""

    kind: str
    text: str
    name: str = ""


TOP = 8  # the target's most likely tokens kept per row, with their probabilities
SPREAD = 8.0  # nats below a row's best where its TOP tokens are looked for
CHUNK = 16  # rows of logits worked on at once: temporaries of a few MB, reused, not a window's 300 MB fresh


def best(logits: np.ndarray, k: int = TOP) -> Tuple[np.ndarray, np.ndarray]:
    """Each row's ``k`` most likely tokens (n, k), best first (the argmax: the first of equal
    bests), and their probabilities under the row's softmax. Only tokens within SPREAD nats of
    the row's best are looked at (one further below has under e^-8, 0.03%, of the best's
    probability); where fewer are, the row is filled with its best token at probability 0.
    (np.argpartition over the 1.5B's vocabulary, and the fresh memory of temporaries as large as
    512 rows of logits, took 2.8 s a window on 2 cores: as long as decoding it.)"""
    n = len(logits)
    ids, p = np.zeros((n, k), np.int64), np.zeros((n, k), np.float32)
    for start in range(0, n, CHUNK):
        part = logits[start:start + CHUNK]
        m = part.max(axis=1)
        log_z = m + np.log(np.exp(part - m[:, None]).sum(axis=1))
        rows, cols = np.nonzero(part >= (m - SPREAD)[:, None])
        values = part[rows, cols]
        order = np.lexsort((-values, rows))  # by row, then best first; equal values keep the vocabulary's order
        rows, cols, values = rows[order], cols[order], values[order]
        rank = np.arange(len(rows)) - np.searchsorted(rows, rows)  # place within its row
        keep = rank < k
        ids[start:start + len(part)] = cols[rank == 0][:, None]
        ids[start + rows[keep], rank[keep]] = cols[keep]
        p[start + rows[keep], rank[keep]] = np.exp(values[keep] - log_z[rows[keep]])
    return ids, p


@dataclass
class States:
    """Rows of hidden states (n, d) with the target's token after each (n,), the piece each row
    belongs to (n,), the target's TOP most likely tokens and their probabilities at each row
    (n, TOP): its distribution there, a richer label than its choice (self-distillation), and
    the token the text goes on with after each row (n,; -1 at a piece's end): the pending token
    the heads read beside the row's state (the target's own choice on its answers)."""

    hidden: np.ndarray
    labels: np.ndarray
    piece: np.ndarray
    top: np.ndarray
    top_p: np.ndarray
    next: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def ahead(self, k: int, rows: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
        """(rows, labels): every row (of ``rows``) whose piece goes on k more rows, and the
        target's token k rows later: head k's examples."""
        idx = np.arange(len(self) - k) if rows is None else rows[rows < len(self) - k]
        idx = idx[self.piece[idx + k] == self.piece[idx]]
        return idx, self.labels[idx + k]

    @staticmethod
    def joined(parts: Sequence["States"], d: int) -> "States":
        if not parts:
            return States(np.zeros((0, d), np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64),
                          np.zeros((0, TOP), np.int64), np.zeros((0, TOP), np.float32), np.zeros(0, np.int64))
        return States(*(np.concatenate([getattr(p, f) for p in parts])
                        for f in ("hidden", "labels", "piece", "top", "top_p", "next")))


def read(ctx: Context, tokens: Sequence[int], piece: int) -> States:
    """The target's hidden states and argmax at every row of ``tokens``, read in windows of
    n_batch tokens, each from an empty cache."""
    parts = []
    for start in range(0, len(tokens), ctx.n_batch):
        window = tokens[start:start + ctx.n_batch]
        ctx.seq_rm(0, -1, -1)
        ctx.decode_rows([(t, i, (0,), True) for i, t in enumerate(window)], hidden=True)
        n = len(window)
        top, top_p = best(ctx.logits(n))
        parts.append(States(np.array(ctx.hidden(n)), top[:, 0], np.full(n, piece * 1_000_000 + start), top, top_p,
                            np.array(list(window[1:]) + [-1], np.int64)))
    ctx.seq_rm(0, -1, -1)
    return States.joined(parts, ctx.model.n_embd)


def answer(ctx: Context, model: Model, prompt: Sequence[int], n_new: int, piece: int) -> States:
    """The target's greedy answer to ``prompt`` (plain decoding, up to ``n_new`` tokens or an end
    of generation): the prompt's last row and every generated token's, as they are read."""
    ctx.seq_rm(0, -1, -1)
    prompt = list(prompt)[-(ctx.n_ctx - n_new - 1):]
    for start in range(0, len(prompt) - 1, ctx.n_batch):  # all but the last token: no outputs needed
        chunk = prompt[start:min(start + ctx.n_batch, len(prompt) - 1)]
        ctx.decode_rows([(t, start + i, (0,), False) for i, t in enumerate(chunk)])
    hidden, labels, tops = [], [], []
    token, pos = prompt[-1], len(prompt) - 1
    for _ in range(n_new + 1):
        ctx.decode_rows([(token, pos, (0,), True)], hidden=True)
        hidden.append(np.array(ctx.hidden(1)[0]))
        top, top_p = best(ctx.logits(1))
        tops.append((top, top_p))
        token, pos = int(top[0, 0]), pos + 1
        labels.append(token)
        if model.is_eog(token):
            break
    ctx.seq_rm(0, -1, -1)
    return States(np.array(hidden, dtype=np.float32), np.array(labels), np.full(len(labels), piece * 1_000_000),
                  np.concatenate([t[0] for t in tops]), np.concatenate([t[1] for t in tops]), np.array(labels))


def output_rows(model_path: Path, tokens: np.ndarray) -> np.ndarray:
    """The target's output matrix E: its rows for ``tokens`` (N, d) float32, dequantized from the
    GGUF file: ``output.weight``, or ``token_embd.weight`` where the model ties its output matrix
    to its embeddings."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    tensors = {t.name: t for t in GGUFReader(str(model_path)).tensors}
    t = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if t is None:
        raise ConfigError(f"{model_path.name} has no output matrix (output.weight or token_embd.weight)")
    rows = np.asarray(t.data)[np.asarray(tokens, np.int64)]
    return np.ascontiguousarray(dequantize(rows, t.tensor_type), dtype=np.float32).reshape(len(tokens), -1)


def default_texts(seed: int = 0) -> List[Piece]:
    """The default mix: answers to the prompts of ``data/heads_prompts.txt``, then, in an order
    the seed shuffles, Python's standard library (code) and installed packages' descriptions
    (documentation), which ``collect`` reads until it has enough tokens."""
    pieces = [Piece("answer", line.strip(), f"prompt {i + 1}")
              for i, line in enumerate(PROMPTS.read_text(encoding="utf-8").splitlines()) if line.strip()]
    rng = random.Random(seed)
    code = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    rng.shuffle(code)
    docs = []
    for dist in sorted(importlib.metadata.distributions(), key=lambda d: d.metadata.get("Name") or ""):
        text = dist.metadata.get_payload() if hasattr(dist.metadata, "get_payload") else None  # type: ignore[attr-defined]
        if isinstance(text, str) and len(text) > 2000:
            docs.append(Piece("text", text, f"{dist.metadata.get('Name')} description"))
    rng.shuffle(docs)
    texts = [Piece("text", p.read_text(encoding="utf-8", errors="replace"), str(p)) for p in code[:200]]
    mixed = [x for pair in zip(texts, docs + [None] * len(texts)) for x in pair if x is not None]
    return pieces + mixed


def file_texts(paths: Sequence[Path]) -> List[Piece]:
    return [Piece("text", p.read_text(encoding="utf-8", errors="replace"), str(p)) for p in paths]


def collect(model: Model, ctx: Context, pieces: Sequence[Piece], max_tokens: int, answer_tokens: int,
            progress: Callable[[int], None] = lambda n: None) -> Tuple[States, bool]:
    """The target's states on ``pieces`` until ``max_tokens`` rows (``answer_tokens`` generated
    per prompt). Returns them and whether a Ctrl-C cut the reading short (what was read is kept)."""
    template: Optional[ChatTemplate] = None
    parts: List[States] = []
    n = 0
    try:
        for i, piece in enumerate(pieces):
            if n >= max_tokens:
                break
            if piece.kind == "answer":
                template = template or ChatTemplate(model)
                prompt = model.tokenize(template.render([{"role": "user", "content": piece.text}]),
                                        add_special=False, parse_special=True)
                got = answer(ctx, model, prompt, min(answer_tokens, max_tokens - n), i)
            else:
                tokens = model.tokenize(piece.text, add_special=True, parse_special=False)[:max_tokens - n]
                got = read(ctx, tokens, i)
            parts.append(got)
            n += len(got)
            progress(len(got))
    except KeyboardInterrupt:
        ctx.seq_rm(0, -1, -1)
        return States.joined(parts, model.n_embd), True
    return States.joined(parts, model.n_embd), False

