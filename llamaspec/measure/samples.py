"""``llamaspec bench --samples N``: N samples of a prompt decoded together against N separate runs.

One LlamaSpec (every source the model allows) does both, interleaved, repetition after
repetition: N runs one after the other (sample i with seed + i; the prompt is evaluated by the
first and reused by the others), then the N samples together (``LlamaSpec.samples``: one batch,
sample i with seed + i, drafting from each other). Each side's figure is its aggregate decode
speed: all generated tokens over the decoding time (the separate runs' decode times summed; the
samples' wall time from their first token to the last one's end).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from tqdm import tqdm

from ..llama import models
from ..errors import ConfigError
from ..engine.scheduler import aggregate
from ..engine.stats import SourceStats, Stats, sum_sources
from .settings import BenchSettings, build_spec
from .suite import SuitePrompt, load_suite, render

DEFAULT_PROMPTS = ("json_record", "code_edit")


@dataclass
class SamplesRow:
    prompt: str
    n: int
    separate_tps: List[float]
    together_tps: List[float]
    sources: Dict[str, SourceStats] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return statistics.median(self.together_tps) / statistics.median(self.separate_tps)


def run_samples(settings: BenchSettings, n: int, prompts: Optional[Sequence[SuitePrompt]] = None,
                cache_dir: Optional[Path] = None, progress: bool = True) -> List[SamplesRow]:
    if n < 2:
        raise ConfigError(f"--samples compares several samples decoded together with separate runs; got {n}")
    if settings.temperature <= 0:
        raise ConfigError("--samples needs --temp above 0 (samples at temperature 0 are all the same text)")
    prompts = list(prompts) if prompts is not None else load_suite(DEFAULT_PROMPTS)
    texts = render(models.resolve_model(settings.model, cache_dir, progress), prompts)
    spec = build_spec("auto", settings, cache_dir, progress)
    rows = [SamplesRow(p.name, n, [], []) for p in prompts]
    bar = tqdm(total=settings.repeat * len(prompts), desc="bench --samples", unit="round", file=sys.stderr,
               disable=not progress)
    options = dict(max_tokens=settings.n_predict, temperature=settings.temperature)
    try:
        spec.generate("Hello", max_tokens=4, temperature=0)  # warm-up: page the weights in
        inputs = [spec.tokenize(text, add_special=False) for text in texts]
        together_stats: List[List[Stats]] = [[] for _ in rows]
        for r in range(settings.repeat):
            for row, prompt, tokens, kept in zip(rows, prompts, inputs, together_stats):
                seed = (settings.seed or 0) + 1000 * r
                spec.reset()
                alone = [spec.generate(tokens, seed=seed + i, json_schema=prompt.schema, **options) for i in range(n)]
                row.separate_tps.append(sum(x.stats.n_predict for x in alone) / sum(x.stats.t_decode for x in alone))
                spec.reset()
                together = aggregate(spec.samples(tokens, n, seed=seed, json_schema=prompt.schema, **options))
                row.together_tps.append(together.decode_tps)
                kept.append(together)
                bar.update()
        for row, kept in zip(rows, together_stats):
            row.sources = sum_sources(kept)
    finally:
        bar.close()
        spec.close()
    return rows


def table(rows: Sequence[SamplesRow]) -> str:
    lines = ["| prompt | samples | separate t/s (median) | together t/s (median) | speed-up | accepted/verified |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        drafts = ", ".join(f"{name} {s.accepted}/{s.drafted}" for name, s in sorted(row.sources.items()))
        lines.append(f"| {row.prompt} | {row.n} | {statistics.median(row.separate_tps):.1f} | "
                     f"{statistics.median(row.together_tps):.1f} | {row.speedup:.2f}x | {drafts} |")
    return "\n".join(lines)
