"""Configuration dataclasses. Each validates itself and raises ConfigError on bad values. (A
draft source's own settings are declared with its plugin, in its module.)"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, FrozenSet, Optional, Tuple

from .errors import ConfigError

if TYPE_CHECKING:
    from .constraints import Grammar


# llama.cpp rounds a smaller context up to this.
MIN_CTX = 256
# No token of a vocabulary llamaspec ships spells more than 128 bytes: a text longer than a
# context's tokens times this cannot fit it, and is refused before it is read or tokenized.
MAX_TOKEN_BYTES = 256
# Text files read whole besides prompts (references, grammars, schemas), and n-gram cache files, at most.
MAX_TEXT_BYTES = 64 << 20
MAX_CACHE_BYTES = 1 << 30
# The most probable tokens whose log-probabilities a step may report (OpenAI's top_logprobs bound).
MAX_LOGPROBS = 20


def prompt_bytes(n_ctx: int) -> int:
    """The longest text (in bytes) that could fit a context of ``n_ctx`` tokens."""
    return n_ctx * MAX_TOKEN_BYTES


def check_readable(path: "os.PathLike[str] | str", limit: int, what: str) -> int:
    """The size of ``path``, a regular file of at most ``limit`` bytes; ConfigError otherwise
    (checked before reading: a device or a pipe would never end, a huge file would be read whole)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} {path} is not a regular file (a device or a pipe is never read)")
    if st.st_size > limit:
        raise ConfigError(f"{what} {path} is {st.st_size:,} bytes; at most {limit:,} can be used here")
    return st.st_size


def default_threads() -> int:
    """Cores this process may run on (llama.cpp's own default of 4 oversubscribes small machines)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def endpoint(server: str) -> Tuple[str, int]:
    """An RPC server's ``HOST:PORT`` (as rpc-server listens; an IPv6 host in brackets) as (host,
    port); ConfigError for anything else."""
    host, sep, port = server.strip().rpartition(":")
    check(bool(sep and host) and port.isdigit() and 0 < int(port) < 65536,
           f"an RPC server is HOST:PORT (as rpc-server listens), got {server!r}")
    return host.strip("[]"), int(port)


def check(ok: bool, message: str) -> None:
    """ConfigError(``message``) unless ``ok``: the one check every config's __post_init__ makes."""
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class ModelConfig:
    """How to load one model and its context.

    ``path`` is a GGUF file or a model name from models.txt.
    """

    path: str
    n_ctx: int = 4096
    n_threads: Optional[int] = None  # None: every core this process may use
    n_gpu_layers: int = 0  # -1 offloads every layer (Metal/CUDA builds only)
    n_batch: int = 512
    rpc: Tuple[str, ...] = ()  # llama.cpp RPC servers (HOST:PORT) that hold the offloaded layers
    tensor_split: Tuple[float, ...] = ()  # each device's share of those layers, the RPC servers first
    rpc_timeout: float = 30.0  # seconds one decode on RPC servers may take before they count as gone

    def __post_init__(self) -> None:
        check(bool(str(self.path).strip()), "model path is empty")
        check(self.n_ctx >= MIN_CTX, f"context size must be at least {MIN_CTX} tokens (llama.cpp's smallest KV "
                                      f"cache), got {self.n_ctx}")
        check(self.n_threads is None or self.n_threads >= 1, f"threads must be >= 1, got {self.n_threads}")
        check(self.n_gpu_layers >= -1, f"GPU layers must be >= -1, got {self.n_gpu_layers}")
        check(self.n_batch >= 1, f"batch size must be >= 1, got {self.n_batch}")
        for server in self.rpc:
            endpoint(server)
        check(all(math.isfinite(x) and x >= 0 for x in self.tensor_split) and sum(self.tensor_split or [1]) > 0,
               f"a tensor split is shares >= 0, not all 0, got {','.join(map(str, self.tensor_split))}")
        check(self.rpc_timeout > 0, f"the RPC timeout must be > 0 seconds, got {self.rpc_timeout}")

    @property
    def offloaded(self) -> int:
        """The layers placed on devices: ``n_gpu_layers``, or, on RPC servers with none given, every
        one (-1), as llama.cpp's programs place a model with --rpc."""
        return -1 if self.rpc and self.n_gpu_layers == 0 else self.n_gpu_layers

    @property
    def threads(self) -> int:
        return self.n_threads or default_threads()


