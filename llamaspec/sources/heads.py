"""Draft heads (Medusa-1) trained on this machine from the target's own hidden states.

The target's last hidden state h (llama.cpp's normalised output of the last layer, read in the
same decode as the logits) at the row that chose the pending token x[t+1] is what its output
matrix E turns into logits: ``logits = E h``. Head k (k = 1 .. K) guesses the token k places
after the pending one, x[t+1+k], from the same h::

    z_k = h + SiLU(W_k h + b_k)          a residual block (W_k, b_k trained; zero: z_k = h)
    p_k = softmax(E_N z_k)               E_N: E's rows for the N tokens of the map (frozen)

A head costs a d x d and an N x d product on a vector the target computed anyway. The N tokens
are the most frequent among the target's own choices on the training text (FR-Spec's idea);
a token outside them is never guessed.

Candidates form a sparse tree (Medusa's): every head's best ``RANKS`` tokens, combined along
paths, keeping the paths with the most expected accepted tokens; the acceptance model learns,
per head and decile of the head's probability for the token, how often a head's token is accepted
when the tokens before it were (evidence ``Guess(head, decile)``)::

    pending x[t+1]
      ├─ a   (head 1, best)   ├─ c (head 2, best) ── e (head 3, best)
      │                       └─ d (head 2, second)
      └─ b   (head 1, second) ── c

The heads file (``llamaspec heads train`` writes it) is an .npz: ``w`` (K, d, d) float16, ``b``
(K, d), ``tokens`` (N,) the map, ``meta`` (JSON: the model's file name and sha256, n_vocab,
n_embd, the training run's settings and each head's held-out top-1 and top-5). E_N is read from
the model's GGUF file when the heads are loaded.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..config import SamplingConfig, check
from ..errors import ConfigError
from .base import Budget, Candidate, Outcome, Proposal, Source
from .registry import Option, Plugin, Resources

NAME = "heads"
FORMAT = "llamaspec-heads-1"
MAX_HEADS = 8
RANKS = 4  # a head's best tokens that candidates may take
SUFFIX = ".heads.npz"


class HeadsError(ConfigError):
    """A heads file that cannot be read, or that was trained for another model."""


@dataclass(frozen=True)
class Guess:
    """A head's token: ``head`` (1: the token after the pending one), ``decile`` of the head's
    probability for the token (round(10 p))."""

    head: int
    decile: int


@dataclass(frozen=True)
class HeadsConfig:
    """``file``: a heads file (None: the one trained for the target where it is cached, see
    ``beside``); ``tree``: the tree's nodes at most."""

    file: Optional[str] = None
    tree: int = 16

    def __post_init__(self) -> None:
        check(1 <= self.tree <= 64, f"the heads' tree takes 1 to 64 nodes, got {self.tree}")


@functools.lru_cache(maxsize=1)
def _blas() -> Any:
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController()


def _one_thread() -> Any:
    """numpy's BLAS on one thread while the block runs."""
    return _blas().limit(limits=1, user_api="blas")


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


@functools.lru_cache(maxsize=8)
def _sha256(path: str, size: int, mtime: float) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def sha256_of(path: Path) -> str:
    """The file's sha256 (computed once per process for a file left as it is)."""
    st = path.stat()
    return _sha256(str(path), st.st_size, st.st_mtime)


