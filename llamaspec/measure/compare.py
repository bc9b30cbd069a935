"""llama.cpp's own example programs and llamaspec side by side, on this machine.

Each strategy is paired with the llama.cpp program that implements it (``PROGRAMS``). Both
sides get the same models, raw prompt (special tokens parsed), token count, threads, context
size and draft settings, greedy. The program's summary lines are parsed (pure functions
below), its generated text is cut out of its stdout and compared with llamaspec's.

Programs are looked for in ``bin_dir`` when given, else on PATH, then where
scripts/build_llama_cpp.sh puts them by default. A missing program, a failure or a timeout
is reported in its row; the other rows still run.

The JSON report (``llamaspec compare --json FILE``) is ``asdict(CompareReport)``;
``report.validate(parsed, CompareReport)`` checks its shape, derived from the dataclasses.

Timing is what each side reports: llama.cpp's "decoded ... t/s" line (its "eval time" for
llama-completion) and llamaspec's Stats.decode_tps. With ``repeat`` > 1 each side keeps its
run of median decode speed. The texts agree ("same") when one is a prefix of the other:
llama.cpp's programs may run a few tokens past -n and print the end-of-generation token.
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from tqdm import tqdm

from ..llama import models
from ..llama.binding import weight_repacking
from ..api import LlamaSpec, Result
from ..errors import ConfigError
from .report import Machine, format_columns, machine_info, version
from .settings import BenchSettings, build_spec, check_strategies, default_strategies as bench_strategies
from .suite import SuitePrompt, render

BUILD_HINT = "build it with scripts/build_llama_cpp.sh"

# llamaspec strategy -> the llama.cpp program that implements it
PROGRAMS: Dict[str, str] = {
    "plain": "llama-completion",
    "draft": "llama-speculative-simple",
    "lookup": "llama-lookup",
    "lookahead": "llama-lookahead",
}


# compiled into llama-lookahead, which decodes the whole window and all G candidates every step
LLAMA_LOOKAHEAD = {"lookahead_w": 15, "lookahead_n": 5, "lookahead_g": 15}


def matched(settings: BenchSettings) -> BenchSettings:
    """``settings`` with llamaspec's lookup and lookahead set as the programs run them: lookup
    drafts at most --draft-max tokens, lookahead uses llama-lookahead's W, N and G and, like it,
    decodes the whole window every step."""
    return replace(settings, sources={**settings.sources, "lookup_draft_max": settings.setting("draft_max"),
                                      **LLAMA_LOOKAHEAD}, fixed=tuple(sorted({*settings.fixed, "lookahead"})))


def default_strategies(settings: BenchSettings, cache_dir: Optional[Path] = None) -> List[str]:
    """Every strategy both sides have, the draft model's only when one is given."""
    return [s for s in bench_strategies(settings, cache_dir) if s in PROGRAMS]


def default_bin_dir() -> Path:
    """Where scripts/build_llama_cpp.sh puts the programs when given no directory."""
    return Path.home() / ".cache" / "llamaspec" / f"llama.cpp-{metadata.version('llama-cpp-python')}" / "build" / "bin"


def find_program(name: str, bin_dir: Optional[Path] = None) -> Optional[Path]:
    """The program in ``bin_dir`` if given (only there), else on PATH or in default_bin_dir()."""
    dirs = [bin_dir] if bin_dir is not None else [None, default_bin_dir()]
    for d in dirs:
        found = shutil.which(name, path=None if d is None else str(d))
        if found:
            return Path(found)
    return None


