"""What draft heads learn from: the target's last hidden state at every row of a text and the
target's own token there (its argmax: the token it would emit next), read in the same decodes.

Head k at row i learns ``labels[i + k]``: the token the target would choose k places later, in
the same piece of text. On the target's own answers that is the text itself; on other text
(source code, documentation) it is what the target would have written next at each place.

    piece       rows: hidden states (d floats each)   labels: the target's argmax per row
    answer      the prompt's last row, then one row per generated token (greedy, plain decoding;
                GROUP answers decoded together, one row each per decode, a prompt begun where
                an answer ended)
    text        windows of n_batch tokens, each read from position 0 in one decode
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import random
import stat
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError
from ..llama.binding import Context, Model
from ..sequences import BatchRow
from ..llama.chat import ChatTemplate

PROMPTS = Path(__file__).resolve().parent.parent / "data" / "heads_prompts.txt"


@dataclass(frozen=True)
class Piece:
    """A text to read (``kind`` "text"), a text file read when its turn comes (``kind`` "file",
    ``name`` its path) or a prompt the target answers (``kind`` "answer", ``text`` the user's
    message)."""

    kind: str
    text: str
    name: str = ""


TOP = 8  # the target's most likely tokens kept per row, with their probabilities
SPREAD = 8.0  # nats below a row's best where its TOP tokens are looked for
GROUP = 32  # answers decoded together: a decode of 32 rows costs far less than 32 single ones
CHUNK = 16  # rows of logits worked on at once: temporaries of a few MB, reused, not a window's 300 MB fresh


def best(logits: np.ndarray, k: int = TOP) -> Tuple[np.ndarray, np.ndarray]:
    """Each row's ``k`` most likely tokens (n, k), best first (the argmax: the first of equal
    bests), and their probabilities under the row's softmax. Only tokens within SPREAD nats of
    the row's best are looked at (one further below has under e^-8, 0.03%, of the best's
    probability); where fewer are, the row is filled with its best token at probability 0.
    (np.argpartition over the vocabulary, and the fresh memory of temporaries as large as 512
    rows of logits, took as long as decoding the window: docs/results.md, "Draft heads".)"""
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


FIELDS = ("hidden", "labels", "piece", "top", "top_p", "next")  # States' arrays, one row each


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

    def along(self, rows: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """(rows k later, whether each is still in its row's piece): the rows held where a
        valid one is not (the last row, or the row itself)."""
        ahead = rows + k
        valid = ahead < len(self)
        valid[valid] = self.piece[ahead[valid]] == self.piece[rows[valid]]
        return np.where(valid, ahead, rows), valid

    def first(self, n: int) -> "States":
        """The first ``n`` rows."""
        return States(*(getattr(self, f)[:n] for f in FIELDS))

    @staticmethod
    def joined(parts: Sequence["States"], d: int) -> "States":
        if not parts:
            return States(np.zeros((0, d), np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64),
                          np.zeros((0, TOP), np.int64), np.zeros((0, TOP), np.float32), np.zeros(0, np.int64))
        return States(*(np.concatenate([getattr(p, f) for p in parts]) for f in FIELDS))


def read(ctx: Context, tokens: Sequence[int], piece: int, deadline: float = math.inf) -> States:
    """The target's hidden states and argmax at every row of ``tokens``, read in windows of
    n_batch tokens, each from an empty cache, until ``deadline`` (``perf_counter``'s time)."""
    parts = []
    for start in range(0, len(tokens), ctx.n_batch):
        if perf_counter() >= deadline:
            break
        window = tokens[start:start + ctx.n_batch]
        ctx.seq_rm(0, -1, -1)
        ctx.decode_rows([BatchRow(t, i, (0,), True) for i, t in enumerate(window)], hidden=True)
        n = len(window)
        top, top_p = best(ctx.logits(n))
        parts.append(States(np.array(ctx.hidden(n)), top[:, 0], np.full(n, piece * 1_000_000 + start), top, top_p,
                            np.array(list(window[1:]) + [-1], np.int64)))
    ctx.seq_rm(0, -1, -1)
    return States.joined(parts, ctx.model.n_embd)


def answers(ctx: Context, model: Model, prompts: Sequence[Sequence[int]], n_new: int, pieces: Sequence[int],
            progress: Callable[[int], None] = lambda n: None, deadline: float = math.inf
            ) -> Tuple[List[States], bool]:
    """The target's greedy answers to ``prompts`` (up to ``n_new`` tokens each or an end of
    generation), decoded together until ``deadline``: as many at once as the context has
    sequences, a prompt taking the sequence of an answer that ended (continuous batching), one
    row per answer going on in each decode. Each answer's rows: its prompt's last row, then every
    generated token's, as they are read; ``pieces[j]`` names answer j's rows. Returns the answers,
    and whether a Ctrl-C cut them short (the rows read so far are kept, as at the deadline).

        decode t:   seq 0  seq 1  seq 2      (a prompt takes the sequence of an answer that ended)
        rows        a0[t]  a4[t]  a2[t]      each row's argmax is its answer's token after it

    Every decode thus has a row in each sequence until the prompts run out (with answers decoded
    in groups that ended together, the decodes grew thinner as answers ended, and thin decodes
    cost nearly as much as full ones: docs/results.md, "Draft heads").
    The prompts' shared prefix (the chat template's system message) is read once and kept in
    every sequence; the rest of each prompt is read when it takes its sequence, side by side
    with the others starting then, without outputs. A decode of many rows may leave plain
    decoding's text at near-ties (most of the default answers did, at top-2 probabilities a
    hundredth apart): the labels are still the target's own tokens as read.
    """
    n_ctx = ctx.n_ctx // ctx.n_seq_max
    prompts = [list(p)[-(n_ctx - n_new - 1):] for p in prompts]
    rows: List[List[Tuple[np.ndarray, np.ndarray, np.ndarray]]] = [[] for _ in prompts]  # (hidden, top, top_p)
    waiting = list(range(len(prompts)))[::-1]  # prompts not yet begun, the next last
    free = list(range(min(ctx.n_seq_max, len(prompts))))[::-1]  # sequences without an answer
    going: Dict[int, Tuple[int, int, int]] = {}  # sequence: (answer, token, position)
    cut = False
    try:
        ctx.seq_rm(-1, -1, -1)
        shared = _shared_prefix([p[:-1] for p in prompts]) if prompts else 0
        _decode_all(ctx, [BatchRow(t, i, (0,), False) for i, t in enumerate(prompts[0][:shared])] if shared else [])
        for seq in range(1, len(free) if shared else 0):
            ctx.seq_cp(0, seq)
        while True:
            begun = [(free.pop(), waiting.pop()) for _ in range(min(len(free), len(waiting)))]
            _decode_all(ctx, [BatchRow(t, shared + i, (seq,), False)
                              for seq, j in begun for i, t in enumerate(prompts[j][shared:-1])])
            going.update((seq, (j, prompts[j][-1], len(prompts[j]) - 1)) for seq, j in begun)
            seqs = list(going)
            if not seqs or perf_counter() >= deadline:
                break
            ctx.decode_rows([BatchRow(going[s][1], going[s][2], (s,), True) for s in seqs], hidden=True)
            hidden = np.array(ctx.hidden(len(seqs)))
            top, top_p = best(ctx.logits(len(seqs)))
            for r, s in enumerate(seqs):
                j, _, pos = going[s]
                rows[j].append((hidden[r], top[r], top_p[r]))
                going[s] = (j, int(top[r, 0]), pos + 1)
                if model.is_eog(int(top[r, 0])) or len(rows[j]) > n_new:
                    del going[s]
                    ctx.seq_rm(s, shared, -1)  # the prefix stays for the next prompt
                    free.append(s)
            progress(len(seqs))
    except KeyboardInterrupt:
        cut = True
    ctx.seq_rm(-1, -1, -1)
    parts = []
    for j, got in enumerate(rows):
        if got:
            hidden, top, top_p = (np.stack(x) for x in zip(*got))
            parts.append(States(hidden.astype(np.float32), top[:, 0], np.full(len(got), pieces[j] * 1_000_000),
                                top, top_p, top[:, 0].copy()))
    return parts, cut


def _decode_all(ctx: Context, rows: Sequence[BatchRow]) -> None:
    for start in range(0, len(rows), ctx.n_batch):
        ctx.decode_rows(rows[start:start + ctx.n_batch])


def _shared_prefix(texts: Sequence[Sequence[int]]) -> int:
    """How many first tokens every one of ``texts`` has in common."""
    n = min(len(t) for t in texts)
    return next((i for i in range(n) if any(t[i] != texts[0][i] for t in texts)), n)


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
    """The default mix: answers to the prompts of ``data/heads_prompts.txt`` (421), then, in an order
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


BLOCK = 1 << 20  # bytes of a training file read, checked and tokenized at a time


def file_texts(paths: Sequence[Path]) -> List[Piece]:
    """The files given, as pieces read when their turn comes (``file_tokens``): none is held whole."""
    return [Piece("file", "", str(p)) for p in paths]


def check_text_file(path: Path) -> None:
    """ConfigError unless ``path`` is a regular file whose first block is text (``blocks``):
    checked before the target loads, so that a binary file is refused at once. A file of any size
    is taken: it is read only as far as the tokens wanted (``file_tokens``)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"no such training file: {path}" if isinstance(e, FileNotFoundError)
                          else f"cannot read training file {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"training file {path} is not a regular file (a device or a pipe is never read)")
    try:
        with open(path, "rb") as f:
            first = f.read(BLOCK)
            final = not f.read(1)
    except OSError as e:
        raise ConfigError(f"cannot read training file {path}: {e.strerror or e}") from None
    _utf8(first, 0, path, final)


def file_tokens(model: Model, path: Path, max_tokens: int) -> List[int]:
    """The first ``max_tokens`` tokens of a text file (a BOS first), read and tokenized a block at
    a time until there are that many: memory for the tokens used, whatever the file's size (a
    file is often far longer than the text a training reads). Blocks end at a line's end, where
    the tokenizer's words end too."""
    tokens: List[int] = []
    texts = blocks(path, BLOCK)
    try:
        for text in texts:
            tokens += model.tokenize(text, add_special=not tokens, parse_special=False)
            if len(tokens) >= max_tokens:
                break
    finally:
        texts.close()
    return tokens[:max_tokens]


def blocks(path: Path, size: int = BLOCK) -> Iterator[str]:
    """A text file's text about ``size`` bytes at a time, each piece cut after its last line's end
    (or, in a line longer than that, between two characters). ConfigError, naming the file and
    the offset, at a NUL byte (a binary file) or bytes that are not UTF-8: refused, not read with
    replacement characters the target would learn from."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ConfigError(f"cannot read training file {path}: {e.strerror or e}") from None
    with f:
        offset, carry = 0, b""  # where ``carry``, the bytes after the last piece, begin
        while True:
            read = f.read(size)
            data = carry + read
            text, left = _utf8(data, offset, path, final=not read)  # every byte read is checked
            cut = len(text) if not read else text.rfind("\n") + 1 or len(text)
            if cut:
                yield text[:cut]
            carry = text[cut:].encode("utf-8") + left
            offset += len(data) - len(carry)
            if not read:
                return


def _utf8(data: bytes, offset: int, path: Path, final: bool) -> Tuple[str, bytes]:
    """``data``'s text, found at ``offset`` of the file, and the bytes of a character its end cut
    (unless ``final``: the file's end), kept for the next block."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise ConfigError(f"training file {path} is not text: a NUL byte at offset {offset + nul:,}")
    try:
        return data.decode("utf-8"), b""
    except UnicodeDecodeError as e:
        if not final and e.reason == "unexpected end of data":
            return data[:e.start].decode("utf-8"), data[e.start:]
        raise ConfigError(f"training file {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                          f"{offset + e.start:,})") from None


def collect(model: Model, ctx: Context, pieces: Sequence[Piece], max_tokens: int, answer_tokens: int,
            progress: Callable[[int], None] = lambda n: None, deadline: float = math.inf) -> Tuple[States, bool]:
    """The target's states on ``pieces`` until ``max_tokens`` rows or ``deadline``
    (``perf_counter``'s time; a decode begun before it ends after it), ``answer_tokens``
    generated per prompt (consecutive prompts answered together, as many at once as the context
    has sequences, ``answers``). Returns them and whether a Ctrl-C cut the reading short (what was read is kept)."""
    template: Optional[ChatTemplate] = None
    parts: List[States] = []
    n, i = 0, 0
    try:
        while i < len(pieces) and n < max_tokens and perf_counter() < deadline:
            if pieces[i].kind == "answer":
                template = template or ChatTemplate(model)
                n_new = min(answer_tokens, max_tokens - n)
                room = -(-(max_tokens - n) // (n_new + 1))  # answers the rows left can hold (n_new + 1 rows each)
                group = [i]
                while len(group) < room and i + len(group) < len(pieces) and pieces[i + len(group)].kind == "answer":
                    group.append(i + len(group))
                prompts = [model.tokenize(template.render([{"role": "user", "content": pieces[j].text}]),
                                          add_special=False, parse_special=True) for j in group]
                got, cut = answers(ctx, model, prompts, n_new, group, progress, deadline)
                i += len(group)
            else:
                tokens = file_tokens(model, Path(pieces[i].name), max_tokens - n) if pieces[i].kind == "file" \
                    else model.tokenize(pieces[i].text, add_special=True, parse_special=False)[:max_tokens - n]
                got, cut = [read(ctx, tokens, i, deadline)], False
                progress(len(got[0]))
                i += 1
            for g in got:
                parts.append(g.first(max_tokens - n))
                n += len(parts[-1])
            if cut:
                return States.joined(parts, model.n_embd), True
    except KeyboardInterrupt:
        ctx.seq_rm(-1, -1, -1)
        return States.joined(parts, model.n_embd), True
    return States.joined(parts, model.n_embd), False
