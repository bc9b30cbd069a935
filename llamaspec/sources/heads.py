"""Draft heads trained on this machine from the target's own hidden states: Medusa-1's residual
blocks, each also reading the pending token (as Hydra's heads read the tokens before theirs).

The target's last hidden state h (llama.cpp's normalised output of the last layer, read in the
same decode as the logits) at the row that chose the pending token x[t+1] is what its output
matrix E turns into logits: ``logits = E h``. Head k (k = 1 .. K) guesses the token k places
after the pending one, x[t+1+k], from h and a vector e standing for x[t+1]::

    a_k = V_k [h; e] + c_k               the block's r inner units (V_k (r, 2d), c_k (r,) trained)
    z_k = h + U_k SiLU(a_k)              back to d (U_k (d, r) trained; zero: z_k = h)
    p_k = softmax(E_N z_k)               E_N: E's rows for the N tokens of the map (frozen)

a residual block as Medusa-1's, through r < d inner units (a bottleneck, as adapters have): its
logits are E_N h, the same for every head, plus (E_N U_k) SiLU(a_k), an N x r product, where
Medusa's full block takes a d x d and an N x d product a head (``Drafter``). A file of the
earlier format (llamaspec-heads-2: z_k = h + SiLU(W_k [h; e] + b_k)) is this with U_k = I.

e is the pending token's row of E_N (zero for a token off the map): h alone does not say which
token the target chose from it where it hesitated, e does (docs/design.md: what it adds). The N
tokens are the most frequent among the target's own choices on the training text (FR-Spec's
idea); a token outside them is never guessed.

Candidates form a sparse tree (Medusa's): every head's best ``RANKS`` tokens, combined along
paths, keeping the paths with the most expected accepted tokens. A head's probability for a
token is taken for what it was worth on held-out text (the file's calibration: a head trained on
a few ten thousand tokens is sure too often), and the acceptance model learns, per head and
decile of that, how often a head's token is accepted when the tokens before it were (evidence
``Guess(head, decile)``). Head k+1 is computed only while the tree's best path through head k
is estimated at least the budget's ``stop_below`` (a deeper token is estimated lower: it would
not be worth its row)::

    pending x[t+1]
      ├─ a  (head 1, best) ──┬─ c (head 2, best) ── f (head 3, best)
      │                      └─ d (head 2, second)
      └─ b  (head 1, second) ── c (head 2, best)

The heads file (``llamaspec heads train`` writes it) is an .npz: ``w`` V (K, r, 2d) float16,
``b`` c (K, r), ``u`` U (K, d, r) float16, ``tokens`` (N,) the map, ``out`` E_N (N, d) float16
(dequantized from the model's GGUF file when the heads were trained: loading reads no GGUF),
``meta`` (JSON: the format, the model's file name and sha256, n_vocab, n_embd, the training
run's settings and each head's held-out top-1 and top-5).
"""

from __future__ import annotations

import functools
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
from ..llama.models import sha256
from .base import Budget, Candidate, Outcome, Proposal, Source
from .registry import Option, Plugin, Resources

NAME = "heads"
FORMAT = "llamaspec-heads-3"
FORMATS = ("llamaspec-heads-2", FORMAT)  # read; 2: without U (U = I), 1 (heads on h alone): not read
MAX_HEADS = 8
RANKS = 4  # a head's best tokens that candidates may take
SUFFIX = ".heads.npz"


class HeadsError(ConfigError):
    """A heads file that cannot be read, or that was trained for another model."""


@dataclass(frozen=True)
class Guess:
    """A head's token: ``head`` (1: the token after the pending one), ``decile``: how often, in
    tenths, the head's tokens were the target's on held-out text where it gave them the
    probability it gives this one (``Heads.calibration``)."""

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


def map_index(tokens: np.ndarray, y: Any) -> Tuple[Any, Any]:
    """Where token(s) ``y`` sit in the sorted map ``tokens`` (a valid index either way), and
    whether they are on it."""
    i = np.minimum(np.searchsorted(tokens, y), len(tokens) - 1)
    return i, tokens[i] == y