def command(strategy: str, program: Path, model: Path, draft: Optional[Path], prompt_file: Path,
            settings: BenchSettings, threads: int) -> List[str]:
    """The program's command line for the same run as llamaspec's (greedy)."""
    s = settings
    target = s.target_config()
    cmd = [str(program), "-m", str(model), "-f", str(prompt_file), "-n", str(s.n_predict), "-c", str(s.n_ctx),
           "-t", str(threads), "--temp", "0", "-ngl", _layers(target.offloaded)]  # the programs default to "auto"
    if target.rpc:  # the same RPC servers; the programs offload -ngld of the draft's layers to them too
        cmd += ["--rpc", ",".join(target.rpc)]
    if target.tensor_split:
        cmd += ["-ts", ",".join(f"{x:g}" for x in target.tensor_split)]
    if not weight_repacking():
        cmd += ["--no-repack"]  # the same kernels as llamaspec's
    if strategy == "plain":
        cmd += ["-no-cnv", "--no-display-prompt"]  # raw prompt, no chat template; stdout is the text
    elif strategy == "draft":
        cmd += ["-md", str(draft), "-td", str(threads), "--spec-type", "draft-simple",
                "--spec-draft-n-max", str(s.setting("draft_max")), "--spec-draft-n-min", str(s.setting("draft_min")),
                "--spec-draft-p-min", str(s.setting("draft_p_min")),
                "-ngld", _layers(s.draft_model_config().offloaded if s.draft_model else s.n_gpu_layers_draft)]
    elif strategy == "lookup":
        cmd += ["--spec-draft-n-max", str(s.setting("draft_max"))]
    return cmd  # llama-lookahead: W = 15, N = 5, G = 15 are compiled in


def _layers(n: int) -> str:
    return "all" if n < 0 else str(n)


# --- parsing what the programs print --------------------------------------------------------
@dataclass
class Side:
    """One side of a row: what a llama.cpp program printed, or llamaspec's statistics."""

    decode_tps: Optional[float] = None
    prompt_tps: Optional[float] = None
    n_decoded: Optional[int] = None
    n_drafted: Optional[int] = None
    n_accept: Optional[int] = None
    accept: Optional[float] = None  # percent
    text: str = ""


_NUMBER = r"(-?nan|inf|[\d.]+)"


def _float(text: str) -> Optional[float]:
    value = float(text)
    return None if value != value or value == float("inf") else value


def parse_summary(log: str) -> Side:
    """The statistics in a program's stderr. Speculative programs print "encoded N tokens in
    T seconds, speed: S t/s", "decoded ...", "n_drafted = ", "n_accept = ", "accept = P%";
    llama-completion prints only llama_perf's "prompt eval time = ..." and "eval time = ..."."""
    side = Side()
    encoded = re.search(rf"encoded\s+(\d+) tokens in\s+{_NUMBER} seconds, speed:\s+{_NUMBER} t/s", log)
    decoded = re.search(rf"decoded\s+(\d+) tokens in\s+{_NUMBER} seconds, speed:\s+{_NUMBER} t/s", log)
    if encoded:
        side.prompt_tps = _float(encoded.group(3))
    else:
        prompt = re.search(rf"prompt eval time =\s+{_NUMBER} ms /\s+(\d+) tokens \(.*?, +{_NUMBER} tokens per second\)",
                           log)
        side.prompt_tps = _float(prompt.group(3)) if prompt else None
    if decoded:
        side.n_decoded, side.decode_tps = int(decoded.group(1)), _float(decoded.group(3))
    else:
        ev = re.search(rf"(?<!prompt )eval time =\s+{_NUMBER} ms /\s+(\d+) runs +\(.*?, +{_NUMBER} tokens per second\)",
                       log)
        if ev:
            side.n_decoded, side.decode_tps = int(ev.group(2)), _float(ev.group(3))
    for name in ("n_drafted", "n_accept"):
        m = re.search(rf"\b{name}\s*=\s*(\d+)", log)
        if m:
            setattr(side, name, int(m.group(1)))
    m = re.search(rf"\baccept\s*=\s*{_NUMBER}%", log)
    if m:
        side.accept = _float(m.group(1))
    return side


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def generated_text(stdout: str, prompt: str, strategy: str) -> str:
    """The text a program generated, cut out of its stdout.

    llama-completion with --no-display-prompt prints the text, " [end of text]\\n" at an end
    of generation, then "\\n\\n". The speculative programs print "\\n\\n", the prompt, the
    text (with the end-of-generation token's text), then "\\n\\n\\n\\n"; llama-lookahead
    colours the tokens it accepted from n-grams.
    """
    out = _ANSI.sub("", stdout)
    if strategy == "plain":
        out = _cut_suffix(out, "\n\n")
        return _cut_suffix(out, " [end of text]\n")
    start = out.find(prompt)
    if start < 0:  # the echo differs from the text (tokenizers that normalize): find its end
        tail = prompt[-64:]
        start = out.find(tail)
        if start < 0:
            return ""
        start += len(tail) - len(prompt)
    return _cut_suffix(out[start + len(prompt):], "\n\n\n\n")