def output_rows(model_path: Path, tokens: np.ndarray) -> np.ndarray:
    """E's rows for ``tokens`` (N, d) float32, dequantized from the GGUF file: ``output.weight``,
    or ``token_embd.weight`` where the model ties its output matrix to its embeddings."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    reader = GGUFReader(str(model_path))
    tensors = {t.name: t for t in reader.tensors}
    t = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if t is None:
        raise HeadsError(f"{model_path.name} has no output matrix (output.weight or token_embd.weight)")
    rows = np.asarray(t.data)[np.asarray(tokens)]
    return np.ascontiguousarray(dequantize(rows, t.tensor_type), dtype=np.float32).reshape(len(tokens), -1)


@dataclass(eq=False)
class Heads:
    """K heads over a map of N tokens: ``w`` (K, d, d), ``b`` (K, d), ``tokens`` (N,) vocabulary
    ids, ``out`` E_N (N, d) (None until read from the model), ``meta`` the file's record."""

    w: np.ndarray
    b: np.ndarray
    tokens: np.ndarray
    meta: Dict[str, Any]
    out: Optional[np.ndarray] = None

    @property
    def k(self) -> int:
        return self.w.shape[0]

    def hidden(self, h: np.ndarray) -> np.ndarray:
        """z (K, d) for one hidden state h (d,), or (K, B, d) for h (B, d)."""
        a = np.einsum("kij,...j->k...i", self.w, h) + (self.b if h.ndim == 1 else self.b[:, None, :])
        return h + silu(a)

    def logits(self, h: np.ndarray) -> np.ndarray:
        """Each head's logits over the map (K, N) for one hidden state h (d,), on one thread:
        OpenBLAS's other threads would spin on, taking the cores from llama.cpp's next decode
        (measured: SmolLM2's single decodes 5.5 ms -> 11 ms)."""
        assert self.out is not None
        with _one_thread():
            return self.hidden(h) @ self.out.T

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".part")
        with open(tmp, "wb") as f:
            np.savez(f, w=self.w.astype(np.float16), b=self.b.astype(np.float32),
                     tokens=self.tokens.astype(np.int32),
                     meta=np.frombuffer(json.dumps(self.meta).encode(), dtype=np.uint8))
        os.replace(tmp, path)

    @staticmethod
    def read(path: Path) -> "Heads":
        """The heads a file holds (HeadsError: not a heads file, truncated, another format)."""
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                heads = Heads(z["w"].astype(np.float32), z["b"].astype(np.float32), z["tokens"].astype(np.int64),
                              meta)
        except FileNotFoundError:
            raise HeadsError(f"no such heads file: {path}") from None
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as e:
            raise HeadsError(f"{path} is not a heads file or is cut short ({type(e).__name__}: {e}); "
                             f"train it again with `llamaspec heads train`") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise HeadsError(f"{path} is not a {FORMAT} file")
        k, d = heads.b.shape
        if heads.w.shape != (k, d, d) or heads.tokens.ndim != 1 or not 1 <= k <= MAX_HEADS:
            raise HeadsError(f"{path} holds heads of inconsistent shapes")
        return heads

    def check_model(self, model_path: Path, n_vocab: int, n_embd: int, where: Path) -> None:
        """HeadsError unless these heads were trained for the model in ``model_path``."""
        meta = self.meta
        if meta.get("n_vocab") != n_vocab or meta.get("n_embd") != n_embd or meta.get("sha256") != sha256_of(model_path):
            raise HeadsError(f"{where} was trained for {meta.get('model', 'another model')}, not {model_path.name}; "
                             f"train heads for it with `llamaspec heads train -m {model_path}`")
        if self.tokens.max(initial=0) >= n_vocab or self.b.shape[1] != n_embd:
            raise HeadsError(f"{where} does not fit {model_path.name}'s vocabulary")


def cached_path(model_path: Path, cache: Path) -> Path:
    """Where ``llamaspec heads train`` keeps the heads of ``model_path`` by default, and where
    they are found without ``--heads``: ``CACHE/heads/MODEL_FILE_NAME.heads.npz``."""
    return cache / "heads" / (model_path.name + SUFFIX)


def tree(guesses: Sequence[Sequence[Tuple[int, float]]], max_nodes: int, max_len: int) -> List[List[int]]:
    """Medusa's sparse tree: the paths of ranks (r_1, .., r_j) (r_i: the rank of head i's token)
    with the highest value, ``guesses[i][r]`` = (token, its estimated acceptance) of head i+1's
    rank r; a path's value is the product of its estimates. Returns the tree's leaves as rank
    paths, best first (each path's prefixes are in the tree: its value is at least theirs)."""
    depth = min(len(guesses), max_len)
    if depth == 0 or max_nodes <= 0:
        return []
    heap: List[Tuple[float, Tuple[int, ...]]] = [(-guesses[0][r][1], (r,)) for r in range(len(guesses[0]))]
    heapq.heapify(heap)
    chosen: List[Tuple[int, ...]] = []
    while heap and len(chosen) < max_nodes:
        value, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < depth:
            for r, (_, p) in enumerate(guesses[len(path)]):
                heapq.heappush(heap, (value * p, path + (r,)))
    inner = {p[:-1] for p in chosen}
    return [list(p) for p in chosen if p not in inner]


