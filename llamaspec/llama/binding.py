"""The one module that calls llama.cpp: models, contexts, batches, the KV cache.

Everything else in llamaspec works with the small classes here and never touches ctypes.
Only llama-cpp-python's public low-level API (``llama_cpp.llama_cpp``) is used.
Failures come back as llamaspec errors: a model that does not load raises ModelError,
a failed ``llama_decode`` or a refused partial ``llama_memory_seq_rm`` raises DecodeError.
"""

from __future__ import annotations

import collections
import ctypes
import os
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any, Deque, Dict, FrozenSet, List, NamedTuple, Optional, Sequence, Tuple

import gguf
import numpy as np
import llama_cpp.llama_cpp as ll

from ..errors import DecodeError, ModelError
from ..sequences import BatchRow

# llama.cpp writes its log through one process-wide callback. We keep the last lines so a
# failed load can say why, and print them only when LLAMASPEC_VERBOSE is set.
_log_lines: Deque[str] = collections.deque(maxlen=50)
_init_lock = threading.Lock()
_initialized = False


@ll.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", errors="replace")
    _log_lines.append(line)
    if os.environ.get("LLAMASPEC_VERBOSE"):
        sys.stderr.write(line)


def _ensure_backend() -> None:
    global _initialized
    with _init_lock:
        if not _initialized:
            ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
            ll.llama_backend_init()
            _initialized = True


def _log_error() -> str:
    """The first error llama.cpp logged since the log was cleared (the root cause), unprefixed."""
    for line in _log_lines:
        if "error" in line.lower() or "failed" in line.lower():
            return line.strip().split(": ", 1)[-1].replace("error loading model: ", "")
    return ""