@dataclass(eq=False)
class Heads:
    """K heads over a map of N tokens: ``w`` V (K, r, 2d) acting on [h; e], ``b`` c (K, r), ``u``
    U (K, d, r), ``tokens`` (N,) vocabulary ids in order, ``out`` E_N (N, d), ``meta`` the file's
    record, ``calibration`` (K, 11): how often head k's token was the target's on held-out text
    where the head gave it a probability of about d / 10 (None: d / 10 itself)."""

    w: np.ndarray
    b: np.ndarray
    u: np.ndarray
    tokens: np.ndarray
    out: np.ndarray
    meta: Dict[str, Any]
    calibration: Optional[np.ndarray] = None

    def __post_init__(self) -> None:
        if self.calibration is None:
            self.calibration = np.tile(np.arange(11) / 10, (self.k, 1))

    @property
    def k(self) -> int:
        return self.w.shape[0]

    def pending(self, y: Any) -> np.ndarray:
        """e for pending token(s) ``y``: its row of E_N, zero for a token off the map; (d,) for one
        token, (B, d) for B."""
        i, on_map = map_index(self.tokens, np.asarray(y))
        return np.where(on_map[..., None], self.out[i], np.float32(0))

    def hidden(self, h: np.ndarray, e: np.ndarray) -> np.ndarray:
        """z (K, d) for one hidden state h (d,) and its pending token's e (d,), or (K, B, d) for
        B of each (B, d)."""
        x = np.concatenate([h, e], axis=-1)
        a = np.matmul(x.reshape(-1, x.shape[-1]), self.w.transpose(0, 2, 1)) + self.b[:, None, :]  # (K, B, r)
        z = h.reshape(1, -1, h.shape[-1]) + np.matmul(silu(a), self.u.transpose(0, 2, 1))  # (K, B, d)
        return z.reshape((self.k,) + h.shape)

    def logits(self, h: np.ndarray, pending: int) -> np.ndarray:
        """Each head's logits over the map (K, N) for one hidden state h (d,) and the token it
        chose, ``pending`` (the definition; a ``Drafter`` computes them faster)."""
        return self.hidden(h, self.pending(pending)) @ self.out.T

    def drafter(self) -> "Drafter":
        """These heads, frozen, for one hidden state at a time."""
        _blas()  # numpy's BLAS found now (25-220 ms), not at the first step the heads are asked
        d = self.out.shape[1]
        table = np.stack([self.out @ w[:, d:].T for w in self.w])  # (K, N, r): V_k^e e for each e of E_N
        out_u = np.stack([self.out @ u for u in self.u])  # (K, N, r): E_N U_k
        return Drafter(np.ascontiguousarray(self.w[:, :, :d]), self.b, table, out_u, self.tokens, self.out,
                       np.asarray(self.calibration))

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".part")
        with open(tmp, "wb") as f:
            np.savez(f, w=self.w.astype(np.float16), b=self.b.astype(np.float32), u=self.u.astype(np.float16),
                     tokens=self.tokens.astype(np.int32), out=self.out.astype(np.float16),
                     calibration=np.asarray(self.calibration, np.float32),
                     meta=np.frombuffer(json.dumps(self.meta).encode(), dtype=np.uint8))
        os.replace(tmp, path)

    @staticmethod
    def read(path: Path) -> "Heads":
        """The heads a file holds (HeadsError: not a heads file, truncated, another format)."""
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                made = meta.get("format") if isinstance(meta, dict) else None
                if made not in FORMATS:
                    raise HeadsError(f"{path} is {f'a {made} file' if made else 'not a heads file'}, not {FORMAT}; "
                                     f"train it again with `llamaspec heads train`")
                w, b = z["w"].astype(np.float32), z["b"].astype(np.float32)
                u = z["u"].astype(np.float32) if made == FORMAT else np.tile(np.eye(len(b[0]), dtype=np.float32),
                                                                            (len(b), 1, 1))
                heads = Heads(w, b, u, z["tokens"].astype(np.int64), z["out"].astype(np.float32), meta,
                              z["calibration"].astype(np.float64))
        except HeadsError:
            raise
        except FileNotFoundError:
            raise HeadsError(f"no such heads file: {path}") from None
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as e:
            raise HeadsError(f"{path} is not a heads file or is cut short ({type(e).__name__}: {e}); "
                             f"train it again with `llamaspec heads train`") from None
        k, r = heads.b.shape
        n, d = heads.out.shape
        if heads.w.shape != (k, r, 2 * d) or heads.u.shape != (k, d, r) or heads.tokens.shape != (n,) or n == 0 \
                or heads.calibration.shape != (k, 11) or not 1 <= k <= MAX_HEADS:
            raise HeadsError(f"{path} holds heads of inconsistent shapes")
        return heads

    def check_model(self, model_path: Path, n_vocab: int, n_embd: int, where: Path) -> None:
        """HeadsError unless these heads were trained for the model in ``model_path``."""
        meta = self.meta
        if meta.get("n_vocab") != n_vocab or meta.get("n_embd") != n_embd or meta.get("sha256") != sha256(model_path):
            raise HeadsError(f"{where} was trained for {meta.get('model', 'another model')}, not {model_path.name}; "
                             f"train heads for it with `llamaspec heads train -m {model_path}`")
        if self.tokens.max(initial=0) >= n_vocab or self.out.shape[1] != n_embd:
            raise HeadsError(f"{where} does not fit {model_path.name}'s vocabulary")


