"""What verifying n tokens costs on this machine: measured once, cached, used to size drafts.

A verify batch needs logits for every row. On a GPU its cost barely grows with n; on a small
CPU it grows a lot and not even monotonically (on the 2-core reference machine 16 tokens cost
less than 12: REFERENCE_CPU).
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from tqdm import tqdm

from ._llama import Context, Model, backend_name
from .errors import ConfigError
from .json_table import read_table, write_table

SIZES = (1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32)
N_MAX = 32


@dataclass
class CostCurve:
    """``relative[n - 1]`` is the wall time of one decode of n tokens over that of one token."""

    relative: List[float]
    ms_per_token: float
    threads: int
    backend: str

    def cost(self, n: int) -> float:
        if n <= len(self.relative):
            return self.relative[max(n, 1) - 1]
        per_token = self.relative[-1] / len(self.relative)  # beyond the curve: proportional
        return per_token * n

    def ms(self, n: int) -> float:
        """Milliseconds of one decode of n tokens."""
        return self.cost(n) * self.ms_per_token

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
# one (an AMD EPYC VM: one drafted token must be accepted 78% of the time to pay) and a flatter
# one (a Xeon VM, llama.cpp built without AMX: 16 rows cost 3.8 single-token decodes).
REFERENCE_CPU = _cpu_curve([1.00, 1.51, 2.05, 2.47, 3.65, 5.71, 7.02, 6.74, 10.26, 11.53], 30.0)
STEEP_CPU = _cpu_curve([1.0, 1.775, 2.456, 3.046, 4.421, 6.787, 8.493, 8.275, 12.389, 14.071], 33.0)
FLATTER_CPU = _cpu_curve([1.0, 1.492, 1.813, 1.733, 2.62, 3.178, 3.876, 3.803, 5.828, 6.32], 61.0)
CPU_CURVES = {"reference": REFERENCE_CPU, "steep": STEEP_CPU, "flatter": FLATTER_CPU}


class CostModel:
    """What a step costs, in units of one single-token target decode: verifying n rows (the
    target's curve) and, with a draft model, drafting. Both start from measured curves and are
    refined online from the wall time of every decode, so a curve measured on a busy machine,
    or a machine that slows down, does not mislead the planner for ever.

    Refinement: each decode of n rows gives a ratio r = measured / curve.ms(n). A size's own
    ratios and all sizes' ratios are averaged with weights that decay by DECAY per decode; a
    size's estimate is curve.ms(n) times the blend (own weight w_n, global weight PULL), so a
    size seldom seen follows the machine's overall drift. Verify costs are recomputed from the
    refined estimates every REFRESH decodes: one decode moves them little, and recomputing them
    after every decode cost as much as the rest of planning (a 135M model decodes in 8 ms).
    """

    DECAY = 0.97
    PULL = 0.25
    REFRESH = 8

    def __init__(self, target: CostCurve, draft: Optional[CostCurve] = None) -> None:
        self.curves = {"target": target, "draft": draft}
        self._size: Dict[Tuple[str, int], Tuple[float, float]] = {}  # (kind, n) -> (sum of ratios, weight)
        self._all: Dict[str, Tuple[float, float]] = {}
        self._verify: Dict[int, float] = {}  # verify(n), recomputed every REFRESH observations
        self._observed = 0

    @property
    def has_draft(self) -> bool:
        return self.curves["draft"] is not None

    def ms(self, kind: str, n: int) -> float:
        """Estimated milliseconds of one decode of n rows of the target or the draft."""
        curve = self.curves[kind]
        if curve is None:
            raise ValueError(f"no {kind} curve")
        s_all, w_all = self._all.get(kind, (0.0, 0.0))
        drift = s_all / w_all if w_all else 1.0
        s, w = self._size.get((kind, n), (0.0, 0.0))
        ratio = (s + self.PULL * drift) / (w + self.PULL)
        return curve.ms(n) * ratio if curve.ms_per_token > 0 else curve.cost(n) * ratio

    def verify(self, n: int) -> float:
        """Cost of one target decode of n rows, relative to one row."""
        cost = self._verify.get(n)
        if cost is None:
            cost = self._verify[n] = self.ms("target", n) / self.ms("target", 1)
        return cost

    def draft_token(self) -> float:
        """Cost of one single-token draft decode, relative to one of the target."""
        return self.ms("draft", 1) / self.ms("target", 1)

    def draft(self, n_tokens: int, lag: int) -> float:
        """Cost of drafting ``n_tokens`` after catching the draft's cache up on ``lag`` accepted
        tokens: one decode of lag + 1 rows (the catch-up and the pending token), then one per
        further token."""
        if n_tokens <= 0:
            return 0.0
        return (self.ms("draft", lag + 1) + (n_tokens - 1) * self.ms("draft", 1)) / self.ms("target", 1)

    def units(self, seconds: float) -> float:
        """``seconds`` in units of one single-token target decode."""
        return 1000 * seconds / self.ms("target", 1)

    def observe(self, kind: str, n: int, seconds: float) -> None:
        """A decode of n rows took ``seconds``."""
        curve = self.curves[kind]
        if curve is None or curve.ms_per_token <= 0 or seconds <= 0:
            return
        r = 1000 * seconds / curve.ms(n)
        if kind == "target":
            self._observed += 1
            if self._observed % self.REFRESH == 0:
                self._verify.clear()
        d = self.DECAY
        for key, table in (((kind, n), self._size), (kind, self._all)):
            s, w = table.get(key, (0.0, 0.0))  # type: ignore[call-overload]
            table[key] = (s * d + r, w * d + 1)  # type: ignore[index]
        for key in [k for k in self._size if k[0] == kind and k[1] != n]:
            s, w = self._size[key]
            self._size[key] = (s * d, w * d)


PREFIX = 256  # tokens in the cache while measuring: attention over a typical prompt costs too


def measure(ctx: Context, sizes: Sequence[int] = SIZES, repeats: int = 2, progress: str = "") -> CostCurve:
    """Time decodes of n tokens (logits for every row) after PREFIX tokens past what the
    context holds, then roll all of it back; interpolate between the sizes measured.
    ``progress``: the description of a progress bar on stderr (none when empty)."""
    filler = [max(ctx.model.bos, 0)] * min(PREFIX, max(ctx.n_ctx - len(ctx.tokens) - max(sizes) - 1, 1))
    base = len(ctx.tokens)
    best: Dict[int, float] = {}
    bar = tqdm(total=repeats * len(sizes), desc=progress, unit="decode", file=sys.stderr, disable=not progress,
               leave=False)
    try:
        ctx.eval(filler)
        for _ in range(repeats):
            for n in sizes:
                t0 = time.perf_counter()
                ctx.eval(filler[:1] * n, logits="all")
                dt = time.perf_counter() - t0
                ctx.truncate(base + len(filler))
                best[n] = min(dt, best.get(n, dt))
                bar.update()
    finally:
        bar.close()
        ctx.truncate(base)
    xs = sorted(best)
    curve = np.interp(np.arange(1, N_MAX + 1), xs, [best[n] / best[1] for n in xs])
    return CostCurve([round(float(c), 3) for c in curve], 1000 * best[1], ctx.threads, backend_name(ctx.model))


def _key(path: Path, threads: int, backend: str) -> str:
    return f"{path.name}:{path.stat().st_size}:t{threads}:{backend}:p{PREFIX}"


def cached_curve(model_path: Path, threads: int, cache_file: Path, backend: str = "cpu") -> Optional[CostCurve]:
    """The curve measured earlier for this model file, thread count and backend, if any."""
    entry = read_table(cache_file).get(_key(model_path, threads, backend))
    return CostCurve(**entry) if entry else None


def load_or_measure(ctx: Context, cache_file: Optional[Path], progress: bool = False) -> CostCurve:
    """The cached curve of this model, thread count and backend, or a fresh measurement (saved).
    With ``progress``, a measurement shows a progress bar saying what it does."""
    key = _key(ctx.model.path, ctx.threads, backend_name(ctx.model))
    table = read_table(cache_file)
    if key in table:
        return CostCurve(**table[key])
    curve = measure(ctx, progress=f"measuring decode costs of {ctx.model.path.stem} (once)" if progress else "")
    if cache_file is not None:
        save(curve, ctx, cache_file)
    return curve


def save(curve: CostCurve, ctx: Context, cache_file: Path) -> None:
    """Cache ``curve`` for the model, thread count and backend of ``ctx`` (replacing any)."""
    table = read_table(cache_file)
    table[_key(ctx.model.path, ctx.threads, backend_name(ctx.model))] = asdict(curve)
    write_table(cache_file, table)  # a read-only cache only costs a new measurement next time


def profile(model_path: Path, threads: int, n_ctx: int = 4096, n_gpu_layers: int = 0, repeats: int = 2,
            cache_file: Optional[Path] = None) -> CostCurve:
    """Measure a decode of every n in 1..N_MAX on this machine (best of ``repeats``) and cache
    the curve where generation looks for it."""
    if repeats < 1:
        raise ConfigError(f"repeats must be >= 1, got {repeats}")
    model = Model(model_path, n_gpu_layers)
    ctx = Context(model, n_ctx, threads)
    try:
        curve = measure(ctx, range(1, N_MAX + 1), repeats)
        if cache_file is not None:
            save(curve, ctx, cache_file)
    finally:
        ctx.close()
        model.close()
    return curve
