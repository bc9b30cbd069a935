"""The draft heads' model and file format: what ``llamaspec heads train`` (training/) writes and
the heads source (sources/heads.py) drafts with.

The heads are one residual block, as Medusa-1's heads are, applied again and again along the
tokens it guesses, as EAGLE's draft model is (each step reading the token before it, as Hydra's
heads do).

The target's last hidden state h (llama.cpp's normalised output of the last layer, read in the
same decode as the logits) at the row that chose the pending token x[t+1] is what its output
matrix E turns into logits: ``logits = E h``. The block stands for the target's next row: from
a hidden state z and a vector e for the token read there, the hidden state of the row after::

    z_0 = h,  e_1 = e(x[t+1])            the row that chose the pending token, and that token
    a_k = V [z_(k-1); e_k] + c            the block's r inner units (V (r, 2d), c (r,) trained)
    z_k = z_(k-1) + U SiLU(a_k)           back to d (U (d, r) trained; zero: z_k = z_(k-1))
    p_k = softmax(E_N z_k)                head k's guess at x[t+1+k]; e_(k+1) = e(its best token)

E_N: E's rows for the N tokens of the map (frozen). Head k is the block's k-th step (k = 1 ..
K): one set of weights for every head, trained through K steps at once (the tokens read being
the text's), so that a deeper head reads what the one before it guessed. Its logits are E_N h,
the target's own logits on the map, plus the steps' (E_N U) SiLU(a_j): N x r products
(``Drafter``). e is a token's row of E_N (zero for a token off the map). The N tokens are the
most frequent among the target's own choices on the training text (FR-Spec's idea); a token
outside them is never guessed.

The heads file (``llamaspec heads train`` writes it) is an .npz: ``w`` V (r, 2d) float16, ``b``
c (r,), ``u`` U (d, r) float16, ``tokens`` (N,) the map, ``out`` E_N (N, d) float16
(dequantized from the model's GGUF file when the heads were trained: loading reads no GGUF),
``calibration`` (K, 11), ``meta`` (JSON: the format, the model's file name and sha256, n_vocab,
n_embd, the training run's settings and each head's held-out top-1 and top-5). Reading one checks
every array's .npy header against the sizes the record declares before any array is read, and
the weights finite after (``read_arrays``): a hostile file is one line, never an allocation.
"""

from __future__ import annotations

import functools
import json
import math
import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .errors import ConfigError, shown
from .llama.models import sha256

FORMAT = "llamaspec-heads-4"  # read alone: 1 to 3 were independent heads (train them again)
MAX_HEADS = 8
RANKS = 4  # a head's best tokens that candidates may take (and that the calibration counts)
SUFFIX = ".heads.npz"


class HeadsError(ConfigError):
    """A heads file that cannot be read, or that was trained for another model."""


@functools.lru_cache(maxsize=1)
def _blas() -> Any:
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController()


def one_thread() -> Any:
    """numpy's BLAS on one thread while the heads run (entered once a step, at little cost).
    OpenBLAS's other threads would spin on after a product, taking the cores from llama.cpp's
    next decode (a small model's single decodes took twice as long)."""
    return _blas().limit(limits=1, user_api="blas")


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def largest(row: np.ndarray, n: int) -> np.ndarray:
    """The indices of ``row``'s ``n`` largest values, largest first: n argmaxes over a copy (on a
    map of a few thousand tokens, several times faster than argpartition for a few)."""
    row, top = row.copy(), np.empty(n, np.int64)
    for i in range(n):
        top[i] = j = row.argmax()
        row[j] = -np.inf
    return top


def map_index(tokens: np.ndarray, y: Any) -> Tuple[Any, Any]:
    """Where token(s) ``y`` sit in the sorted map ``tokens`` (a valid index either way), and
    whether they are on it."""
    i = np.minimum(np.searchsorted(tokens, y), len(tokens) - 1)
    return i, tokens[i] == y