def _cut_suffix(text: str, suffix: str) -> str:
    return text[:-len(suffix)] if text.endswith(suffix) else text


def agreement(ours: str, theirs: str) -> str:
    """"same" when one text is a prefix of the other (and both have text), else where they part."""
    if not ours or not theirs:
        return "no text to compare"
    n = min(len(ours), len(theirs))
    i = next((i for i in range(n) if ours[i] != theirs[i]), n)
    return "same" if i == n else f"differs at char {i}"


# --- running --------------------------------------------------------------------------------
@dataclass
class CompareRow:
    strategy: str
    program: str
    status: str  # "ok" | "missing: ..." | "failed: ..." | "timed out ..."
    command: List[str]  # the program and its arguments (empty when missing)
    llama_cpp: Optional[Side]
    llamaspec: Side
    ratio: Optional[float]  # llamaspec decode t/s over llama.cpp's
    text: str  # "same" | "differs at char I" | "" (not compared)


@dataclass
class CompareReport:
    llamaspec: str
    date: str
    machine: Machine
    settings: BenchSettings
    prompt: str  # where the prompt came from
    n_prompt: int
    rows: List[CompareRow] = field(default_factory=list)

    def table(self) -> str:
        s, m = self.settings, self.machine
        lines = [f"{s.model}, prompt {self.prompt} ({self.n_prompt} tokens), {s.n_predict} tokens, greedy, "
                 f"threads {m.threads} ({m.backend}), draft-max {s.setting('draft_max')}"
                 + (f", draft {s.draft_model} (draft-p-min {s.setting('draft_p_min')})" if s.draft_model else "")]
        cells = [("strategy", "llama.cpp program", "llama.cpp t/s", "llamaspec t/s", "ratio", "accept llama.cpp",
                  "accept llamaspec", "text / status")]
        for r in self.rows:
            theirs = r.llama_cpp or Side()
            cells.append((r.strategy, r.program, _fmt(theirs.decode_tps, "{:.2f}"),
                          _fmt(r.llamaspec.decode_tps, "{:.2f}"), _fmt(r.ratio, "{:.2f}x"), _accept(theirs),
                          _accept(r.llamaspec), r.text if r.status == "ok" else r.status))
        return "\n".join(lines + format_columns(cells, left=(0, 1, 7)))


def _fmt(value: Optional[float], pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _accept(side: Side) -> str:
    if side.accept is not None:
        return f"{side.accept:.1f}%"
    if side.n_accept is not None and side.n_drafted is None:  # llama-lookahead prints no n_drafted
        return f"{side.n_accept} accepted"
    return "-"


def _run_program(cmd: List[str], prompt: str, strategy: str, timeout: float) -> Union[Side, str]:
    """The program's Side, or why there is none."""
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:g} s"
    except OSError as e:
        return f"failed: {e.strerror}"
    stdout = done.stdout.decode("utf-8", errors="replace")
    stderr = done.stderr.decode("utf-8", errors="replace")
    if done.returncode != 0:
        last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
        return f"failed (exit code {done.returncode}): {last.strip()}"
    side = parse_summary(stderr)
    side.text = generated_text(stdout, prompt, strategy)
    if side.decode_tps is None:
        return "failed: no decode speed in its output"
    return side


def _median_run(sides: List[Side]) -> Side:
    median = statistics.median_low([s.decode_tps or 0.0 for s in sides])
    return next(s for s in sides if (s.decode_tps or 0.0) == median)