def check_gguf(path: Path) -> None:
    """Raise ModelError unless ``path`` is a file that starts like a GGUF file (reads 4 bytes)."""
    if not path.is_file():
        raise ModelError(f"model file not found: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if len(magic) < 4 or struct.unpack("<I", magic)[0] != gguf.GGUF_MAGIC:
        raise ModelError(f"not a GGUF file (it starts with {magic!r}): {path}")


def _load_failure(path: Path) -> str:
    """Why llama.cpp refused a file that starts like GGUF, from its log."""
    reason = _log_error()
    if any(word in reason for word in ("bounds", "incomplete", "failed to read")):
        return f"truncated or corrupt GGUF file {path} ({path.stat().st_size} bytes): {reason}"
    return f"failed to load model {path}: {reason or 'llama.cpp could not load it'}"


class Model:
    """A loaded GGUF model and its vocabulary."""

    _ptr = None
    rpc: Tuple[str, ...] = ()  # the RPC servers it is placed on (a RemoteModel's)
    tensor_split: Tuple[float, ...] = ()
    broken: Optional[str] = None  # why it can decode no more (a RemoteModel whose servers failed)

    def __init__(self, path: Path, n_gpu_layers: int = 0, vocab_only: bool = False, rpc: Sequence[str] = (),
                 tensor_split: Sequence[float] = ()) -> None:
        """Load ``path``; with ``vocab_only`` only the tokenizer (fast, no weights). ``rpc``: llama.cpp
        RPC servers (HOST:PORT) that are the model's first devices, so that the offloaded layers
        go there (llama.cpp ends the process when one of them fails: see remote.py, which loads
        such a model in a worker process). ``tensor_split``: each device's share of them."""
        _ensure_backend()
        check_gguf(path)
        params = ll.llama_model_default_params()
        params.n_gpu_layers = 999 if n_gpu_layers < 0 else n_gpu_layers
        params.vocab_only = vocab_only
        params.use_extra_bufts = weight_repacking()
        placed = _rpc_devices(rpc)  # kept alive until the model is loaded
        if placed is not None:
            params.devices = ctypes.cast(placed, ctypes.c_void_p)
        split = (ctypes.c_float * ll.LLAMA_MAX_DEVICES)(*tensor_split) if tensor_split else None
        if split is not None:
            params.tensor_split = split
        _log_lines.clear()
        ptr = ll.llama_model_load_from_file(str(path).encode(), params)
        if not ptr:
            raise ModelError(_load_failure(path))
        self.path = path
        self.n_gpu_layers = n_gpu_layers
        self.rpc, self.tensor_split = tuple(rpc), tuple(tensor_split)
        self._ptr = ptr
        self._vocab = ll.llama_model_get_vocab(ptr)
        self.n_vocab: int = ll.llama_vocab_n_tokens(self._vocab)
        self.n_ctx_train: int = ll.llama_model_n_ctx_train(ptr)
        self.n_layer: int = ll.llama_model_n_layer(ptr)
        self.n_embd: int = ll.llama_model_n_embd(ptr)
        self.n_params: int = ll.llama_model_n_params(ptr)
        self._pieces: dict = {}
        self._eog: Optional[FrozenSet[int]] = None

    def context(self, n_ctx: int, n_threads: int, n_batch: int = 512, n_seq_max: int = 1) -> "Context":
        """A context (KV cache) of this model."""
        return Context(self, n_ctx, n_threads, n_batch, n_seq_max)

    def close(self) -> None:
        if self._ptr:
            ll.llama_model_free(self._ptr)
            self._ptr = None

    def __del__(self) -> None:
        self.close()

    # --- metadata -------------------------------------------------------------------
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self._ptr, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self) -> Optional[str]:
        tmpl = ll.llama_model_chat_template(self._ptr, None)
        return tmpl.decode("utf-8") if tmpl else None

    def meta(self, key: str) -> Optional[str]:
        buf = ctypes.create_string_buffer(4096)
        n = ll.llama_model_meta_val_str(self._ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    # --- vocabulary -----------------------------------------------------------------
    @property
    def vocab_type(self) -> int:
        return ll.llama_vocab_type(self._vocab)

    @property
    def bos(self) -> int:
        return ll.llama_vocab_bos(self._vocab)

    @property
    def eos(self) -> int:
        return ll.llama_vocab_eos(self._vocab)

    @property
    def add_bos(self) -> bool:
        return bool(ll.llama_vocab_get_add_bos(self._vocab))

    @property
    def add_eos(self) -> bool:
        return bool(ll.llama_vocab_get_add_eos(self._vocab))

    def fim_tokens(self) -> Dict[str, int]:
        """The fill-in-the-middle tokens the vocabulary has: of "pre", "suf", "mid", "rep", "sep"."""
        calls = {"pre": ll.llama_vocab_fim_pre, "suf": ll.llama_vocab_fim_suf, "mid": ll.llama_vocab_fim_mid,
                 "rep": ll.llama_vocab_fim_rep, "sep": ll.llama_vocab_fim_sep}
        found = {name: int(call(self._vocab)) for name, call in calls.items()}
        return {name: token for name, token in found.items() if token >= 0}

    def token_text(self, token: int) -> bytes:
        return ll.llama_vocab_get_text(self._vocab, token) or b""

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self._vocab, token))

    @property
    def eog_tokens(self) -> FrozenSet[int]:
        """Every token that ends a generation (found once, on first use)."""
        if self._eog is None:
            self._eog = frozenset(t for t in range(self.n_vocab) if self.is_eog(t))
        return self._eog

    def is_control(self, token: int) -> bool:
        """A control token (``<|im_end|>``): no text spells it."""
        return bool(ll.llama_vocab_get_attr(self._vocab, token) & ll.LLAMA_TOKEN_ATTR_CONTROL)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> List[int]:
        return self.tokenize_bytes(text.encode("utf-8"), add_special, parse_special)

    def tokenize_bytes(self, data: bytes, add_special: bool = False, parse_special: bool = False) -> List[int]:
        """Tokens of raw bytes (by default as text: no BOS, special tokens not parsed)."""
        n_max = len(data) + 8
        buf = (ll.llama_token * n_max)()
        n = ll.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            n_max = -n
            buf = (ll.llama_token * n_max)()
            n = ll.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token, special tokens rendered as text (as llama.cpp's programs print)."""
        cached = self._pieces.get(token)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            n = ll.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
            cached = self._pieces[token] = buf.raw[:n]
        return cached

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")


# One batch row of another sequence: (token, position offset, sequence ids, logits?).


class Batch:
    """A llama_batch with numpy views on its arrays, filled without per-token ctypes calls."""

    _b = None

    def __init__(self, capacity: int, n_seq_max: int = 1) -> None:
        self.capacity = capacity
        self._b = ll.llama_batch_init(capacity, 0, n_seq_max)
        b = self._b
        self.token = np.ctypeslib.as_array(b.token, shape=(capacity,))
        self.pos = np.ctypeslib.as_array(b.pos, shape=(capacity,))
        self.n_seq_id = np.ctypeslib.as_array(b.n_seq_id, shape=(capacity,))
        self.logits = np.ctypeslib.as_array(b.logits, shape=(capacity,))
        self.seq_id = [np.ctypeslib.as_array(b.seq_id[i], shape=(n_seq_max,)) for i in range(capacity)]
        self.n_tokens = 0

    def clear(self) -> None:
        self.n_tokens = 0

    def add(self, token: int, pos: int, seq_ids: Sequence[int] = (0,), logits: bool = False) -> None:
        i = self.n_tokens
        if i >= self.capacity:
            raise DecodeError(f"batch overflow: capacity {self.capacity}")
        self.token[i] = token
        self.pos[i] = pos
        self.n_seq_id[i] = len(seq_ids)
        self.seq_id[i][: len(seq_ids)] = seq_ids
        self.logits[i] = logits
        self.n_tokens = i + 1

    def set_sequence(self, tokens: Sequence[int], start: int, logits: str = "all", seq: int = 0) -> None:
        """Fill with consecutive tokens of sequence ``seq``; logits "all", "last" or "none"."""
        n = len(tokens)
        if n > self.capacity:
            raise DecodeError(f"batch overflow: {n} tokens, capacity {self.capacity}")
        self.token[:n] = tokens
        self.pos[:n] = np.arange(start, start + n)
        self.n_seq_id[:n] = 1
        for i in range(n):
            self.seq_id[i][0] = seq
        self.logits[:n] = logits == "all"
        if logits == "last" and n:
            self.logits[n - 1] = 1
        self.n_tokens = n

    def free(self) -> None:
        if self._b is not None:
            ll.llama_batch_free(self._b)
            self._b = None

    def __del__(self) -> None:
        self.free()


class Context:
    """A llama_context with its KV cache. ``tokens`` mirrors sequence 0 of the cache.

    The invariant kept by every method: sequence 0 holds exactly ``tokens`` at positions
    0 .. len(tokens) - 1.
    """

    _ptr = None

    def __init__(self, model: Model, n_ctx: int, n_threads: int, n_batch: int = 512,
                 n_seq_max: int = 1) -> None:
        params = ll.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = n_seq_max
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.swa_full = True  # rolling back rejected tokens needs the whole SWA window
        params.kv_unified = True  # sequences share cells (lookahead copies prefixes between them)
        params.no_perf = True
        params.pooling_type = ll.LLAMA_POOLING_TYPE_NONE  # hidden states, when on, are every output row's
        _log_lines.clear()
        ptr = ll.llama_init_from_model(model._ptr, params)
        if not ptr:
            reason = _log_error() or "llama.cpp refused the context parameters"
            raise ModelError(f"failed to create a context of {n_ctx} tokens for {model.path}: {reason}")
        self.model = model
        self._ptr = ptr
        self._mem = ll.llama_get_memory(ptr)
        self.n_ctx: int = ll.llama_n_ctx(ptr)
        self.n_batch = n_batch
        self.n_seq_max = n_seq_max
        self.threads = n_threads
        self.batch = Batch(n_batch, n_seq_max)
        self.tokens: List[int] = []
        self.t_llama = 0.0  # seconds spent inside llama_decode, for profiling our own overhead
        self.hidden_states = False  # whether a caller wants decodes of verified rows with hidden states
        self._embeddings = False  # llama.cpp's setting now
        self._all_out: Optional[Tuple[int, List[int]]] = None  # the last decode output every row: (rows, asked)
        self._touched = 1  # sequences 1 .. _touched - 1 may hold cells: a decode or copy used them
        self._queued = False  # a decode was queued and not waited for (decode's ``wait``)

    def close(self) -> None:
        if self._ptr:
            self.synchronize()
            self.batch.free()
            ll.llama_free(self._ptr)
            self._ptr = None

    def __del__(self) -> None:
        self.close()

    # --- decoding -------------------------------------------------------------------
    def decode(self, batch: Optional[Batch] = None, hidden: bool = False, wait: bool = True) -> None:
        """Run llama_decode on ``batch`` (default: this context's own batch) to its end;
        ``hidden``: with the hidden states of the rows with logits (see decode_rows).

        On a GPU llama_decode returns once the work is queued; waiting for it here (as reading a
        row of logits would, right after) makes ``t_llama`` the decode's time, which the costs
        learn from: without it, an H100 showed decodes at a tenth of their time. ``wait`` False
        leaves the wait to ``synchronize`` (which reading the outputs calls), so the host may
        work while the GPU decodes; on a CPU the decode is done when llama_decode returns."""
        b = batch or self.batch
        b._b.n_tokens = b.n_tokens
        if hidden != self._embeddings:
            ll.llama_set_embeddings(self._ptr, hidden)
            self._embeddings = hidden
        self._all_out = (b.n_tokens, [i for i in range(b.n_tokens) if b._b.logits[i]]) if hidden else None
        t0 = time.perf_counter()
        rc = ll.llama_decode(self._ptr, b._b)
        self.t_llama += time.perf_counter() - t0
        self._queued = rc == 0
        if wait:
            self.synchronize()
        if rc != 0:
            reasons = {1: "no free slot in the KV cache (context full)", 2: "aborted",
                       -1: "invalid batch"}
            raise DecodeError(f"llama_decode failed with code {rc}: {reasons.get(rc, 'internal error')}")

    def eval(self, tokens: Sequence[int], logits: str = "none") -> None:
        """Append ``tokens`` to sequence 0, in chunks of n_batch.

        With ``logits="all"`` the whole run must fit in one batch (the rows are read back
        with :meth:`logits`); ``"last"`` keeps the last token's row.
        """
        if logits == "all" and len(tokens) > self.n_batch:
            raise DecodeError(f"{len(tokens)} tokens with logits do not fit a batch of {self.n_batch}")
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            last_chunk = start + self.n_batch >= len(tokens)
            self.batch.set_sequence(chunk, len(self.tokens), logits if last_chunk else "none")
            self.decode()
            self.tokens.extend(chunk)

    def synchronize(self) -> None:
        """Wait for the last decode to end (its time counted in ``t_llama``)."""
        if self._queued:
            t0 = time.perf_counter()
            ll.llama_synchronize(self._ptr)
            self.t_llama += time.perf_counter() - t0
            self._queued = False

    def logits(self, n_rows: int) -> np.ndarray:
        """A (n_rows, n_vocab) float32 view of the last decode's output rows (no copy, but where
        a decode with hidden states asked for the logits of some of its rows only)."""
        self.synchronize()
        return self._outputs(ll.llama_get_logits(self._ptr), n_rows, self.model.n_vocab)

    def hidden(self, n_rows: int) -> np.ndarray:
        """A (n_rows, n_embd) float32 array of the last decode's hidden states (``decode_rows``
        with ``hidden``), one per row with logits."""
        self.synchronize()
        ptr = ll.llama_get_embeddings(self._ptr)
        if not ptr or not self._all_out:
            raise DecodeError("the last decode output no hidden states")
        return self._outputs(ptr, n_rows, self.model.n_embd)

    def _outputs(self, ptr: Any, n_rows: int, width: int) -> np.ndarray:
        """The output rows of the last decode that had logits asked for: with hidden states on,
        llama.cpp outputs every row, and those asked for are picked (a copy)."""
        if not self._all_out:
            return np.ctypeslib.as_array(ptr, shape=(n_rows, width))
        n, picked = self._all_out
        every = np.ctypeslib.as_array(ptr, shape=(n, width))
        return every if len(picked) == n else every[picked[:n_rows]]

    def logits_ith(self, i: int) -> np.ndarray:
        """The logits of batch row ``i`` (negative counts from the end), a view."""
        self.synchronize()
        ptr = ll.llama_get_logits_ith(self._ptr, i)
        if not ptr:
            raise DecodeError(f"no logits for batch row {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))

    # --- KV cache -------------------------------------------------------------------
    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens of sequence 0 and drop the rest from the cache, and
        every other sequence whole (those no decode or copy used since they were last emptied
        hold nothing and are skipped). For a context one text uses alone (a cost measurement, a
        reference model); the engine's lanes keep their own bookkeeping.

        Removes positions >= n even when ``tokens`` says there are none: a Ctrl-C that lands
        between llama_decode's return and the update of ``tokens`` leaves a cell unrecorded.
        """
        self.seq_rm(0, n, -1)
        for seq in range(1, self._touched):
            self.seq_rm(seq, -1, -1)
        self._touched = 1
        del self.tokens[n:]

    def decode_rows(self, rows: Sequence[BatchRow], hidden: bool = False,
                    wait: bool = True) -> int:
        """One decode of ``rows`` (BatchRow: token, position, sequence ids, logits?), for callers
        that keep the sequences' bookkeeping themselves (the engine's lanes; ``tokens`` is not
        touched). ``hidden``: the rows with logits have their last hidden state read too
        (:meth:`hidden`; llama.cpp then computes the output of every row); ``wait``: as decode's.
        Returns how many output rows the decode produced, in row order."""
        b = self.batch
        b.clear()
        for token, pos, seqs, logits in rows:
            b.add(token, pos, seqs, logits)
            self._touched = max(self._touched, 1 + max(seqs))
        self.decode(hidden=hidden, wait=wait)
        return sum(1 for row in rows if row[3])

    # A change to the cache first waits for a decode under way.
    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self.synchronize()
        if not ll.llama_memory_seq_rm(self._mem, seq, p0, p1):
            raise DecodeError(f"llama.cpp refused to remove positions [{p0}, {p1}) of sequence {seq}")

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.synchronize()
        self._touched = max(self._touched, dst + 1)
        ll.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def pos_max(self, seq: int = 0) -> int:
        return ll.llama_memory_seq_pos_max(self._mem, seq)

    def pos_min(self, seq: int = 0) -> int:
        return ll.llama_memory_seq_pos_min(self._mem, seq)

    def clear(self) -> None:
        self.synchronize()
        ll.llama_memory_clear(self._mem, True)
        self._touched = 1
        self.tokens.clear()


class KVSequence:
    """One sequence of a context's KV cache kept by a caller of its own (a lane's draft model):
    ``tokens`` mirrors what the sequence holds at positions 0 .. len - 1, as ``Context.tokens``
    does for sequence 0 of a context that one text uses."""

    def __init__(self, ctx: Context, seq: int) -> None:
        if not 0 <= seq < ctx.n_seq_max:
            raise DecodeError(f"sequence {seq} needed, the context has {ctx.n_seq_max}")
        self.ctx, self.seq = ctx, seq
        self.tokens: List[int] = []

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    @property
    def t_llama(self) -> float:
        return self.ctx.t_llama

    def eval(self, tokens: Sequence[int], logits: str = "none") -> None:
        """Append ``tokens`` to the sequence, in chunks of n_batch (see Context.eval)."""
        ctx = self.ctx
        if logits == "all" and len(tokens) > ctx.n_batch:
            raise DecodeError(f"{len(tokens)} tokens with logits do not fit a batch of {ctx.n_batch}")
        for start in range(0, len(tokens), ctx.n_batch):
            chunk = tokens[start:start + ctx.n_batch]
            last = start + ctx.n_batch >= len(tokens)
            n = len(self.tokens)
            ctx.decode_rows([BatchRow(t, n + i, (self.seq,), logits == "all" or (logits == "last" and last and i == len(chunk) - 1))
                             for i, t in enumerate(chunk)])
            self.tokens.extend(chunk)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens."""
        self.ctx.seq_rm(self.seq, n, -1)
        del self.tokens[n:]

    def share(self, other: "KVSequence", n: int) -> None:
        """Go on to the first ``n`` tokens ``other`` holds, which extend this one's: their cells
        gain this sequence's id (seq_cp copies nothing)."""
        m = len(self.tokens)
        if n > m:
            self.ctx.seq_cp(other.seq, self.seq, m, n)
            self.tokens += other.tokens[m:n]

    def logits_ith(self, i: int) -> np.ndarray:
        return self.ctx.logits_ith(i)

    def pos_max(self) -> int:
        return self.ctx.pos_max(self.seq)