@dataclass(eq=False)
class Heads:
    """K heads over a map of N tokens: one block, ``w`` V (r, 2d) acting on [z; e], ``b`` c (r,),
    ``u`` U (d, r), applied K times (``k``); ``tokens`` (N,) vocabulary ids in order, ``out`` E_N
    (N, d), ``meta`` the file's record, ``calibration`` (K, 11): how often head k's token was the
    target's on held-out text (the tokens before it the text's) where the head gave it a
    probability of about d / 10 (None: d / 10 itself)."""

    w: np.ndarray
    b: np.ndarray
    u: np.ndarray
    tokens: np.ndarray
    out: np.ndarray
    k: int
    meta: Dict[str, Any]
    calibration: Optional[np.ndarray] = None

    def __post_init__(self) -> None:
        if self.calibration is None:
            self.calibration = np.tile(np.arange(11) / 10, (self.k, 1))

    def pending(self, y: Any) -> np.ndarray:
        """e for token(s) ``y``: its row of E_N, zero for a token off the map; (d,) for one
        token, (B, d) for B."""
        i, on_map = map_index(self.tokens, np.asarray(y))
        return np.where(on_map[..., None], self.out[i], np.float32(0))

    def step(self, z: np.ndarray, e: np.ndarray) -> np.ndarray:
        """The block's step: z + U SiLU(V [z; e] + c), for one z (d,) and e (d,) or B of each (B, d)."""
        return z + silu(np.concatenate([z, e], axis=-1) @ self.w.T + self.b) @ self.u.T

    def logits(self, h: np.ndarray, read: Sequence[int]) -> np.ndarray:
        """Heads 1 .. len(``read``)'s logits over the map (len(read), N) for one hidden state h
        (d,) and the tokens read after it: the pending token, then the token each head before
        the last is taken to have guessed (the definition; a ``Drafter`` computes them faster)."""
        z, rows = h, []
        for token in read:
            z = self.step(z, self.pending(token))
            rows.append(z @ self.out.T)
        return np.stack(rows)

    def drafter(self) -> "Drafter":
        """These heads, frozen, for one hidden state at a time."""
        _blas()  # numpy's BLAS found now (a noticeable wait), not at the first step the heads are asked
        d = self.out.shape[1]
        w_z = np.ascontiguousarray(self.w[:, :d])
        return Drafter(w_z, self.b, self.out @ self.w[:, d:].T, self.out @ self.u, w_z @ self.u, self.tokens,
                       self.out, np.asarray(self.calibration))

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
        """The heads a file holds (``read_arrays``: HeadsError, one line, for a file that is not
        theirs, is cut short, or whose arrays disagree with its record or are not finite)."""
        a = read_arrays(path)
        return Heads(a["w"].astype(np.float32), a["b"].astype(np.float32), a["u"].astype(np.float32),
                     a["tokens"].astype(np.int64), a["out"].astype(np.float32), len(a["calibration"]), a["meta"],
                     a["calibration"].astype(np.float64))

    def check_model(self, model_path: Path, n_vocab: int, n_embd: int, where: Path) -> None:
        """HeadsError unless these heads were trained for the model in ``model_path``."""
        meta = self.meta
        if meta.get("n_vocab") != n_vocab or meta.get("n_embd") != n_embd or meta.get("sha256") != sha256(model_path):
            raise HeadsError(f"{where} was trained for {meta.get('model', 'another model')}, not {model_path.name}; "
                             f"train heads for it with `llamaspec heads train -m {model_path}`")
        if self.tokens.max(initial=0) >= n_vocab or self.out.shape[1] != n_embd:
            raise HeadsError(f"{where} does not fit {model_path.name}'s vocabulary")


# A heads file's arrays and the types ``Heads.save`` writes them in; the record, ``meta``, declares
# the sizes the others must have.
ARRAYS = {"w": np.dtype(np.float16), "b": np.dtype(np.float32), "u": np.dtype(np.float16),
          "tokens": np.dtype(np.int32), "out": np.dtype(np.float16), "calibration": np.dtype(np.float32),
          "meta": np.dtype(np.uint8)}
