"""Benchmarks: plain decoding and each strategy on a prompt suite, in one process.

Every strategy runs with the same models and settings. Each one is loaded once and warmed up
once; then, repetition after repetition, every prompt runs through every strategy in turn
(interleaved, so drift of a shared machine hits all of them alike), each run from an empty
KV cache so that it evaluates the whole prompt. A row reports one strategy on one prompt.

The suite (``data/bench_suite.json``) has prompts where speculation should help (code
editing, summarizing with quotes, JSON from a record: the answer copies the prompt) and
where it should not (open chat, a long answer); each runs through the model's chat template.

Peak memory (``peak_rss_mb``) is the peak resident set size of the whole benchmark process
during the row's runs: on Linux the high-water mark is reset before each run
(``/proc/self/clear_refs``) and read from ``VmHWM``; elsewhere it is ``ru_maxrss``, the
process's peak since it started. Every strategy stays loaded, so it includes the models of
the other strategies too; ``load_rss_mb`` is the resident memory one strategy added when it
was loaded and warmed up (its models, KV caches and buffers).

The JSON report (``BenchReport.to_dict()``, ``llamaspec bench --json FILE``) has the shape
``REPORT_SHAPE`` and ``validate_report`` checks it::

    {"llamaspec": version, "date": ISO 8601,
     "machine": {"platform", "cpus", "threads", "backend", "llama_cpp_python"},
     "settings": {"model", "draft_model", "n_predict", "n_ctx", "n_threads", "n_gpu_layers",
                  "n_gpu_layers_draft", "draft_max", "draft_min", "draft_p_min",
                  "lookup_draft_max", "lookahead_w", "lookahead_n", "lookahead_g", "lookahead_fixed", "temperature",
                  "seed", "repeat"},
     "memory": how peak_rss_mb was measured,
     "strategies": [{"name", "description", "load_rss_mb"}],
     "prompts": [{"name", "description", "n_prompt"}],
     "rows": [{"prompt", "strategy",
               "decode_tps": [every run], "decode_tps_median", "decode_tps_min", "decode_tps_max",
               "speedup": median decode t/s over plain's on the same prompt,
               "accept": percent of drafted tokens accepted, "tokens_per_call": tokens per target call,
               "prompt_tps": median, "n_predict", "n_drafted", "n_accept", "n_target_calls": sums
               over the runs, "peak_rss_mb",
               "output": "same" | "differs from token I" | "not checked (sampling)"}]}
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from tqdm import tqdm

from ._llama import Model, backend_name
from .api import LlamaSpec, Result
from .chat import ChatTemplate, Message
from .models import resolve_model
from .config import DraftConfig, LookaheadConfig, LookupConfig, ModelConfig, SamplingConfig
from .errors import ConfigError

SUITE_FILE = Path(__file__).parent / "data" / "bench_suite.json"


@dataclass(frozen=True)
class BenchSettings:
    """Models and settings shared by every strategy. Greedy unless ``temperature`` > 0."""

    model: str
    draft_model: Optional[str] = None
    n_predict: int = 256
    n_ctx: int = 4096
    n_threads: Optional[int] = None
    n_gpu_layers: int = 0
    n_gpu_layers_draft: int = 0
    draft_max: int = 16
    draft_min: int = 0
    draft_p_min: float = 0.75
    lookup_draft_max: int = LookupConfig().draft_max
    lookahead_w: int = LookaheadConfig().w
    lookahead_n: int = LookaheadConfig().n
    lookahead_g: int = LookaheadConfig().g
    lookahead_fixed: bool = False  # every step decodes the whole window and all G candidates
    temperature: float = 0.0
    seed: Optional[int] = None
    repeat: int = 3

    def __post_init__(self) -> None:
        if self.n_predict < 1 and self.n_predict != -1:
            raise ConfigError(f"the number of tokens to generate must be >= 1 (or -1: until a stop), "
                              f"got {self.n_predict}")
        if self.repeat < 1:
            raise ConfigError(f"repeat must be >= 1, got {self.repeat}")
        self.draft_config(), self.lookup_config(), self.lookahead_config(), self.target_config()  # validate now
        SamplingConfig(temperature=self.temperature, seed=self.seed)

    def target_config(self) -> ModelConfig:
        return ModelConfig(self.model, n_ctx=self.n_ctx, n_threads=self.n_threads, n_gpu_layers=self.n_gpu_layers)

    def draft_model_config(self) -> Optional[ModelConfig]:
        if not self.draft_model:
            return None
        return ModelConfig(self.draft_model, n_ctx=self.n_ctx, n_threads=self.n_threads,
                           n_gpu_layers=self.n_gpu_layers_draft)

    def draft_config(self) -> DraftConfig:
        return DraftConfig(self.draft_max, self.draft_min, self.draft_p_min)

    def lookup_config(self) -> LookupConfig:
        return LookupConfig(draft_max=self.lookup_draft_max)

    def lookahead_config(self) -> LookaheadConfig:
        return LookaheadConfig(w=self.lookahead_w, n=self.lookahead_n, g=self.lookahead_g,
                               adaptive=not self.lookahead_fixed)


@dataclass(frozen=True)
class Strategy:
    """How to build a strategy's LlamaSpec: whether it uses the draft model, and its other
    keyword arguments."""

    description: str
    uses_draft: bool
    options: Callable[[BenchSettings], Dict[str, Any]]


STRATEGIES: Dict[str, Strategy] = {
    "plain": Strategy("plain decoding: one token per target call", False, lambda s: {}),
    "lookup": Strategy("lookup decoding: drafts copied from the prompt and the output", False,
                       lambda s: {"lookup": s.lookup_config()}),
    "lookahead": Strategy("lookahead decoding: n-grams from Jacobi iterations", False,
                          lambda s: {"lookahead": s.lookahead_config()}),
    "draft": Strategy("draft model", True, lambda s: {}),
    "lookup+draft": Strategy("lookup first, then the draft model", True, lambda s: {"lookup": s.lookup_config()}),
}


def default_strategies(settings: BenchSettings) -> List[str]:
    """Plain and every strategy the given models allow (those with a draft need one)."""
    return [name for name, s in STRATEGIES.items() if settings.draft_model or not s.uses_draft]


def check_strategies(names: Sequence[str], settings: BenchSettings) -> None:
    """ConfigError for an unknown name or a strategy that needs a draft model when none is given."""
    for name in names:
        if name not in STRATEGIES:
            raise ConfigError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
        if STRATEGIES[name].uses_draft and not settings.draft_model:
            raise ConfigError(f"strategy {name!r} needs a draft model (-md)")


def build_spec(name: str, settings: BenchSettings, cache_dir: Optional[Path] = None,
               progress: bool = True) -> LlamaSpec:
    strategy = STRATEGIES[name]
    draft = settings.draft_model_config() if strategy.uses_draft else None
    return LlamaSpec(settings.target_config(), draft, settings.draft_config(), cache_dir, progress,
                     **strategy.options(settings))


# --- the prompt suite ---------------------------------------------------------------------
@dataclass(frozen=True)
class SuitePrompt:
    name: str
    description: str
    user: str
    system: str = ""

    @property
    def messages(self) -> List[Message]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + [{"role": "user", "content": self.user}]


def render(model_path: Path, prompts: Sequence[SuitePrompt]) -> List[str]:
    """Each prompt in the model's chat template (read from the file, the weights not loaded)."""
    vocab = Model(model_path, vocab_only=True)
    try:
        template = ChatTemplate(vocab)
        return [template.render(p.messages) for p in prompts]
    finally:
        vocab.close()