@dataclass(frozen=True)
class SamplingConfig:
    """Token selection. ``temperature == 0`` is greedy; the other filters then do nothing.

    Filters apply in llama.cpp's order: logit biases, penalties, top-k, typical-p, top-p, min-p,
    then temperature. ``top_k == 0``, ``typical_p == 1``, ``top_p == 1`` and ``min_p == 0``
    disable their filter. Typical-p (locally typical sampling) keeps the tokens whose surprise is
    closest to the distribution's entropy, up to ``typical_p`` of the probability; it may drop the
    most probable token, so even greedy decoding (``temperature == 0``) takes the best it keeps.
    ``seed`` None draws a random seed.

    Penalties and biases change the target's logits before any filter, greedy or not (llama.cpp's
    definitions): each token seen ``c`` times in the last ``penalty_last_n`` tokens of the text
    (prompt included; -1: the whole text, 0: none) has its logit divided by ``repeat_penalty``
    (multiplied, when it is negative), then lowered by ``c * frequency_penalty +
    presence_penalty``; ``logit_bias`` adds (token, bias) pairs to the logits first.

    ``mirostat`` 1 or 2 samples with llama.cpp's mirostat sampler of that version instead of
    top-k, typical-p, top-p and min-p, after the temperature (``sampling.Mirostat``): it aims at a
    surprise of ``mirostat_tau`` bits a token, learning at rate ``mirostat_eta``.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: Optional[int] = None
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    logit_bias: Tuple[Tuple[int, float], ...] = ()
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1

    def __post_init__(self) -> None:
        check(math.isfinite(self.temperature) and self.temperature >= 0,
               f"temperature must be a finite number >= 0, got {self.temperature}")
        check(math.isfinite(self.top_p) and math.isfinite(self.min_p), "top-p and min-p must be finite numbers")
        check(self.seed is None or 0 <= self.seed, f"seed must be >= 0 (or -1: random), got {self.seed}")
        check(self.seed is None or self.seed < 2**63, f"seed must be below 2**63, got {self.seed}")
        check(self.top_k >= 0, f"top-k must be >= 0, got {self.top_k}")
        check(0 < self.top_p <= 1, f"top-p must be in (0, 1], got {self.top_p}")
        check(0 <= self.min_p <= 1, f"min-p must be in [0, 1], got {self.min_p}")
        check(0 < self.typical_p <= 1, f"typical-p must be in (0, 1], got {self.typical_p}")
        check(math.isfinite(self.repeat_penalty) and self.repeat_penalty > 0,
               f"repeat penalty must be a finite number > 0, got {self.repeat_penalty}")
        check(math.isfinite(self.frequency_penalty) and math.isfinite(self.presence_penalty),
               "frequency and presence penalties must be finite numbers")
        check(self.penalty_last_n >= -1, f"the penalty window (repeat-last-n) must be >= -1 (-1: the whole text, "
                                          f"0: none), got {self.penalty_last_n}")
        check(self.mirostat in (0, 1, 2), f"mirostat is 0 (off), 1 or 2 (its version), got {self.mirostat}")
        check(math.isfinite(self.mirostat_tau) and math.isfinite(self.mirostat_eta),
               "mirostat's target entropy (tau) and learning rate (eta) must be finite numbers")
        for token, bias in self.logit_bias:
            check(isinstance(token, int) and token >= 0, f"a logit bias's token must be a token id >= 0, got {token!r}")
            check(not math.isnan(bias) and bias != math.inf, f"token {token}'s logit bias must be a number or "
                                                               f"-inf, got {bias}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether any penalty changes the logits."""
        return self.penalty_last_n != 0 and (self.repeat_penalty != 1 or self.frequency_penalty != 0
                                             or self.presence_penalty != 0)

    @property
    def shaped(self) -> bool:
        """Whether penalties or biases change the logits (the text before a row then matters)."""
        return self.penalized or bool(self.logit_bias)


@dataclass(frozen=True)
class GenerationConfig:
    """When to stop (``max_tokens`` < 0 generates until a stop or a full context), how to sample,
    the ``grammar`` the text must follow, if any, and ``logprobs``: None, or each token's
    log-probability with the ``logprobs`` most probable tokens' (0: the token's alone);
    ``echo``: the prompt's tokens' as well (each after the first, as the model reads them).
    ``logits_processor`` and ``stopping_criteria``: llama-cpp-python's callables, each a function
    of (the text's tokens, a row of logits), asked once per generated token as plain decoding
    asks them (engine/target.py, engine.halted). ``sources``: the draft sources this text may
    use, by name, of those its LlamaSpec runs (None: all of them; empty: plain decoding)."""

    max_tokens: int = 256
    stop: Tuple[str, ...] = ()
    sampling: SamplingConfig = SamplingConfig()
    grammar: Optional["Grammar"] = None
    logprobs: Optional[int] = None
    echo: bool = False
    logits_processor: Optional[Callable[[Any, Any], Any]] = None
    stopping_criteria: Optional[Callable[[Any, Any], bool]] = None
    sources: Optional[FrozenSet[str]] = None

    def __post_init__(self) -> None:
        check(self.max_tokens >= -1, f"the number of tokens to generate must be >= -1 (-1: until a stop or a full "
                                      f"context), got {self.max_tokens}")
        check(all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty")
        check(self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
               f"log-probabilities are asked for the 0 to {MAX_LOGPROBS} most probable tokens, got {self.logprobs}")
        check(not self.echo or self.logprobs is not None, "the prompt's log-probabilities (echo) need logprobs")


@dataclass(frozen=True)
class SpecConfig:
    """Which draft sources run, by name (the names and what each source needs: see
    ``sources/registry.py``). ``sources`` None is ``auto``: every source the loaded models and
    given files allow. An empty set is plain decoding.

    Sources in ``fixed`` are verified whole every step, as llama.cpp's programs do (the draft
    model drafts up to draft-max tokens, lookahead verifies all G candidates and decodes its
    whole window); the others only as far as the planner finds it pays.
    """

    sources: Optional[FrozenSet[str]] = None
    fixed: FrozenSet[str] = frozenset()

    @staticmethod
    def parse(text: str) -> "SpecConfig":
        """``auto``, ``none`` or a comma-separated list of source names."""
        names = [n.strip() for n in text.split(",") if n.strip()]
        if names == ["auto"]:
            return SpecConfig()
        if names == ["none"]:
            return SpecConfig(frozenset())
        check(bool(names) and "auto" not in names and "none" not in names,
               f"--spec takes auto, none or a comma-separated list of draft sources, got {text!r}")
        return SpecConfig(frozenset(names))

    def with_fixed(self, names: FrozenSet[str]) -> "SpecConfig":
        return SpecConfig(self.sources, frozenset(self.fixed | names))