# What a heads file may declare, checked before anything is allocated for it: its record's bytes,
# a hidden size and a vocabulary (above any llama.cpp model's), and the bytes of any one array (E_N
# over a map of 262,144 tokens at a hidden size of 8,192, in float16).
MAX_RECORD_BYTES = 1 << 20
MAX_EMBD = 1 << 16
MAX_VOCAB = 1 << 22
MAX_ARRAY_BYTES = 4 << 30
AGAIN = "train it again with `llamaspec heads train`"


class Header(NamedTuple):
    """An array's .npy header as its member declares it."""

    shape: Tuple[int, ...]
    dtype: np.dtype


def read_arrays(path: Path) -> Dict[str, Any]:
    """A heads file's arrays by name (``meta``: its record, parsed), checked in the order that keeps
    a hostile file from costing memory: the record (bounded) first, then every array's header
    against the sizes the record declares, before any array is read (a header may declare any
    shape, and numpy allocates what it declares); then the values (NaN weights would make every
    guess NaN). HeadsError, one line naming the file and the array, for anything wrong."""
    _regular(path)
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, ValueError, EOFError):
        raise HeadsError(f"{path} is not a heads file or is cut short (not a zip archive); {AGAIN}") from None
    except OSError as e:
        raise HeadsError(f"cannot read heads file {path}: {e.strerror or e}") from None
    with z:
        meta = _record(z, path)
        dims = _dims(meta, path)
        headers = {name: _header(z, path, name) for name in _names(z, path)}
        for name, want in _shapes(headers, dims, path).items():
            if headers[name].shape != want:
                raise _bad(path, name, f"is {headers[name].shape}, where the record's sizes ({_sizes(dims)}, "
                                       f"r {headers['b'].shape[0]}) make it {want}")
        arrays = {name: _array(z, path, name) for name in ARRAYS if name != "meta"}
    _check_values(arrays, dims, path)
    return dict(arrays, meta=meta)


def _bad(path: Path, name: str, problem: str) -> HeadsError:
    return HeadsError(f"{path}: its array {name} {problem}; {AGAIN}")