def system_info() -> str:
    _ensure_backend()
    return ll.llama_print_system_info().decode("utf-8", errors="replace")


def weight_repacking() -> bool:
    """Whether models load with llama.cpp's repacked weights (its extra buffer types).

    Not when this build has AMX kernels: they crash on Q4_K weights in the first decode
    (llama.cpp issue 20824); scripts/cpu_cmake_args.sh builds without them, which is faster.
    """
    return "AMX_INT8 = 1" not in system_info()


def max_sequences() -> int:
    """The most KV-cache sequences one context may have in this llama.cpp build."""
    return int(ll.llama_max_parallel_sequences())


def supports_gpu_offload() -> bool:
    """Whether this build has a GPU backend (CUDA, Metal, Vulkan...), whether or not a GPU is there
    (llama.cpp's own llama_supports_gpu_offload also counts the RPC backend)."""
    _ensure_backend()
    lib = _devices_lib()
    names = {(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)) or b"").decode()
             for i in range(lib.ggml_backend_reg_count())}
    return bool(names - {"CPU", "RPC", "BLAS"})


def supports_rpc() -> bool:
    """Whether this llama.cpp build has the RPC backend (CMake's -DGGML_RPC=ON)."""
    _ensure_backend()
    return bool(ll.llama_supports_rpc())