def load_suite(names: Optional[Sequence[str]] = None, path: Path = SUITE_FILE) -> List[SuitePrompt]:
    """The shipped prompts, or those named (in that order); ConfigError for an unknown name."""
    suite = {p["name"]: SuitePrompt(**p) for p in json.loads(path.read_text(encoding="utf-8"))}
    if names is None:
        return list(suite.values())
    unknown = [n for n in names if n not in suite]
    if unknown:
        raise ConfigError(f"unknown prompt {unknown[0]!r}; the suite has: {', '.join(suite)}")
    return [suite[n] for n in names]


# --- memory -------------------------------------------------------------------------------
def _status_mb(field_name: str) -> Optional[float]:
    """A field of /proc/self/status in MB (Linux), else None."""
    try:
        with open("/proc/self/status") as f:
            match = re.search(rf"^{field_name}:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        return None
    return int(match.group(1)) / 1024 if match else None


def _max_rss_mb() -> float:
    try:
        import resource
    except ImportError:  # Windows
        return 0.0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, kB elsewhere


def reset_peak_rss() -> bool:
    """Reset the process's peak-RSS mark (Linux); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    return _status_mb("VmHWM") or _max_rss_mb()


def rss_mb() -> float:
    """Resident memory now (Linux); elsewhere the peak so far, which grows as models load."""
    return _status_mb("VmRSS") or _max_rss_mb()


def memory_method() -> str:
    if reset_peak_rss() and _status_mb("VmHWM") is not None:
        return "peak RSS of the process during the runs (VmHWM, reset before each run)"
    if _max_rss_mb():
        return "peak RSS of the process since it started (ru_maxrss)"
    return "not measured on this platform"


# --- results ------------------------------------------------------------------------------
@dataclass
class StrategyInfo:
    name: str
    description: str
    load_rss_mb: float


@dataclass
class PromptInfo:
    name: str
    description: str
    n_prompt: int


@dataclass
class Row:
    """One strategy on one prompt, over every repetition."""

    prompt: str
    strategy: str
    decode_tps: List[float]
    decode_tps_median: float
    decode_tps_min: float
    decode_tps_max: float
    speedup: float
    accept: float
    tokens_per_call: float
    prompt_tps: float
    n_predict: int
    n_drafted: int
    n_accept: int
    n_target_calls: int
    peak_rss_mb: float
    output: str


@dataclass
class BenchReport:
    llamaspec: str
    date: str
    machine: Dict[str, Any]
    settings: Dict[str, Any]
    memory: str
    strategies: List[StrategyInfo]
    prompts: List[PromptInfo]
    rows: List[Row] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        """The rows as a readable table, with the settings above it."""
        s, m = self.settings, self.machine
        mode = "greedy" if s["temperature"] == 0 else f"temp {s['temperature']}"
        lines = [f"{s['model']}, {s['n_predict']} tokens, {mode}, threads {m['threads']} ({m['backend']}), "
                 f"{s['repeat']} run(s) each"
                 + (f"; draft {s['draft_model']} (draft-max {s['draft_max']}, draft-p-min {s['draft_p_min']})"
                    if s["draft_model"] else ""),
                 "memory added by loading each strategy: "
                 + ", ".join(f"{st.name} {st.load_rss_mb:.0f} MB" for st in self.strategies)]
        header = ("prompt", "strategy", "decode t/s", "min-max", "vs plain", "accept", "tok/call",
                  "prompt t/s", "peak MB", "output vs plain")
        cells = [header] + [(
            r.prompt, r.strategy, f"{r.decode_tps_median:.2f}", f"{r.decode_tps_min:.1f}-{r.decode_tps_max:.1f}",
            f"{r.speedup:.2f}x", f"{r.accept:.1f}%" if r.n_drafted else "-", f"{r.tokens_per_call:.2f}",
            f"{r.prompt_tps:.1f}", f"{r.peak_rss_mb:.0f}", r.output) for r in self.rows]
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


def _row(prompt: str, strategy: str, runs: List[Tuple[Result, float]], plain: Optional[Row],
         plain_tokens: List[int], greedy: bool) -> Row:
    stats = [r.stats for r, _ in runs]
    tps = [s.decode_tps for s in stats]
    median = statistics.median(tps)
    n_predict, n_calls = sum(s.n_predict for s in stats), sum(s.n_target_calls for s in stats)
    n_drafted, n_accept = sum(s.n_drafted for s in stats), sum(s.n_accept for s in stats)
    output = "not checked (sampling)"
    if greedy:
        diffs = [first_difference(r.tokens, plain_tokens) for r, _ in runs]
        first = min((d for d in diffs if d is not None), default=None)
        output = "same" if first is None else f"differs from token {first}"
    base = plain.decode_tps_median if plain else median
    return Row(prompt, strategy, tps, median, min(tps), max(tps), median / base if base else 0.0,
               100.0 * n_accept / n_drafted if n_drafted else 0.0, n_predict / n_calls if n_calls else 0.0,
               statistics.median(s.prompt_tps for s in stats), n_predict, n_drafted, n_accept, n_calls,
               max(peak for _, peak in runs), output)


def machine_info(spec: LlamaSpec) -> Dict[str, Any]:
    return {"platform": platform.platform(), "cpus": os.cpu_count() or 0, "threads": spec.ctx.threads,
            "backend": backend_name(spec.model), "llama_cpp_python": metadata.version("llama-cpp-python")}


def version() -> str:
    return metadata.version("llamaspec")


def run_bench(settings: BenchSettings, strategies: Optional[Sequence[str]] = None,
              prompts: Optional[Sequence[SuitePrompt]] = None, cache_dir: Optional[Path] = None,
              progress: bool = True) -> BenchReport:
    """Run plain decoding and each strategy (default: every one the models allow) on the
    prompts (default: the whole suite), ``settings.repeat`` times, and report per row."""
    names = list(strategies) if strategies is not None else default_strategies(settings)
    check_strategies(names, settings)
    names = ["plain"] + [n for n in dict.fromkeys(names) if n != "plain"]  # plain first, always
    prompts = list(prompts) if prompts is not None else load_suite()
    if not prompts:
        raise ConfigError("no prompts to run")
    twice = [p.name for i, p in enumerate(prompts) if p.name in (q.name for q in prompts[:i])]
    if twice:
        raise ConfigError(f"two prompts are named {twice[0]!r}")
    texts = render(resolve_model(settings.model, cache_dir, progress), prompts)  # no chat template: fail now
    specs: Dict[str, LlamaSpec] = {}
    bar = tqdm(total=len(names) * (1 + settings.repeat * len(prompts)), desc="bench", unit="run",
               file=sys.stderr, disable=not progress)
    try:
        infos = []
        for name in names:
            bar.set_postfix_str(f"loading {name}")
            before = rss_mb()
            spec = specs[name] = build_spec(name, settings, cache_dir, progress)
            spec.generate("Hello", max_tokens=4, temperature=0)  # warm-up: page the weights in
            spec.reset()
            infos.append(StrategyInfo(name, STRATEGIES[name].description, rss_mb() - before))
            bar.update()
        plain = specs["plain"]
        machine = machine_info(plain)
        inputs = [plain.tokenize(text, add_special=False) for text in texts]
        method = memory_method()
        runs: Dict[Tuple[str, str], List[Tuple[Result, float]]] = {}
        for i in range(settings.repeat):
            for prompt, tokens in zip(prompts, inputs):
                for name, spec in specs.items():
                    bar.set_postfix_str(f"{prompt.name} {name}")
                    spec.reset()  # every run evaluates the whole prompt
                    reset_peak_rss()
                    seed = None if settings.seed is None else settings.seed + i
                    result = spec.generate(tokens, max_tokens=settings.n_predict,
                                           temperature=settings.temperature, seed=seed)
                    runs.setdefault((prompt.name, name), []).append((result, peak_rss_mb()))
                    bar.update()
    finally:
        bar.close()
        for spec in specs.values():
            spec.close()
    report = BenchReport(version(), datetime.now(timezone.utc).isoformat(timespec="seconds"),
                         machine, asdict(settings), method, infos,
                         [PromptInfo(p.name, p.description, len(t)) for p, t in zip(prompts, inputs)])
    greedy = settings.temperature == 0
    for prompt in prompts:
        plain_tokens = runs[(prompt.name, "plain")][0][0].tokens
        base = _row(prompt.name, "plain", runs[(prompt.name, "plain")], None, plain_tokens, greedy)
        report.rows.append(base)
        report.rows += [_row(prompt.name, name, runs[(prompt.name, name)], base, plain_tokens, greedy)
                        for name in names[1:]]
    return report


# --- JSON shape ---------------------------------------------------------------------------
Shape = Any  # see check_shape

REPORT_SHAPE: Dict[str, Shape] = {
    "llamaspec": str, "date": str,
    "machine": {"platform": str, "cpus": int, "threads": int, "backend": str, "llama_cpp_python": str},
    "settings": {"model": str, "draft_model": (str, type(None)), "n_predict": int, "n_ctx": int,
                 "n_threads": (int, type(None)), "n_gpu_layers": int, "n_gpu_layers_draft": int,
                 "draft_max": int, "draft_min": int, "draft_p_min": float, "lookup_draft_max": int,
                 "lookahead_w": int, "lookahead_n": int, "lookahead_g": int, "lookahead_fixed": bool,
                 "temperature": float, "seed": (int, type(None)), "repeat": int},
    "memory": str,
    "strategies": [{"name": str, "description": str, "load_rss_mb": float}],
    "prompts": [{"name": str, "description": str, "n_prompt": int}],
    "rows": [{"prompt": str, "strategy": str, "decode_tps": [float], "decode_tps_median": float,
              "decode_tps_min": float, "decode_tps_max": float, "speedup": float, "accept": float,
              "tokens_per_call": float, "prompt_tps": float, "n_predict": int, "n_drafted": int,
              "n_accept": int, "n_target_calls": int, "peak_rss_mb": float, "output": str}],
}


def check_shape(value: Any, shape: Shape, where: str = "report") -> None:
    """Raise ValueError, naming the first place that differs, unless ``value`` has ``shape``:
    a dict of key -> shape (exactly those keys), [shape] (a list of those), a type (float
    takes an int too), or a tuple of alternatives."""
    if isinstance(shape, tuple):
        for alternative in shape[:-1]:
            try:
                return check_shape(value, alternative, where)
            except ValueError:
                pass
        check_shape(value, shape[-1], where)
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
    elif (isinstance(value, bool) and shape is not bool) or \
            not isinstance(value, (float, int) if shape is float else shape):
        raise ValueError(f"{where}: expected {shape.__name__}, got {value!r}")


def validate_report(report: Dict[str, Any]) -> None:
    """Raise ValueError unless ``report`` (parsed JSON) has the documented shape."""
    check_shape(report, REPORT_SHAPE)


# --- plot ---------------------------------------------------------------------------------
PLOT_HINT = "--plot needs matplotlib: pip install 'llamaspec[plot]'"


def require_matplotlib() -> None:
    """ConfigError telling how to install matplotlib when it is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(PLOT_HINT) from None


def write_plot(report: BenchReport, path: Path) -> None:
    """A bar chart of each strategy's speed-up over plain, grouped by prompt, as PNG."""
    require_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prompts = [p.name for p in report.prompts]
    strategies = [s.name for s in report.strategies if s.name != "plain"] or ["plain"]
    speedup = {(r.prompt, r.strategy): r.speedup for r in report.rows}
    width = 0.8 / len(strategies)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(prompts)), 4))
    for j, name in enumerate(strategies):
        xs = [i + (j - (len(strategies) - 1) / 2) * width for i in range(len(prompts))]
        ax.bar(xs, [speedup[(p, name)] for p in prompts], width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(prompts)))
    ax.set_xticklabels(prompts)
    ax.set_ylabel("decode speed-up over plain")
    ax.set_title(f"{Path(report.settings['model']).name}, {report.settings['n_predict']} tokens, "
                 f"{report.machine['threads']} threads ({report.machine['backend']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
