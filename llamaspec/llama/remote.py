"""Models whose layers are on llama.cpp RPC servers, decoded by a worker process.

llama.cpp's RPC client ends the whole process when a server it talks to dies (GGML_ABORT) and
waits without limit for one that stops answering. So a model placed on RPC servers is loaded and
decoded in a worker process (one for the models of a ModelPool: an rpc-server serves one client
at a time): this process keeps the model's vocabulary (tokenizer, chat template, metadata: a
vocab-only load) and sends the worker what a Context does, one operation at a time, waiting at
most ``timeout`` seconds for each answer. The rows of logits a decode outputs come back
through a file both processes map, not through the pipe.

    this process                                   worker (python -m llamaspec.llama.remote)
    RemoteModel: vocabulary only                   binding.Model(path, rpc=servers)
    RemoteContext ── (op, context id, args) ──▶    binding.Context ── llama_decode ──▶ RPC servers
                  ◀── (value, output rows) ──────  its logits rows ──▶ shared file (mmap)

A worker that dies or does not answer in time is killed; the model is then broken: decodes raise
RemoteError (naming the servers that no longer answer), cache operations do nothing (the caches
went with the worker), and the model has to be loaded again. This process, and every model it
holds locally, goes on.
"""

from __future__ import annotations

import mmap
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from importlib import metadata
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from .. import errors
from ..config import endpoint
from ..errors import DecodeError, ModelError, RemoteError
from ..sequences import BatchRow
from .binding import Context, Model, check_gguf, supports_rpc

# Seconds a worker may take to load a model onto its servers (the weights cross the network).
LOAD_TIMEOUT = 600.0
# Seconds one TCP connection to a server may take before it counts as unreachable.
CONNECT_TIMEOUT = 5.0
# Where the shared logits files live: memory, where the system has it.
_SHARED_DIR = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
# The operations a worker runs on a context, by name (anything else is refused).
_CONTEXT_OPS = frozenset({"decode_rows", "eval", "truncate", "seq_rm", "seq_cp", "pos_max", "pos_min", "clear",
                          "close"})
_DECODES = frozenset({"decode_rows", "eval"})


def unreachable(servers: Sequence[str], timeout: float = CONNECT_TIMEOUT) -> List[str]:
    """``servers`` that do not accept a TCP connection within ``timeout``, each with why."""
    down = []
    for server in servers:
        try:
            socket.create_connection(endpoint(server), timeout=timeout).close()
        except OSError as e:
            down.append(f"{server} ({e.strerror or type(e).__name__})")
    return down


def check_servers(servers: Sequence[str]) -> None:
    """ModelError, before anything is loaded, unless this build has the RPC backend and every
    server accepts a connection."""
    if not supports_rpc():
        raise ModelError(f"this llama-cpp-python was built without llama.cpp's RPC backend; rebuild it with it "
                         f"(from llamaspec's clone): pip cache remove llama_cpp_python; CMAKE_ARGS=\"$(sh "
                         f"scripts/cmake_args.sh)\" pip install --force-reinstall --no-deps "
                         f"llama-cpp-python=={metadata.version('llama-cpp-python')}")
    down = unreachable(servers)
    if down:
        raise ModelError(f"cannot reach the RPC server{'s' if len(down) > 1 else ''} {', '.join(down)}: "
                         f"start rpc-server there (see the README) or fix the address")