def _rpc_devices(servers: Sequence[str]) -> Optional[ctypes.Array]:
    """The devices a model on RPC ``servers`` uses, as llama.cpp's --rpc places it: each server's
    devices first, then this machine's GPUs (the CPU holds the rest), NULL-terminated for
    llama_model_params.devices; None without servers. Each server is asked for its devices (a
    connection, kept for the process: llama.cpp ends the process if it fails, see remote.py)."""
    if not servers:
        return None
    lib = _devices_lib()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise ModelError("this llama.cpp build has no RPC backend (build it with -DGGML_RPC=ON)")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(
        lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server"))
    found = []
    for server in servers:
        server_reg = add_server(server.encode())
        if not server_reg:
            raise ModelError(f"the RPC server {server} offers no device")
        found += [lib.ggml_backend_reg_dev_get(server_reg, i) for i in range(lib.ggml_backend_reg_dev_count(server_reg))]
    found += [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())
              if DEVICE_KINDS[lib.ggml_backend_dev_type(lib.ggml_backend_dev_get(i))] in ("gpu", "igpu")]
    return (ctypes.c_void_p * (len(found) + 1))(*found, None)


class Device(NamedTuple):
    """A device this llama.cpp build can run a model on: ``name`` as ggml names it ("CPU",
    "CUDA0", "MTL0"), ``description`` (the processor or card), ``kind``: one of DEVICE_KINDS."""

    name: str
    description: str
    kind: str