class HeadsSource(Source):
    """The heads' tree after the pending token, from the hidden state of the row that chose it
    (the last outcome's; nothing before the first step or after a text the engine changed)."""

    name = NAME
    own_gate = True  # its products cost time of their own: asked while what it brings repays them

    def __init__(self, heads: Heads, max_nodes: int) -> None:
        self.heads, self.max_nodes = heads, max_nodes
        self.max_len = heads.k
        self.at: Tuple[int, Optional[np.ndarray]] = (-1, None)  # (text length, its hidden state)

    def propose(self, tokens: Sequence[int], budget: Budget, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        n, h = self.at
        if h is None or n != len(tokens):
            return Proposal()
        guesses = []  # per head: (token, evidence, estimated acceptance) of its best RANKS
        for k, row in enumerate(self.heads.logits(h)[:min(self.heads.k, budget.max_len)], start=1):
            top = np.argpartition(row, -RANKS)[-RANKS:]
            p = np.exp(row[top] - row.max())
            p /= np.exp(row - row.max()).sum()
            keys = [Guess(k, int(round(10 * q))) for q in p]
            guesses.append([(int(self.heads.tokens[t]), key, budget.rates.get(key, PRIORS[key]))
                            for t, key in zip(top, keys)])
        paths = tree([[(t, rate) for t, _, rate in g] for g in guesses], self.max_nodes, budget.max_len)
        return Proposal(tuple(Candidate(tuple(guesses[i][r][0] for i, r in enumerate(path)), NAME,
                                        tuple(guesses[i][r][1] for i, r in enumerate(path)))
                              for path in paths[:budget.max_candidates]))

    def learn(self, outcome: Outcome) -> None:
        self.at = (len(outcome.tokens), outcome.hidden)


def _priors() -> Dict[Guess, float]:
    # a head's probability for its token, a little less the further it looks
    return {Guess(k, d): min(0.95, max(0.02, 0.1 * d * 0.9 ** (k - 1))) for k in range(1, MAX_HEADS + 1)
            for d in range(11)}


PRIORS = _priors()


def _check(config: HeadsConfig) -> Optional[Heads]:
    return Heads.read(Path(config.file).expanduser()) if config.file is not None else None


def _load(config: HeadsConfig, resources: Resources, heads: Heads) -> Heads:
    target = resources.target
    heads.check_model(target.path, target.n_vocab, target.n_embd, Path(str(config.file)))
    heads.out = output_rows(target.path, heads.tokens)
    return heads


def _beside(config: HeadsConfig, model_file: str, cache: Path) -> HeadsConfig:
    found = cached_path(Path(model_file), cache)
    return HeadsConfig(str(found), config.tree) if config.file is None and found.is_file() else config


PLUGIN = Plugin(
    name=NAME, describe="draft heads trained on this machine (llamaspec heads train)",
    config=HeadsConfig(), options=(
        Option("heads", "file", "Draft heads trained for the model (`llamaspec heads train`); default: the "
               "heads cached for it, if any.", flag="--heads", path=True),
        Option("heads_tree", "tree", "The heads' candidate tree: nodes at most.", flag="--heads-tree")),
    check=_check, load=_load, given=lambda config, draft: config.file is not None, beside=_beside,
    loads="a heads file (--heads; `llamaspec heads train` makes one)", hidden=True,
    build=lambda setup, text: HeadsSource(setup.loaded, setup.config.tree),
    priors=PRIORS, overall=0.3)
