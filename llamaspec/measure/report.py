"""What a benchmark reports, shared by ``bench`` and ``compare``: the machine, the rows, the
table, and the JSON shape, derived from the dataclasses themselves.

``llamaspec bench --json FILE`` writes ``asdict(BenchReport)``; ``validate(report, BenchReport)``
checks parsed JSON against the shape ``shape_of(BenchReport)`` (every field, its type, nested
dataclasses, lists and optional values).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import typing
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Dict, List, Optional, Sequence

from ..llama.binding import backend_name
from ..engine.stats import SourceStats
from .settings import BenchSettings


@dataclass
class Machine:
    platform: str
    cpus: int
    threads: int
    backend: str
    llama_cpp_python: str


def machine_info(spec: Any) -> Machine:
    """The machine a LlamaSpec runs on."""
    return Machine(platform.platform(), os.cpu_count() or 0, spec.ctx.threads, backend_name(spec.model),
                   metadata.version("llama-cpp-python"))


def version() -> str:
    try:
        return metadata.version("llamaspec")
    except metadata.PackageNotFoundError:  # run from a checkout on PYTHONPATH (scripts/gpu_check.sh)
        return "not installed"


@dataclass
class StrategyInfo:
    name: str
    description: str
    load_rss_mb: float  # resident memory its loading and warm-up added


@dataclass
class PromptInfo:
    name: str
    description: str
    n_prompt: int
    copy_bound: float  # the copy oracle's speed-up on plain's answer, with the measured cost curve
    constrained: bool = False  # its answer follows a JSON schema


@dataclass
class Row:
    """One strategy on one prompt, over every repetition."""

    prompt: str
    strategy: str
    decode_tps: List[float]  # every run
    decode_tps_median: float
    decode_tps_min: float
    decode_tps_max: float
    speedup: float  # median over repetitions of decode t/s over plain's (same prompt, same repetition)
    bound_share: float  # speedup over the prompt's copy-oracle bound
    accept: float  # percent of verified candidate tokens accepted
    tokens_per_call: float
    prompt_tps: float  # median
    n_predict: int  # sums over the runs
    n_drafted: int
    n_accept: int
    n_target_calls: int
    sources: Dict[str, SourceStats]  # per draft source, sums over the runs
    peak_rss_mb: float
    output: str  # "same" | "differs from token I" | "not checked (sampling)"
    grammar_ms_per_token: float = 0.0  # following the schema (masks, checks, forced tokens), per emitted token
    # what the planner chose, per target call that verified candidates: its deepest candidate
    # token, its rows (candidate tokens) and its branches; and the share of the loop's time spent
    # outside llama_decode (llamaspec's own work: planning, sources, sampling); the share of
    # target calls that asked the sources (see planning.gate)
    depth: float = 0.0
    rows: float = 0.0
    branches: float = 0.0
    python_share: float = 0.0
    asked: float = 0.0


@dataclass
class BenchReport:
    llamaspec: str
    date: str
    machine: Machine
    settings: BenchSettings
    memory: str  # how peak_rss_mb was measured
    strategies: List[StrategyInfo]
    prompts: List[PromptInfo]
    rows: List[Row] = field(default_factory=list)
    decode_ms: float = 0.0  # one single-token decode of the target, as the cost curve measured it

    def table(self) -> str:
        """The rows as a readable table, with the settings above it."""
        s, m = self.settings, self.machine
        mode = "greedy" if s.temperature == 0 else f"temp {s.temperature}"
        lines = [f"{s.model}, {s.n_predict} tokens, {mode}, threads {m.threads} ({m.backend}), "
                 f"{s.repeat} run(s) each" + (f"; draft {s.draft_model}" if s.draft_model else ""),
                 "memory added by loading each strategy: "
                 + ", ".join(f"{st.name} {st.load_rss_mb:.0f} MB" for st in self.strategies),
                 "copy-oracle bound: " + ", ".join(f"{p.name} {p.copy_bound:.2f}x" for p in self.prompts)]
        header = ("prompt", "strategy", "decode t/s", "min-max", "vs plain", "of bound", "accept", "tok/call",
                  "prompt t/s", "peak MB", "output vs plain")
        cells = [header] + [(
            r.prompt, r.strategy, f"{r.decode_tps_median:.2f}", f"{r.decode_tps_min:.1f}-{r.decode_tps_max:.1f}",
            f"{r.speedup:.2f}x", f"{100 * r.bound_share:.0f}%", f"{r.accept:.1f}%" if r.n_drafted else "-",
            f"{r.tokens_per_call:.2f}", f"{r.prompt_tps:.1f}", f"{r.peak_rss_mb:.0f}", r.output) for r in self.rows]
        constrained = {p.name for p in self.prompts if p.constrained}
        grammar = [f"{r.prompt} {r.strategy} {r.grammar_ms_per_token:.3f} ms"
                   + (f" ({100 * r.grammar_ms_per_token / self.decode_ms:.1f}%)" if self.decode_ms else "")
                   + (f", its forced tokens accepted {r.sources['grammar'].accepted}/{r.sources['grammar'].drafted}"
                      if "grammar" in r.sources else "")
                   for r in self.rows if r.prompt in constrained]
        if grammar:
            lines.append(f"following the schema, per token (of a {self.decode_ms:.1f} ms single-token decode): "
                         + ", ".join(grammar))
        return "\n".join(lines + format_columns(cells, left=(0, 1, len(header) - 1)))


def format_columns(cells: Sequence[Sequence[str]], left: Sequence[int] = ()) -> List[str]:
    """Rows of cells as aligned lines: the columns numbered in ``left`` left-aligned, the others right."""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return ["  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
            for row in cells]


def first_difference(tokens: Sequence[int], reference: Sequence[int]) -> Optional[int]:
    """Where ``tokens`` first leaves ``reference``, or None when they are equal."""
    if list(tokens) == list(reference):
        return None
    return next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))


# --- JSON shape ---------------------------------------------------------------------------
Shape = Any  # see check_shape


def shape_of(tp: Any) -> Shape:
    """The JSON shape of a type: a dataclass is a dict of its fields' shapes, List[X] (and Tuple[X, ...]) is [X],
    Dict[str, X] is {str: X}, Optional[X] is (X, NoneType), Any is object, else the type."""
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp, vars(sys.modules[tp.__module__]))
        return {f.name: shape_of(hints[f.name]) for f in dataclasses.fields(tp)}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        return tuple(shape_of(a) for a in args)
    if origin is list or (origin is tuple and args[-1:] == (Ellipsis,)):  # Tuple[X, ...]: a JSON list too
        return [shape_of(args[0])]
    if origin is dict:
        return {str: shape_of(args[1])}
    if tp is Any:
        return object
    return tp


def check_shape(value: Any, shape: Shape, where: str = "report") -> None:
    """Raise ValueError, naming the first place that differs, unless ``value`` has ``shape``:
    a dict of key -> shape (exactly those keys), {str: shape} (any keys), [shape] (a list of
    those), a type (float takes an int too), or a tuple of alternatives."""
    if isinstance(shape, tuple):
        for alternative in shape[:-1]:
            try:
                return check_shape(value, alternative, where)
            except ValueError:
                pass
        check_shape(value, shape[-1], where)
    elif isinstance(shape, dict) and list(shape) == [str]:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
        for key, sub in value.items():
            check_shape(sub, shape[str], f"{where}.{key}")
    elif isinstance(shape, dict):
        if not isinstance(value, dict) or set(value) != set(shape):
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise ValueError(f"{where}: expected the keys {sorted(shape)}, got {got}")
        for key, sub in shape.items():
            check_shape(value[key], sub, f"{where}.{key}")
    elif isinstance(shape, list):
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
        for i, item in enumerate(value):
            check_shape(item, shape[0], f"{where}[{i}]")
    elif shape is object:
        return
    elif (isinstance(value, bool) and shape is not bool) or \
            not isinstance(value, (float, int) if shape is float else shape):
        raise ValueError(f"{where}: expected {shape.__name__}, got {value!r}")


def validate(report: Dict[str, Any], cls: type = BenchReport) -> None:
    """Raise ValueError unless ``report`` (parsed JSON) has the shape of ``cls``."""
    check_shape(report, shape_of(cls))