DEVICE_KINDS = ("cpu", "gpu", "igpu", "accel", "meta")  # ggml's enum ggml_backend_dev_type, in its order
_device_api: Optional[ctypes.CDLL] = None


def _devices_lib() -> ctypes.CDLL:
    """ggml's device and backend registries, reached through libllama, which links it (llama-cpp-python binds
    none of it): dlsym searches a library's dependencies too."""
    global _device_api
    if _device_api is None:
        lib = ll._lib
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_count.argtypes = []
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        for name in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
            getattr(lib, name).restype = ctypes.c_char_p
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_reg_count.restype = ctypes.c_size_t
        lib.ggml_backend_reg_count.argtypes = []
        lib.ggml_backend_reg_get.restype = ctypes.c_void_p
        lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
        lib.ggml_backend_reg_name.restype = ctypes.c_char_p
        lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
        lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
        lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
        lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
        lib.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _device_api = lib
    return _device_api


def devices() -> List[Device]:
    """Every device of this build, in ggml's order (GPUs first, the CPU last)."""
    _ensure_backend()
    lib = _devices_lib()
    found = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        kind = lib.ggml_backend_dev_type(dev)
        found.append(Device((lib.ggml_backend_dev_name(dev) or b"").decode(errors="replace"),
                            (lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                            DEVICE_KINDS[kind] if 0 <= kind < len(DEVICE_KINDS) else "other"))
    return found


def gpus() -> List[Device]:
    """The devices a model's layers can be offloaded to (dedicated or integrated GPUs)."""
    return [d for d in devices() if d.kind in ("gpu", "igpu")]


def queues_decodes(model: Model) -> bool:
    """Whether llama_decode returns before the model's decode ends, so that the host may work while
    it runs: a GPU of this build holds some of its layers (RPC servers answer when they are done)."""
    return not model.rpc and model.n_gpu_layers != 0 and bool(gpus())


def backend_name(model: Model) -> str:
    """Where the model's layers run, which is what its costs are measured and cached for: "cpu",
    or the devices (RPC servers first, then GPUs) and how much of the model they hold ("CUDA0 (all
    layers)", "CUDA0 (12 of 28 layers)", "RPC[10.0.0.2:50052]+RPC[10.0.0.3:50052] (all layers,
    split 3,1)"): a partly offloaded model, or one placed otherwise, has a curve of its own."""
    name = offload_name([f"RPC[{server}]" for server in model.rpc] + [d.name for d in gpus()],
                        model.n_gpu_layers, model.n_layer)
    if model.tensor_split and name != "cpu":
        name = f"{name[:-1]}, split {','.join(f'{x:g}' for x in model.tensor_split)})"
    return name


def offload_name(gpu_names: Sequence[str], n_gpu_layers: int, n_layer: int) -> str:
    """backend_name's rule. llama.cpp offloads the last n_gpu_layers layers, the output layer
    counting as one more: all of the model runs there past n_layer of them."""
    if not gpu_names or n_gpu_layers == 0:
        return "cpu"
    layers = "all layers" if n_gpu_layers < 0 or n_gpu_layers > n_layer else f"{n_gpu_layers} of {n_layer + 1} layers"
    return f"{'+'.join(gpu_names)} ({layers})"


# llama.cpp's quantization types by name (llama_ftype), as llama-quantize names them.
QUANT_TYPES = {"F16": ll.LLAMA_FTYPE_MOSTLY_F16, "Q8_0": ll.LLAMA_FTYPE_MOSTLY_Q8_0, "Q6_K": ll.LLAMA_FTYPE_MOSTLY_Q6_K,
               "Q5_K_M": ll.LLAMA_FTYPE_MOSTLY_Q5_K_M, "Q5_0": ll.LLAMA_FTYPE_MOSTLY_Q5_0,
               "Q5_1": ll.LLAMA_FTYPE_MOSTLY_Q5_1, "Q4_K_M": ll.LLAMA_FTYPE_MOSTLY_Q4_K_M,
               "Q4_0": ll.LLAMA_FTYPE_MOSTLY_Q4_0, "Q4_1": ll.LLAMA_FTYPE_MOSTLY_Q4_1,
               "Q3_K_M": ll.LLAMA_FTYPE_MOSTLY_Q3_K_M, "Q2_K": ll.LLAMA_FTYPE_MOSTLY_Q2_K}


def quantize(source: Path, destination: Path, kind: str, threads: int = 0) -> None:
    """Write ``source`` re-quantized to ``kind`` (a QUANT_TYPES name) with llama.cpp's own
    quantizer, already-quantized tensors included."""
    if kind not in QUANT_TYPES:
        raise ModelError(f"unknown quantization {kind!r}; choose from {', '.join(QUANT_TYPES)}")
    check_gguf(source)
    _ensure_backend()
    params = ll.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[kind]
    params.allow_requantize = True
    params.nthread = threads
    _log_lines.clear()
    if ll.llama_model_quantize(str(source).encode(), str(destination).encode(), ctypes.byref(params)) != 0:
        raise ModelError(f"quantizing {source} to {kind} failed: {_log_error() or 'llama.cpp refused it'}")