class Worker:
    """The worker process that decodes every model of one ModelPool placed on RPC servers (an
    rpc-server serves one client at a time, so the models on it must share one client: a draft
    model beside its target). ``call`` sends it one message and waits at most ``timeout``
    seconds for the answer; a worker that dies or does not answer is killed and ``broken`` says
    why, naming the servers that refuse a connection. It quits when its last model is let go."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.broken: Optional[str] = None
        self.models = 0  # loaded in it and not let go
        self._log = tempfile.TemporaryFile()
        ours, theirs = socket.socketpair()
        self._process: Optional[subprocess.Popen] = subprocess.Popen(
            [sys.executable, "-m", "llamaspec.llama.remote", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        theirs.close()
        self._conn = Connection(ours.detach())

    def call(self, message: tuple, timeout: float, servers: Sequence[str]) -> Any:
        """Send ``message`` and return the answer; RemoteError when the worker has gone or does
        not answer within ``timeout`` (it is broken from then on), naming ``servers`` that fail."""
        with self._lock:
            if self.broken:
                raise RemoteError(f"{self.broken}; the model must be loaded again")
            try:
                self._conn.send(message)
                if not self._conn.poll(timeout):
                    raise TimeoutError
                status, value = self._conn.recv()
            except (OSError, EOFError, TimeoutError) as e:
                self._fail(isinstance(e, TimeoutError), timeout, servers)
                raise RemoteError(f"{self.broken}; the model must be loaded again") from None
        if status == "error":  # the worker's own error (a refused decode), of its own type
            kind, text = value
            error = getattr(errors, kind, None)
            raise (error if isinstance(error, type) and issubclass(error, errors.LlamaspecError) else RemoteError)(text)
        return value

    def _fail(self, timed_out: bool, waited: float, servers: Sequence[str]) -> None:
        """The worker is gone or stuck: kill it and say which servers no longer answer."""
        self._stop()
        down = unreachable(servers, timeout=1.0)
        if down:
            self.broken = f"the RPC server{'s' if len(down) > 1 else ''} {', '.join(down)} stopped answering"
        elif timed_out:
            self.broken = f"the RPC servers {', '.join(servers)} did not answer within {waited:g} s"
        else:
            self.broken = f"the worker decoding on the RPC servers {', '.join(servers)} ended: {self._last_words()}"

    def _last_words(self) -> str:
        """The last line the worker wrote (llama.cpp's reason for aborting, usually)."""
        self._log.seek(0)
        lines = [line for line in self._log.read().decode(errors="replace").splitlines() if line.strip()]
        return lines[-1].strip() if lines else "no message"

    def _stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    def release(self) -> None:
        """One model let go; with the last, the worker quits (its servers are free again)."""
        self.models -= 1
        if self.models > 0 or self._process is None:
            return
        if not self.broken and self._process.poll() is None:
            try:
                self._conn.send(("quit",))
                self._process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._stop()
        self._process = None
        self._conn.close()
        self._log.close()
        self.broken = self.broken or "the model was closed"


class RemoteModel(Model):
    """A model placed on RPC servers (``rpc``, HOST:PORT each; ``tensor_split``: the share of the
    layers each device holds, the RPC servers first), decoded by ``worker``. Its vocabulary is
    loaded here; ``context`` makes contexts in the worker. ``timeout``: the seconds any
    operation may take before the servers count as gone."""

    def __init__(self, path: Path, n_gpu_layers: int, rpc: Sequence[str], tensor_split: Sequence[float],
                 timeout: float, worker: Worker) -> None:
        check_gguf(path)
        for server in rpc:
            endpoint(server)
        check_servers(rpc)
        super().__init__(path, vocab_only=True)
        self.n_gpu_layers, self.timeout, self.worker = n_gpu_layers, timeout, worker
        self.rpc, self.tensor_split = tuple(rpc), tuple(tensor_split)
        worker.models += 1
        try:
            self._id = self.call(("load", str(path), n_gpu_layers, self.rpc, self.tensor_split), LOAD_TIMEOUT)
        except errors.LlamaspecError as e:
            self.close()
            why = worker.broken if isinstance(e, RemoteError) else str(e)
            raise ModelError(f"loading {path.name} onto the RPC servers {', '.join(self.rpc)} failed: {why}") from None

    @property
    def broken(self) -> Optional[str]:  # type: ignore[override]
        return self.worker.broken

    def context(self, n_ctx: int, n_threads: int, n_batch: int = 512, n_seq_max: int = 1) -> "RemoteContext":
        return RemoteContext(self, n_ctx, n_threads, n_batch, n_seq_max)

    def call(self, message: tuple, timeout: Optional[float] = None) -> Any:
        """``message`` to the worker, answered within ``timeout`` (default: the model's)."""
        return self.worker.call(message, self.timeout if timeout is None else timeout, self.rpc)

    def close(self) -> None:
        if getattr(self, "worker", None) is not None:
            if not self.worker.broken and getattr(self, "_id", None) is not None:
                try:
                    self.call(("unload", self._id))
                except errors.LlamaspecError:
                    pass
            self.worker.release()
            self.worker = None
        super().close()

    @property
    def closed(self) -> bool:
        return getattr(self, "worker", None) is None


class RemoteContext:
    """A Context in a RemoteModel's worker: the same methods and bookkeeping (``tokens`` mirrors
    sequence 0 where one text uses it; ``t_llama``: seconds decodes took, the round trip to the
    worker and the servers included, which is what the costs must see)."""

    def __init__(self, model: RemoteModel, n_ctx: int, n_threads: int, n_batch: int = 512,
                 n_seq_max: int = 1) -> None:
        self.model = model
        self._id, self.n_ctx, path = model.call(("context", model._id, n_ctx, n_threads, n_batch, n_seq_max))
        with open(path, "r+b") as f:
            self._rows = mmap.mmap(f.fileno(), 0)
        os.unlink(path)  # both processes keep it mapped; it goes with the last of them
        self.n_batch, self.n_seq_max, self.threads = n_batch, n_seq_max, n_threads
        self.tokens: List[int] = []
        self.t_llama = 0.0
        self._outputs: List[int] = []  # the batch rows of the last decode that have logits

    def _op(self, name: str, *args: Any) -> Any:
        if self.model.broken and name not in _DECODES:
            return None  # the caches went with the worker: nothing to keep consistent
        value, outputs = self.model.call(("op", self._id, name, args))
        if outputs is not None:
            self._outputs = outputs
        return value

    def _decode(self, name: str, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._op(name, *args)
        finally:
            self.t_llama += time.perf_counter() - t0

    hidden_states = False  # decodes on RPC servers return no hidden states

    def decode_rows(self, rows: Sequence[BatchRow], hidden: bool = False,
                    wait: bool = True) -> int:
        """As Context.decode_rows; the decode on the servers is done when it returns (``wait`` aside)."""
        if hidden:
            raise DecodeError("a model on RPC servers returns no hidden states")
        return self._decode("decode_rows", [BatchRow(int(t), int(p), tuple(int(s) for s in seqs), bool(lg))
                                            for t, p, seqs, lg in rows])

    def eval(self, tokens: Sequence[int], logits: str = "none") -> None:
        self._decode("eval", [int(t) for t in tokens], logits, len(self.tokens))
        self.tokens.extend(tokens)

    def synchronize(self) -> None:
        pass  # decode_rows returns with the decode done

    def logits(self, n_rows: int) -> np.ndarray:
        return np.frombuffer(self._rows, dtype=np.float32, count=n_rows * self.model.n_vocab).reshape(n_rows, -1)

    def logits_ith(self, i: int) -> np.ndarray:
        n = len(self._outputs)
        row = i + n if i < 0 else self._outputs.index(i) if i in self._outputs else -1
        if not 0 <= row < n:
            raise DecodeError(f"no logits for batch row {i}")
        return self.logits(n)[row]

    def truncate(self, n: int) -> None:
        self._op("truncate", n)
        del self.tokens[n:]

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self._op("seq_rm", seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self._op("seq_cp", src, dst, p0, p1)

    def pos_max(self, seq: int = 0) -> int:
        found = self._op("pos_max", seq)
        return -1 if found is None else found

    def pos_min(self, seq: int = 0) -> int:
        found = self._op("pos_min", seq)
        return -1 if found is None else found

    def clear(self) -> None:
        self._op("clear")
        self.tokens.clear()

    def close(self) -> None:
        if self._rows is not None and not self.model.closed:
            self._op("close")
        if self._rows is not None:
            try:
                self._rows.close()
            except BufferError:  # a row someone still holds: unmapped with the last of them
                pass
            self._rows = None


# --- the worker process ----------------------------------------------------------------------

class _Worker:
    """The model and its contexts, in the worker process; ``run`` answers one message at a time."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.models: dict = {}  # id -> Model
        self.contexts: dict = {}  # id -> (Context, mapped logits file)
        self._made = 0  # models and contexts made so far: the next one's id

    def run(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                return  # the parent has gone
            if message[0] == "quit":
                return
            try:
                answer = ("ok", getattr(self, message[0])(*message[1:]))
            except Exception as e:  # a llamaspec error (a refused decode) goes back as it is
                answer = ("error", (type(e).__name__, str(e)))
            self.conn.send(answer)

    def load(self, path: str, n_gpu_layers: int, rpc: Tuple[str, ...], tensor_split: Tuple[float, ...]) -> int:
        self._made += 1
        self.models[self._made] = Model(Path(path), n_gpu_layers, rpc=rpc, tensor_split=tensor_split)
        return self._made

    def unload(self, key: int) -> None:
        model = self.models.pop(key)
        for ctx_key in [k for k, (ctx, _) in self.contexts.items() if ctx.model is model]:
            self.op(ctx_key, "close", ())
        model.close()

    def context(self, model_key: int, n_ctx: int, n_threads: int, n_batch: int,
                n_seq_max: int) -> Tuple[int, int, str]:
        model = self.models[model_key]
        ctx = Context(model, n_ctx, n_threads, n_batch, n_seq_max)
        fd, path = tempfile.mkstemp(prefix="llamaspec-logits-", dir=_SHARED_DIR)
        size = n_batch * model.n_vocab * 4  # sparse: only rows written take memory
        os.ftruncate(fd, size)
        rows = mmap.mmap(fd, size)
        os.close(fd)
        self._made += 1
        key = self._made
        self.contexts[key] = (ctx, rows)
        return key, ctx.n_ctx, path

    def op(self, key: int, name: str, args: tuple) -> Tuple[Any, Optional[List[int]]]:
        if name not in _CONTEXT_OPS:
            raise ValueError(f"no such context operation: {name}")
        if name == "close" and key not in self.contexts:  # closed with its model already
            return None, None
        ctx, rows = self.contexts[key]
        if name == "eval":
            tokens, logits, start = args
            del ctx.tokens[start:]  # the parent's mirror is the truth
            value = ctx.eval(tokens, logits)
        else:
            value = getattr(ctx, name)(*args)
        if name == "close":
            rows.close()
            del self.contexts[key]
            return value, None
        if name not in _DECODES:
            return value, None
        b = ctx.batch
        outputs = np.flatnonzero(b.logits[:b.n_tokens]).tolist()
        if outputs:
            out = np.frombuffer(rows, dtype=np.float32, count=len(outputs) * ctx.model.n_vocab)
            out[:] = ctx.logits(len(outputs)).ravel()
        return value, outputs


if __name__ == "__main__":
    _Worker(Connection(int(sys.argv[1]))).run()