def _said(e: BaseException) -> str:
    """An exception as a message quotes it: on one line, cut short (numpy's may span lines)."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= 120 else text[:117] + "..."


def _regular(path: Path) -> None:
    """HeadsError unless ``path`` is a regular file (a pipe or a device would be read without end)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise HeadsError(f"no such heads file: {path}") from None
    except OSError as e:
        raise HeadsError(f"cannot read heads file {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise HeadsError(f"heads file {path} is not a regular file")


def _record(z: zipfile.ZipFile, path: Path) -> Dict[str, Any]:
    """The file's record (``meta``, JSON as bytes) of at most MAX_RECORD_BYTES, in this FORMAT."""
    if "meta.npy" not in z.namelist():
        raise HeadsError(f"{path} is not a heads file (it has no record, meta.npy); {AGAIN}")
    shape = _header(z, path, "meta").shape
    if len(shape) != 1 or shape[0] > MAX_RECORD_BYTES:
        raise _bad(path, "meta", f"is {shape}, where a record is one row of at most {MAX_RECORD_BYTES:,} bytes")
    try:
        meta = json.loads(bytes(_array(z, path, "meta")).decode())
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise _bad(path, "meta", "is not a JSON record") from None
    made = meta.get("format") if isinstance(meta, dict) else None
    if made != FORMAT:
        named = made if isinstance(made, str) and made.isprintable() and len(made) <= 40 else shown(made)
        raise HeadsError(f"{path} is {f'a {named} file' if made else 'not a heads file'}, not {FORMAT}; {AGAIN}")
    return meta


def _dims(meta: Dict[str, Any], path: Path) -> Dict[str, int]:
    """The sizes the record declares, each a whole number within its bound: n_embd (d), n_vocab,
    heads (K) and n_tokens (N, the map's tokens: at most the vocabulary)."""
    dims: Dict[str, int] = {}
    for key, most in (("n_embd", MAX_EMBD), ("n_vocab", MAX_VOCAB), ("heads", MAX_HEADS), ("n_tokens", 0)):
        most = most or dims["n_vocab"]
        value = meta.get(key)
        if type(value) is not int or not 1 <= value <= most:
            raise _bad(path, "meta", f"declares {key} {shown(value)}, where it is a whole number from 1 to {most:,}")
        dims[key] = value
    return dims


def _sizes(dims: Dict[str, int]) -> str:
    return f"d {dims['n_embd']}, N {dims['n_tokens']}, K {dims['heads']}"


def _names(z: zipfile.ZipFile, path: Path) -> List[str]:
    """The arrays' names, once each: HeadsError for a member that is none of them, or one missing."""
    names = z.namelist()
    for member in names:
        if not member.endswith(".npy") or member[:-4] not in ARRAYS or names.count(member) > 1:
            raise HeadsError(f"{path} holds {shown(member)}, which is not one of a heads file's arrays "
                             f"({', '.join(ARRAYS)}, once each); {AGAIN}")
    missing = [name for name in ARRAYS if name + ".npy" not in names]
    if missing:
        raise HeadsError(f"{path} has no array {missing[0]}; {AGAIN}")
    return list(ARRAYS)


def _header(z: zipfile.ZipFile, path: Path, name: str) -> Header:
    """Array ``name``'s .npy header, read from its member alone and checked: the type the heads are
    saved in, at most MAX_ARRAY_BYTES of data, and as many as its member holds (the member stored
    uncompressed, as ``Heads.save`` writes it, within the file: nothing it declares is more than
    the file's own bytes)."""
    info = z.getinfo(name + ".npy")
    if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
        raise _bad(path, name, "is compressed or encrypted, where a heads file's arrays are stored as they are")
    if info.compress_size != info.file_size or info.header_offset + info.file_size > os.path.getsize(path):
        raise _bad(path, name, "is cut short or damaged (its member's sizes do not fit the file)")
    try:
        with z.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f"a .npy version {version[0]}.{version[1]}, not 1.0 or 2.0")
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
            start = f.tell()
    except (ValueError, SyntaxError) as e:
        raise _bad(path, name, f"is not a .npy array ({_said(e)})") from None
    except (EOFError, OSError, RuntimeError, zipfile.BadZipFile) as e:
        raise _bad(path, name, f"is cut short or damaged ({_said(e)})") from None
    want = ARRAYS[name]
    if dtype.hasobject or dtype.kind != want.kind or dtype.itemsize != want.itemsize:
        raise _bad(path, name, f"is {dtype}, where a heads file holds it in {want}")
    size = math.prod(shape) * dtype.itemsize
    if min(shape, default=0) < 0 or size > MAX_ARRAY_BYTES:
        raise _bad(path, name, f"declares {shape} {dtype}: {size:,} bytes, where an array has at most "
                               f"{MAX_ARRAY_BYTES:,}")
    if size != info.file_size - start:
        raise _bad(path, name, f"holds {info.file_size - start:,} bytes of data where its header declares "
                               f"{shape} {dtype}, {size:,} bytes (cut short?)")
    return Header(tuple(shape), dtype)


def _shapes(headers: Dict[str, Header], dims: Dict[str, int], path: Path) -> Dict[str, Tuple[int, ...]]:
    """The shape of each array for the record's sizes, r (the block's inner units) being b's
    length: 1 to d, as training makes it (the rank asked for, at most d)."""
    d, n, k = dims["n_embd"], dims["n_tokens"], dims["heads"]
    shape = headers["b"].shape
    if len(shape) != 1 or not 1 <= shape[0] <= d:
        raise _bad(path, "b", f"is {shape}, where it is one row of the block's inner units, 1 to d {d}")
    r = shape[0]
    return {"w": (r, 2 * d), "b": (r,), "u": (d, r), "tokens": (n,), "out": (n, d), "calibration": (k, 11)}


def _array(z: zipfile.ZipFile, path: Path, name: str) -> np.ndarray:
    """Array ``name``, its header checked (``_header``)."""
    try:
        with z.open(name + ".npy") as f:
            return np.lib.format.read_array(f, allow_pickle=False)
    except (ValueError, EOFError, OSError, RuntimeError, zipfile.BadZipFile) as e:
        raise _bad(path, name, f"is cut short or damaged ({_said(e)})") from None