@dataclass(frozen=True, eq=False)
class Drafter:
    """The heads' logits for one hidden state at a time, as ``Heads.logits`` defines them, for less
    memory read (a head's products are bound by reading its weights). E_N z_k = E_N h + (E_N U_k)
    SiLU(a_k): E_N h is the same for every head (``base``, an N x d product once a step; in a run
    the target's own logits on the map, which its decode computed: ``HeadsSource``), E_N U_k
    is kept (``out_u``, N x r), and V_k [h; e] = V_k^h h + V_k^e e with V_k^e e read from ``table``
    (K, N, r), since e is a row of E_N or zero; both computed once when the heads load. A head
    then reads (N + d) x r floats: for the 1.5B (N 2,663, d 1,536) at r = 512, 2.1 M, where
    Medusa's full block read 6.5 M. The 1.5B's three heads and E_N h on one core of a 2-core
    AMD EPYC (AVX2): 3.58 ms a step, where the full block took 5.55 (6.53 read from a file of
    the earlier format: U = I and E_N h apart cost one N x d product more).

    On one thread: OpenBLAS's other threads would spin on, taking the cores from llama.cpp's next
    decode (measured: SmolLM2's single decodes 5.5 ms -> 11 ms)."""

    w: np.ndarray  # (K, r, d): V_k^h
    b: np.ndarray  # (K, r): c_k
    table: np.ndarray  # (K, N, r): V_k^e E_N[n]
    out_u: np.ndarray  # (K, N, r): E_N U_k
    tokens: np.ndarray  # (N,)
    out: np.ndarray  # (N, d): E_N
    calibration: np.ndarray  # (K, 11): as Heads.calibration

    @property
    def k(self) -> int:
        return self.w.shape[0]

    def base(self, h: np.ndarray) -> np.ndarray:
        """E_N h (N,): what every head's logits start from, for hidden state h (d,)."""
        with _one_thread():
            return self.out @ h

    def is_base(self, h: np.ndarray, row: np.ndarray) -> bool:
        """Whether ``row``, the target's logits on the map at hidden state h, are E_N h: apart by
        at most 5% of E_N h's spread around its mean."""
        base = self.base(h)
        return bool(np.linalg.norm(row - base) <= 0.05 * np.linalg.norm(base - base.mean()))

    def head(self, h: np.ndarray, base: np.ndarray, pending: int, k: int) -> np.ndarray:
        """Head k's logits over the map (N,) for hidden state h (d,), its ``base`` and ``pending``
        (k = 1 .. K)."""
        i, on_map = map_index(self.tokens, pending)
        with _one_thread():
            a = self.w[k - 1] @ h + self.b[k - 1] + (self.table[k - 1, i] if on_map else 0.0)
            return base + self.out_u[k - 1] @ silu(a)


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
    (the last outcome's; nothing before the first step or after a text the engine changed). E_N
    h is that row's logits on the map (llama.cpp's, from the quantized matrix: 1-2.5% apart from
    the product on the 1.5B, SmolLM2 and Gemma 3), checked the first time against the product:
    where a model scales or caps its logits they are not, and the product is computed each step."""

    name = NAME
    own_gate = True  # its products cost time of their own: asked while what it brings repays them

    def __init__(self, heads: Drafter, max_nodes: int) -> None:
        self.heads, self.max_nodes = heads, max_nodes
        self.max_len = heads.k
        # (text length, its hidden state h, the target's logits at h's row, where the decode gave them)
        self.at: Tuple[int, Optional[np.ndarray], Optional[np.ndarray]] = (-1, None, None)
        self.logits_are_base: Optional[bool] = None  # the target's logits on the map are E_N h: seen once

    def propose(self, tokens: Sequence[int], budget: Budget, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        n, h, logits = self.at
        if h is None or n != len(tokens):
            return Proposal()
        base = None  # E_N h, once the first head is asked
        guesses = []  # per head: (token, evidence, estimated acceptance) of its best RANKS
        best = 1.0  # the estimate of the tree's best path so far: no token deeper is estimated higher
        for k in range(1, min(self.heads.k, budget.max_len) + 1):
            if best < budget.stop_below:  # no deeper token is worth a row: its head's products are spared
                break
            base = self._base(h, logits) if base is None else base
            row = self.heads.head(h, base, tokens[-1], k)
            top = np.argpartition(row, -RANKS)[-RANKS:]
            p = np.exp(row[top] - row.max())
            p /= np.exp(row - row.max()).sum()
            seen = self.heads.calibration[k - 1, np.rint(10 * p).astype(np.int64)]
            keys = [Guess(k, int(np.rint(10 * q))) for q in seen]
            guesses.append([(int(self.heads.tokens[t]), key, budget.rates.get(key, PRIORS[key]))
                            for t, key in zip(top, keys)])
            best *= max(rate for _, _, rate in guesses[-1])
        paths = tree([[(t, rate) for t, _, rate in g] for g in guesses], self.max_nodes, budget.max_len)
        return Proposal(tuple(Candidate(tuple(guesses[i][r][0] for i, r in enumerate(path)), NAME,
                                        tuple(guesses[i][r][1] for i, r in enumerate(path)))
                              for path in paths[:budget.max_candidates]))

    def learn(self, outcome: Outcome) -> None:
        self.at = (len(outcome.tokens), outcome.hidden, outcome.logits)

    def _base(self, h: np.ndarray, logits: Optional[np.ndarray]) -> np.ndarray:
        """E_N h: the target's logits on the map where they are that (an N x d product spared),
        checked the first time."""
        if logits is None:
            return self.heads.base(h)
        row = logits[self.heads.tokens]
        if self.logits_are_base is None:
            self.logits_are_base = self.heads.is_base(h, row)
        return row if self.logits_are_base else self.heads.base(h)


def _priors() -> Dict[Guess, float]:
    # what the held-out text said (given the tokens before it, a head's token is a little likelier
    # than that: its misses come with theirs)
    return {Guess(k, d): min(0.95, max(0.02, 0.1 * d)) for k in range(1, MAX_HEADS + 1) for d in range(11)}


PRIORS = _priors()


def _check(config: HeadsConfig) -> Optional[Heads]:
    return Heads.read(Path(config.file).expanduser()) if config.file is not None else None


def _load(config: HeadsConfig, resources: Resources, heads: Heads) -> Drafter:
    target = resources.target
    heads.check_model(target.path, target.n_vocab, target.n_embd, Path(str(config.file)))
    return heads.drafter()


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
    # where lookup copies a token the heads guess too, lookup's estimate counts: the heads' own,
    # higher, made the 1.5B's steps verify copies too far (code_edit 1.64x -> 1.40x on 2 cores)
    loads="a heads file (--heads; `llamaspec heads train` makes one)", hidden=True, shadowed_by="lookup",
    build=lambda setup, text: HeadsSource(setup.loaded, setup.config.tree),
    priors=PRIORS, overall=0.3)
