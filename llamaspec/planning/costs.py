"""What verifying n tokens costs on this machine: measured once, cached, used to size drafts.

A verify batch needs logits for every row. On a GPU its cost barely grows with n; on a small
CPU it grows a lot and not even monotonically (on the 2-core reference machine 16 tokens cost
less than 12: REFERENCE_CPU), and more behind a longer text (see CostCurve).
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from tqdm import tqdm

from ..llama.binding import Context, Model, backend_name
from ..errors import ConfigError
from ..llama.tables import read_table, write_table

SIZES = (1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32)
N_MAX = 32
PREFIX = 256  # tokens in the cache while measuring: attention over a typical prompt costs too
DEEP = 1024  # and again behind this many, for how costs grow with the text (fewer sizes)
DEEP_SIZES = (1, 2, 4, 8, 16, 32)
# The cache is filled with text and decodes are of text (a cache of one repeated token made
# single-token decodes slower), and a single token, the unit of every cost, is timed ONES
# times as often as the other sizes: with one BOS token repeated and one try per repeat, the
# curve overstated one token's cost against generation's, and so understated every batch's
# relative to it (docs/results.md, "Tuning the planner by replaying recorded answers").
ONES = 4
# On a GPU, decodes of a size are timed after WARM untimed ones of that size (so that they are
# replayed as captured graphs, as in a run that keeps its shape); a change of shape is timed as
# SWITCHES rounds of a decode of SWITCH_ROWS rows then two single tokens. A switch measured
# below SWITCH_MIN single decodes is noise.
WARM = 2
SWITCHES = 5
SWITCH_ROWS = 8
SWITCH_MIN = 0.25
FILLER = ("The river ran high in spring and the clock ran fast; in a dry August it could lose ten minutes a day. "
          "def area(width, height):\n    return width * height\n")


@dataclass
class CostCurve:
    """``relative[n - 1]`` is the wall time of one decode of n tokens over that of one token, with
    ``context`` tokens in the KV cache. ``deep`` is the same with ``deep_context`` tokens: every
    row attends to every cached token, so behind a longer text a batch costs more, relative to a
    single token too (docs/results.md, "Tuning the planner by replaying recorded answers").
    Between the two, the milliseconds of a decode of n rows follow the length of the text
    linearly. Beyond the deeper one each cached token adds at least a + b * n milliseconds (the
    decode reads its keys and values once, each row computes its own attention over them), a
    and b fitted, not negative, over the sizes measured deep (``growth``): a size whose own two
    readings rose less, within a few milliseconds' noise, would otherwise stay nearly flat (or
    fall) many times over at thousands of tokens. (On a GPU one row and several take other
    kernels, and several rows grow with the text where one barely does: there each size's own
    line is the steeper.)

    On a GPU the costs are those of a decode after decodes of its own row count (replayed as a
    captured graph), and ``switch`` is what a decode of another row count costs more, in
    single-token decodes, over it and the next decodes (see planning/shape.py); 0 on a CPU."""

    relative: List[float]
    ms_per_token: float
    threads: int
    backend: str
    context: int = PREFIX
    deep: Optional[List[float]] = None
    deep_ms_per_token: float = 0.0
    deep_context: int = 0
    switch: float = 0.0

    def cost(self, n: int, length: Optional[int] = None) -> float:
        """One decode of n tokens over one of a single token, behind ``length`` cached tokens
        (default: as measured)."""
        if self.deep is None or length is None or self.ms_per_token <= 0:
            return _at(self.relative, n)
        return self.ms(n, length) / self.ms(1, length)

    def ms(self, n: int, length: Optional[int] = None) -> float:
        """Milliseconds of one decode of n tokens (behind ``length`` cached tokens)."""
        shallow = _at(self.relative, n) * self.ms_per_token
        if self.deep is None or length is None:
            return shallow
        deep = _at(self.deep, n) * self.deep_ms_per_token
        slope = self._own_slope(n)
        if length <= self.deep_context:
            return max(shallow + slope * (max(length, 0) - self.context), shallow / 2)
        a, b = self._growth
        return deep + max(slope, a + b * n) * (length - self.deep_context)

    def __post_init__(self) -> None:
        self._growth = self.growth()

    def _own_slope(self, n: int) -> float:
        """Milliseconds a cached token added to a decode of n rows between the two measurements."""
        assert self.deep is not None
        return (_at(self.deep, n) * self.deep_ms_per_token - _at(self.relative, n) * self.ms_per_token) / \
            (self.deep_context - self.context)

    def growth(self) -> Tuple[float, float]:
        """(a, b): a decode of n rows takes a + b * n milliseconds more for each cached token, the
        least-squares line through what the sizes of DEEP_SIZES took more behind ``deep_context``
        tokens than behind ``context``, with neither a nor b below 0."""
        if self.deep is None or self.deep_context <= self.context:
            return 0.0, 0.0
        n = np.array(DEEP_SIZES, dtype=float)
        extra = np.array([self._own_slope(k) for k in DEEP_SIZES])
        b, a = np.polyfit(n, extra, 1)
        if a < 0:
            a, b = 0.0, float(n @ extra / (n @ n))
        if b < 0:
            a, b = float(extra.mean()), 0.0
        return max(float(a), 0.0), max(float(b), 0.0)

    @staticmethod
    def flat(n_max: int = N_MAX) -> "CostCurve":
        """A verify batch costs one token: the GPU ideal, for tests and unmeasured setups."""
        return CostCurve([1.0] * n_max, 0.0, 0, "ideal")


def _cpu_curve(costs: Sequence[float], ms_per_token: float) -> CostCurve:
    """A curve measured at n = 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, interpolated."""
    sizes = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    return CostCurve([round(float(c), 3) for c in np.interp(np.arange(1, 33), sizes, costs)], ms_per_token, 2, "cpu")


# Curves of Qwen2.5-Coder-1.5B Q4_K_M on 2-core machines (`llamaspec profile`, idle), for replays
# and tests that must not depend on the machine they run on: the reference machine's, a steeper
# one (an AMD EPYC VM, where a drafted token must be accepted most of the time to pay) and a
# flatter one (a Xeon VM, llama.cpp built without AMX).
REFERENCE_CPU = _cpu_curve([1.00, 1.51, 2.05, 2.47, 3.65, 5.71, 7.02, 6.74, 10.26, 11.53], 30.0)
STEEP_CPU = _cpu_curve([1.0, 1.775, 2.456, 3.046, 4.421, 6.787, 8.493, 8.275, 12.389, 14.071], 33.0)
FLATTER_CPU = _cpu_curve([1.0, 1.492, 1.813, 1.733, 2.62, 3.178, 3.876, 3.803, 5.828, 6.32], 61.0)
CPU_CURVES = {"reference": REFERENCE_CPU, "steep": STEEP_CPU, "flatter": FLATTER_CPU}


def _at(relative: Sequence[float], n: int) -> float:
    if n <= len(relative):
        return relative[max(n, 1) - 1]
    return relative[-1] / len(relative) * n  # beyond the curve: proportional


class CostModel:
    """What a step costs, in units of one single-token target decode: verifying n rows (the
    target's curve) and proposing with an expensive source (a draft model: its own curve, by
    the source's name). Every curve starts measured and is refined online from the wall time of
    every decode, so a curve measured on a busy machine, or a machine that slows down, does not
    mislead the planner for ever.

    Every cost is that of decodes behind a text of ``length`` tokens, which a verify batch
    attends to (see CostCurve); None: as measured. Lengths count in steps of LENGTH_STEP.

    Refinement: each decode of n rows gives a ratio r = measured / curve.ms(n). A size's own
    ratios and all sizes' ratios are averaged with weights that decay by DECAY per decode; a
    size's estimate is curve.ms(n) times the blend (own weight w_n, global weight PULL), so a
    size seldom seen follows the machine's overall drift. Verify costs are recomputed from the
    refined estimates every REFRESH decodes: one decode moves them little, and recomputing them
    after every decode cost as much as the rest of planning (beside a small model's decode).
    """

    DECAY = 0.97
    PULL = 0.25
    REFRESH = 8
    LENGTH_STEP = 64  # costs are recomputed when the text's length moves into another step of this
    TARGET = "target"

    def __init__(self, target: CostCurve, sources: Optional[Mapping[str, CostCurve]] = None) -> None:
        self.curves: Dict[str, CostCurve] = {self.TARGET: target, **(sources or {})}
        self._size: Dict[Tuple[str, int], Tuple[float, float]] = {}  # (curve, n) -> (sum of ratios, weight)
        self._all: Dict[str, Tuple[float, float]] = {}
        self._verify: Dict[int, float] = {}  # verify(n) at _verify_at, recomputed every REFRESH observations
        self._verify_at: Optional[int] = None
        self._observed = 0
        self.epoch = 0  # counts the times verify's costs were recomputed: they stand between two

    def fresh(self) -> "CostModel":
        """The same measured curves, none of this model's refinement (for a batch of its own,
        which learns its own timings)."""
        return CostModel(self.curves[self.TARGET], {n: c for n, c in self.curves.items() if n != self.TARGET})

    def length_step(self, length: Optional[int]) -> Optional[int]:
        """The length step costs are computed at for a text of ``length`` tokens."""
        return None if length is None else length // self.LENGTH_STEP * self.LENGTH_STEP

    def ms(self, name: str, n: int, length: Optional[int] = None) -> float:
        """Estimated milliseconds of one decode of n rows of the target or of source ``name``."""
        curve = self.curves.get(name)
        if curve is None:
            raise ValueError(f"no {name} curve")
        s_all, w_all = self._all.get(name, (0.0, 0.0))
        drift = s_all / w_all if w_all else 1.0
        s, w = self._size.get((name, n), (0.0, 0.0))
        ratio = (s + self.PULL * drift) / (w + self.PULL)
        step = self.length_step(length)
        return curve.ms(n, step) * ratio if curve.ms_per_token > 0 else curve.cost(n, step) * ratio

    def verify(self, n: int, length: Optional[int] = None) -> float:
        """Cost of one target decode of n rows, relative to one row."""
        step = self.length_step(length)
        if step != self._verify_at:
            self._verify_at = step
            self._verify.clear()
            self.epoch += 1
        cost = self._verify.get(n)
        if cost is None:
            cost = self._verify[n] = self.ms(self.TARGET, n, length) / self.ms(self.TARGET, 1, length)
        return cost

    def token(self, name: str, length: Optional[int] = None) -> float:
        """Cost of one single-token decode of source ``name``, relative to one of the target."""
        return self.ms(name, 1, length) / self.ms(self.TARGET, 1, length)

    def proposing(self, name: str, n_tokens: int, lag: int, length: Optional[int] = None) -> float:
        """Cost of source ``name`` drafting ``n_tokens`` after catching its cache up on ``lag``
        accepted tokens: one decode of lag + 1 rows (the catch-up and the pending token), then
        one per further token."""
        if n_tokens <= 0:
            return 0.0
        return (self.ms(name, lag + 1, length) + (n_tokens - 1) * self.ms(name, 1, length)) / \
            self.ms(self.TARGET, 1, length)

    @property
    def switch(self) -> float:
        """What a target decode of another row count than the last one's costs more (planning/shape.py)."""
        return self.curves[self.TARGET].switch

    @property
    def timed(self) -> bool:
        """Whether the target's curve was measured in milliseconds, so wall times convert to its
        units (an ideal curve, CostCurve.flat, has none)."""
        return self.curves[self.TARGET].ms_per_token > 0

    def units(self, seconds: float, length: Optional[int] = None) -> float:
        """``seconds`` in units of one single-token target decode."""
        return 1000 * seconds / self.ms(self.TARGET, 1, length)

    def observe(self, name: str, n: int, seconds: float, length: Optional[int] = None) -> None:
        """A decode of n rows of the target or of source ``name`` took ``seconds``."""
        curve = self.curves.get(name)
        if curve is None or curve.ms_per_token <= 0 or seconds <= 0:
            return
        r = 1000 * seconds / curve.ms(n, self.length_step(length))
        if name == self.TARGET:
            self._observed += 1
            if self._observed % self.REFRESH == 0:
                self._verify.clear()
                self.epoch += 1
        d = self.DECAY
        for key, table in (((name, n), self._size), (name, self._all)):
            s, w = table.get(key, (0.0, 0.0))  # type: ignore[call-overload]
            table[key] = (s * d + r, w * d + 1)  # type: ignore[index]
        for key in [k for k in self._size if k[0] == name and k[1] != n]:
            s, w = self._size[key]
            self._size[key] = (s * d, w * d)


def measure(ctx: Context, sizes: Sequence[int] = SIZES, repeats: int = 2, progress: str = "",
            deep_sizes: Sequence[int] = DEEP_SIZES) -> CostCurve:
    """Time decodes of n tokens (logits for every row) behind PREFIX tokens past what the context
    holds, then of ``deep_sizes`` behind DEEP tokens (when the context has room), then roll all
    of it back; interpolate between the sizes measured. ``progress``: the description of a
    progress bar on stderr (none when empty)."""
    base = len(ctx.tokens)
    room = ctx.n_ctx - base - N_MAX - 1
    words = ctx.model.tokenize(FILLER, add_special=False, parse_special=False) or [max(ctx.model.bos, 0)]
    filler = _cycle(words, max(min(DEEP, room), 1))
    shallow = min(PREFIX, len(filler))
    deep = len(filler) if len(filler) >= 2 * shallow and deep_sizes else 0
    bar = tqdm(total=repeats * (len(sizes) + (len(deep_sizes) if deep else 0)), desc=progress, unit="decode",
               file=sys.stderr, disable=not progress, leave=False)
    backend = backend_name(ctx.model)
    warm = 0 if backend == "cpu" else WARM
    try:
        near = _time(ctx, filler[:shallow], sizes, repeats, bar, warm)
        switch = 0.0 if backend == "cpu" else _switch(ctx, filler[:SWITCH_ROWS], near[1])
        far = _time(ctx, filler[shallow:deep], deep_sizes, repeats, bar, warm) if deep else None
    finally:
        bar.close()
        ctx.truncate(base)
    if far is None:
        return CostCurve(_relative(near), 1000 * near[1], ctx.threads, backend, base + shallow, switch=switch)
    return CostCurve(_relative(near), 1000 * near[1], ctx.threads, backend, base + shallow, _relative(far),
                     1000 * far[1], base + deep, switch)


def _time(ctx: Context, filler: Sequence[int], sizes: Sequence[int], repeats: int, bar: tqdm,
          warm: int = 0) -> Dict[int, float]:
    """Append ``filler`` to the cache, then the fastest of ``repeats`` decodes of n tokens of it
    behind it (of ONES * ``repeats`` for one token), each after ``warm`` untimed decodes of n,
    for each n in ``sizes`` (seconds); each decode is rolled back."""
    ctx.eval(filler)
    end = len(ctx.tokens)
    best: Dict[int, float] = {}
    for _ in range(repeats):
        for n in sizes:
            for i in range(warm + (ONES if n == 1 else 1)):
                dt = _timed(ctx, _cycle(filler, n), end)
                if i >= warm:
                    best[n] = min(dt, best.get(n, dt))
            bar.update()
    return best


def _timed(ctx: Context, tokens: Sequence[int], end: int) -> float:
    """Seconds of one decode of ``tokens`` (a row of logits each) behind the first ``end``, rolled back."""
    t0 = time.perf_counter()
    ctx.eval(tokens, logits="all")
    dt = time.perf_counter() - t0
    ctx.truncate(end)
    return dt


def _switch(ctx: Context, rows: Sequence[int], single: float) -> float:
    """What a change of shape costs, in single-token decodes of ``single`` seconds: the two
    single-token decodes after one of ``rows`` rows, over two replayed ones (the median of
    SWITCHES rounds; 0 below SWITCH_MIN)."""
    end = len(ctx.tokens)
    extra = []
    for _ in range(SWITCHES):
        _timed(ctx, rows, end)
        extra.append((_timed(ctx, rows[:1], end) + _timed(ctx, rows[:1], end)) / single - 2)
    switch = float(np.median(extra))
    return round(switch, 3) if switch >= SWITCH_MIN else 0.0


def _cycle(tokens: Sequence[int], n: int) -> List[int]:
    """``tokens`` repeated to n tokens."""
    return [tokens[i % len(tokens)] for i in range(n)]


def _relative(best: Dict[int, float]) -> List[float]:
    """Times of the sizes measured over that of one token, interpolated for n = 1..N_MAX."""
    xs = sorted(best)
    return [round(float(c), 3) for c in np.interp(np.arange(1, N_MAX + 1), xs, [best[n] / best[1] for n in xs])]


def _key(path: Path, threads: int, backend: str) -> str:
    # -text: measured on text; -warm: a GPU's decodes timed replayed, with the cost of a switch
    warm = "" if backend == "cpu" else "-warm"
    return f"{path.name}:{path.stat().st_size}:t{threads}:{backend}:p{PREFIX}-{DEEP}-text{warm}"


def cached_curve(model_path: Path, threads: int, cache_file: Optional[Path],
                 backend: str = "cpu") -> Optional[CostCurve]:
    """The curve measured earlier for this model file, thread count and backend, if any."""
    entry = read_table(cache_file).get(_key(model_path, threads, backend))
    return CostCurve(**entry) if entry else None


def load_or_measure(ctx: Context, cache_file: Optional[Path], progress: bool = False,
                    plausible: Callable[[CostCurve], bool] = lambda curve: True) -> CostCurve:
    """The cached curve of this model, thread count and backend, or a fresh measurement, saved.
    A curve ``plausible`` rejects is not trusted: a cached one is measured again, a fresh one is
    used but not saved, so the next load measures again. With ``progress``, a measurement shows
    a progress bar saying what it does."""
    cached = cached_curve(ctx.model.path, ctx.threads, cache_file, backend_name(ctx.model))
    if cached is not None and plausible(cached):
        return cached
    why = "(once)" if cached is None else "again"
    curve = measure(ctx, progress=f"measuring decode costs of {ctx.model.path.stem} {why}" if progress else "")
    if cache_file is not None and plausible(curve):
        save(curve, ctx, cache_file)
    return curve


def load_or_measure_draft(ctx: Context, target: CostCurve, target_model: Model, cache_file: Optional[Path],
                          progress: bool = False) -> CostCurve:
    """The draft model's curve, by load_or_measure, trusted only when plausible_draft: a draft
    whose file is smaller than its target's but whose token took longer than the target's was
    measured on a busy machine (beside a test suite, a 0.5B draft token once cost many times
    its 1.5B target's). The target's costs are refined from every decode, but a draft's only while
    it drafts, and a draft that looks slow is never asked."""
    return load_or_measure(ctx, cache_file, progress, lambda curve: plausible_draft(curve, ctx.model, target,
                                                                                     target_model))


def plausible_draft(draft: CostCurve, draft_model: Model, target: CostCurve, target_model: Model) -> bool:
    """Whether ``draft``'s token is cheaper than ``target``'s, or its model file no smaller; checked
    only with both models on the CPU: on a GPU a small model's decode is bound by kernel launches,
    not by its size, and a draft may well cost what its target does (the planner leaves it idle)."""
    if draft.ms_per_token <= 0 or target.ms_per_token <= 0 or (draft.backend, target.backend) != ("cpu", "cpu"):
        return True
    return draft.ms_per_token < target.ms_per_token or draft_model.path.stat().st_size >= target_model.path.stat().st_size


def save(curve: CostCurve, ctx: Context, cache_file: Path) -> None:
    """Cache ``curve`` for the model, thread count and backend of ``ctx`` (replacing any)."""
    cache_curve(curve, ctx.model.path, ctx.threads, cache_file, backend_name(ctx.model))


def cache_curve(curve: CostCurve, model_path: Path, threads: int, cache_file: Path, backend: str = "cpu") -> None:
    """Cache ``curve`` as the one measured for this model file, thread count and backend (replacing any)."""
    table = read_table(cache_file)
    table[_key(model_path, threads, backend)] = asdict(curve)
    write_table(cache_file, table)  # a read-only cache only costs a new measurement next time


def profile(model: Model, threads: int, n_ctx: int = 4096, repeats: int = 2,
            cache_file: Optional[Path] = None) -> CostCurve:
    """Measure a decode of every n in 1..N_MAX of ``model`` where it is placed (best of
    ``repeats``) and cache the curve where generation looks for it."""
    if repeats < 1:
        raise ConfigError(f"repeats must be >= 1, got {repeats}")
    ctx = model.context(n_ctx, threads)
    try:
        curve = measure(ctx, range(1, N_MAX + 1), repeats, deep_sizes=range(1, N_MAX + 1))
        if cache_file is not None:
            save(curve, ctx, cache_file)
    finally:
        ctx.close()
    return curve