def _check_values(arrays: Dict[str, np.ndarray], dims: Dict[str, int], path: Path) -> None:
    """HeadsError for values the heads cannot run on: weights that are not finite (every logit
    would be NaN), rates outside 0 to 1 (the calibration is a share of tokens right), a map that
    is not increasing ids of the vocabulary (it is searched as sorted)."""
    for name in ("w", "b", "u", "out", "calibration"):
        if not np.isfinite(arrays[name]).all():
            raise _bad(path, name, "holds NaN or infinite values")
    calibration = arrays["calibration"]
    if ((calibration < 0) | (calibration > 1)).any():
        raise _bad(path, "calibration", "holds rates outside 0 to 1")
    tokens = arrays["tokens"].astype(np.int64)
    if tokens[0] < 0 or tokens[-1] >= dims["n_vocab"] or (np.diff(tokens) <= 0).any():
        raise _bad(path, "tokens", f"is not increasing token ids from 0 to n_vocab - 1 ({dims['n_vocab'] - 1:,})")


class At(NamedTuple):
    """Where the block's steps stand, as a ``Drafter`` keeps it: V^z z (r,) and E_N z (N,), the
    two products of z that the next step and the logits need (z itself is never formed)."""

    v_z: np.ndarray
    logits: np.ndarray


@dataclass(frozen=True, eq=False)
class Drafter:
    """The heads' logits for one hidden state at a time, as ``Heads.logits`` defines them, for less
    memory read (a step's products are bound by reading its weights). With V = [V^z V^e]:

        a_k = V^z z_(k-1) + V^e e_k + c      V^e e_k: a row of ``table`` (N, r), e being a row of E_N
        V^z z_k = V^z z_(k-1) + (V^z U) g_k  g_k = SiLU(a_k); V^z U: ``w_u`` (r, r)
        E_N z_k = E_N z_(k-1) + (E_N U) g_k  E_N U: ``out_u`` (N, r)

    from V^z h (an r x d product) and E_N h (``base``; in a run the target's own logits on the
    map, which its decode computed: ``HeadsSource``), all computed once when the heads load. A
    head then reads (N + r) x r floats, the same weights for every head (the second and third
    find them in the cache). Its callers run it on one thread (``one_thread``)."""

    w: np.ndarray  # (r, d): V^z
    b: np.ndarray  # (r,): c
    table: np.ndarray  # (N, r): V^e E_N[n]
    out_u: np.ndarray  # (N, r): E_N U
    w_u: np.ndarray  # (r, r): V^z U
    tokens: np.ndarray  # (N,)
    out: np.ndarray  # (N, d): E_N
    calibration: np.ndarray  # (K, 11): as Heads.calibration

    @property
    def k(self) -> int:
        return len(self.calibration)

    def base(self, h: np.ndarray) -> np.ndarray:
        """E_N h (N,): what every head's logits start from, for hidden state h (d,)."""
        return self.out @ h

    def is_base(self, h: np.ndarray, row: np.ndarray) -> bool:
        """Whether ``row``, the target's logits on the map at hidden state h, are E_N h: apart by
        at most 5% of E_N h's spread around its mean."""
        base = self.base(h)
        return bool(np.linalg.norm(row - base) <= 0.05 * np.linalg.norm(base - base.mean()))

    def start(self, h: np.ndarray, base: np.ndarray) -> At:
        """Before the first head: z_0 = h, whose E_N h is ``base``."""
        return At(self.w @ h, base)

    def head(self, at: At, token: int) -> At:
        """The next head, reading ``token`` (the pending one, then the one guessed before it):
        its logits over the map are the result's ``logits``."""
        i, on_map = map_index(self.tokens, token)
        g = silu(at.v_z + self.b + (self.table[i] if on_map else 0.0))
        return At(at.v_z + self.w_u @ g, at.logits + self.out_u @ g)


def cached_path(model_path: Path, cache: Path) -> Path:
    """Where ``llamaspec heads train`` keeps the heads of ``model_path`` by default, and where
    they are found without ``--heads``: ``CACHE/heads/MODEL_FILE_NAME.heads.npz``."""
    return cache / "heads" / (model_path.name + SUFFIX)