def _runs(spec: LlamaSpec, cmd: List[str], text: str, strategy: str, settings: BenchSettings, timeout: float,
          bar: tqdm, theirs: List[Side], status: str) -> Tuple[str, List[Side]]:
    """llamaspec's runs, taking turns with the program's (a program that fails is not rerun):
    the status and llamaspec's runs; the program's are added to ``theirs``. With RPC servers the
    program has run already (see run_compare)."""
    ours: List[Side] = []
    spec.generate("Hello", max_tokens=4, temperature=0)  # warm-up
    for _ in range(settings.repeat):
        if not settings.rpc:
            status = _their_run(cmd, text, strategy, timeout, theirs, status)
        spec.reset()
        ours.append(_side(spec.generate(text, max_tokens=settings.n_predict, temperature=0)))
        bar.update()
    return status, ours


def _their_run(cmd: List[str], text: str, strategy: str, timeout: float, theirs: List[Side], status: str) -> str:
    """One run of the program, added to ``theirs`` while ``status`` is ok; the status after it."""
    if status != "ok":
        return status
    run = _run_program(cmd, text, strategy, timeout)
    if isinstance(run, str):
        return run
    theirs.append(run)
    return status


def _row(strategy: str, cmd: List[str], status: str, theirs: List[Side], ours: List[Side]) -> CompareRow:
    mine = _median_run(ours)
    other = _median_run(theirs) if status == "ok" else None
    ratio = mine.decode_tps / other.decode_tps if other and other.decode_tps and mine.decode_tps else None
    return CompareRow(strategy, PROGRAMS[strategy], status, cmd, other, mine, ratio,
                      agreement(mine.text, other.text) if other else "")


def run_compare(settings: BenchSettings, prompt: Union[str, SuitePrompt], strategies: Optional[Sequence[str]] = None,
                bin_dir: Optional[Path] = None, timeout: float = 600.0, cache_dir: Optional[Path] = None,
                progress: bool = True) -> CompareReport:
    """Run each strategy's llama.cpp program and llamaspec on the same raw prompt (a suite
    prompt is rendered with the model's chat template first), ``settings.repeat`` times."""
    names = list(strategies) if strategies is not None else default_strategies(settings)
    for name in names:
        if name not in PROGRAMS:
            raise ConfigError(f"cannot compare strategy {name!r}: llama.cpp has programs for {', '.join(PROGRAMS)}")
    check_strategies(names, settings)
    model = models.resolve_model(settings.model, cache_dir, progress)
    draft = models.resolve_model(settings.draft_model, cache_dir, progress) if settings.draft_model else None
    label, text = (prompt.name, render(model, [prompt])[0]) if isinstance(prompt, SuitePrompt) else ("given", prompt)
    if not text.strip():
        raise ConfigError("the prompt is empty")
    rows: List[CompareRow] = []
    machine: Optional[Machine] = None
    n_prompt = 0
    with tempfile.TemporaryDirectory() as tmp, \
            tqdm(total=len(names) * settings.repeat, desc="compare", unit="run", file=sys.stderr,
                 disable=not progress) as bar:
        prompt_file = Path(tmp) / "prompt.txt"
        prompt_file.write_text(text + "\n", encoding="utf-8")  # llama.cpp drops one trailing newline of -f
        for name in names:
            bar.set_postfix_str(name)
            program = find_program(PROGRAMS[name], bin_dir)
            threads = settings.target_config().threads
            cmd = command(name, program, model, draft, prompt_file, settings, threads) if program else []
            status, theirs = "ok" if cmd else f"missing: {BUILD_HINT}", []
            if settings.rpc:  # an rpc-server serves one client at a time: the program's runs go first
                for _ in range(settings.repeat):
                    status = _their_run(cmd, text, name, timeout, theirs, status)
            with build_spec(name, settings, cache_dir, progress) as spec:
                machine, n_prompt = machine_info(spec), len(spec.tokenize(text))
                status, ours = _runs(spec, cmd, text, name, settings, timeout, bar, theirs, status)
            rows.append(_row(name, cmd, status, theirs, ours))
    assert machine is not None
    return CompareReport(version(), datetime.now(timezone.utc).isoformat(timespec="seconds"),
                         machine, settings, label, n_prompt, rows)


def _side(result: Result) -> Side:
    s = result.stats
    return Side(s.decode_tps, s.prompt_tps, s.n_predict, s.n_drafted, s.n_accept,
                s.accept if s.n_drafted else None, result.text)
