"""What verifying n tokens costs on this machine: measured once, cached, used to size drafts.

A verify batch needs logits for every row. On a GPU its cost barely grows with n; on a small
CPU it grows a lot and not even monotonically (BASELINE.md: 16 tokens cost less than 12).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np

from ._llama import Context, Model, backend_name
from .errors import ConfigError

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


PREFIX = 256  # tokens in the cache while measuring: attention over a typical prompt costs too


def measure(ctx: Context, sizes: Sequence[int] = SIZES, repeats: int = 2) -> CostCurve:
    """Time decodes of n tokens (logits for every row) after PREFIX tokens past what the
    context holds, then roll all of it back; interpolate between the sizes measured."""
    filler = [max(ctx.model.bos, 0)] * min(PREFIX, max(ctx.n_ctx - len(ctx.tokens) - max(sizes) - 1, 1))
    base = len(ctx.tokens)
    ctx.eval(filler)
    best = {}
    try:
        for _ in range(repeats):
            for n in sizes:
                t0 = time.perf_counter()
                ctx.eval(filler[:1] * n, logits="all")
                dt = time.perf_counter() - t0
                ctx.truncate(base + len(filler))
                best[n] = min(dt, best.get(n, dt))
    finally:
        ctx.truncate(base)
    xs = sorted(best)
    curve = np.interp(np.arange(1, N_MAX + 1), xs, [best[n] / best[1] for n in xs])
    return CostCurve([round(float(c), 3) for c in curve], 1000 * best[1], ctx.threads, backend_name(ctx.model))


def _key(path: Path, threads: int, backend: str) -> str:
    return f"{path.name}:{path.stat().st_size}:t{threads}:{backend}:p{PREFIX}"


def _read_table(cache_file: Optional[Path]) -> dict:
    if cache_file is None or not cache_file.is_file():
        return {}
    try:
        return json.loads(cache_file.read_text())
    except (OSError, ValueError):
        return {}


def cached_curve(model_path: Path, threads: int, cache_file: Path, backend: str = "cpu") -> Optional[CostCurve]:
    """The curve measured earlier for this model file, thread count and backend, if any."""
    entry = _read_table(cache_file).get(_key(model_path, threads, backend))
    return CostCurve(**entry) if entry else None


def load_or_measure(ctx: Context, cache_file: Optional[Path]) -> CostCurve:
    """The cached curve of this model, thread count and backend, or a fresh measurement (saved)."""
    key = _key(ctx.model.path, ctx.threads, backend_name(ctx.model))
    table = _read_table(cache_file)
    if key in table:
        return CostCurve(**table[key])
    curve = measure(ctx)
    if cache_file is not None:
        save(curve, ctx, cache_file)
    return curve


def save(curve: CostCurve, ctx: Context, cache_file: Path) -> None:
    """Cache ``curve`` for the model, thread count and backend of ``ctx`` (replacing any)."""
    table = _read_table(cache_file)
    table[_key(ctx.model.path, ctx.threads, backend_name(ctx.model))] = asdict(curve)
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_file.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(table, f, indent=1)
        os.replace(tmp, cache_file)
    except OSError:
        pass  # a read-only cache only costs a new measurement next time


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
