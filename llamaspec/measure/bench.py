"""``llamaspec bench``: plain decoding and each strategy on a prompt suite, in one process.

Every strategy runs with the same models and settings. Each one is loaded once and warmed up
once; then, repetition after repetition, every prompt runs through every strategy in turn
(interleaved, so drift of a shared machine hits all of them alike; the order rotates by one
each repetition, so that no strategy always runs longest after plain), each run from an empty
KV cache so that it evaluates the whole prompt. A row reports one strategy on one prompt, its
speed-up over plain (the median over repetitions of its t/s over plain's in the same
repetition: a shared machine's speed drifts by 10% over tens of seconds), and that speed-up as
a share of the prompt's copy-oracle bound (``replay.copy_oracle`` on plain's answer with the
target's measured cost curve).

Peak memory (``peak_rss_mb``) is the peak resident set size of the whole process during the
row's runs (``memory.py``). Every strategy stays loaded, sharing the model files' weights, so it
includes the other strategies' caches too; ``load_rss_mb`` is what one strategy added when it
was loaded and warmed up (the first to load a model pays for its weights).
"""

from __future__ import annotations

import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from tqdm import tqdm

from ..planning import costs
from ..llama import models
from ..llama.pool import ModelPool
from ..api import LlamaSpec, Result
from ..errors import ConfigError
from .replay import copy_oracle
from ..engine.stats import outside_llama, sum_sources
from .memory import memory_method, peak_rss_mb, reset_peak_rss, rss_mb
from .report import BenchReport, PromptInfo, Row, StrategyInfo, first_difference, machine_info, version
from .settings import STRATEGIES, BenchSettings, build_spec, check_strategies, default_strategies
from .suite import SuitePrompt, load_suite, render


def run_bench(settings: BenchSettings, strategies: Optional[Sequence[str]] = None,
              prompts: Optional[Sequence[SuitePrompt]] = None, cache_dir: Optional[Path] = None,
              progress: bool = True) -> BenchReport:
    """Run plain decoding and each strategy (default: every one the models allow) on the
    prompts (default: the whole suite), ``settings.repeat`` times, and report per row."""
    names = list(strategies) if strategies is not None else default_strategies(settings, cache_dir)
    check_strategies(names, settings, cache_dir)
    names = ["plain"] + [n for n in dict.fromkeys(names) if n != "plain"]  # plain first, always
    prompts = list(prompts) if prompts is not None else load_suite()
    if not prompts:
        raise ConfigError("no prompts to run")
    twice = [p.name for i, p in enumerate(prompts) if p.name in (q.name for q in prompts[:i])]
    if twice:
        raise ConfigError(f"two prompts are named {twice[0]!r}")
    texts = render(models.resolve_model(settings.model, cache_dir, progress), prompts)  # no chat template: fail now
    specs: Dict[str, LlamaSpec] = {}
    pool = ModelPool()  # every strategy maps the model files once
    bar = tqdm(total=len(names) * (1 + settings.repeat * len(prompts)), desc="bench", unit="run",
               file=sys.stderr, disable=not progress)
    try:
        infos = []
        for name in names:
            bar.set_postfix_str(f"loading {name}")
            before = rss_mb()
            spec = specs[name] = build_spec(name, settings, cache_dir, progress, pool)
            spec.generate("Hello", max_tokens=4, temperature=0)  # warm-up: page the weights in
            spec.reset()
            infos.append(StrategyInfo(name, STRATEGIES[name].description, rss_mb() - before))
            bar.update()
        plain = specs["plain"]
        machine = machine_info(plain)
        curve = costs.load_or_measure(plain.ctx, models.cache_dir(cache_dir) / "costs.json", progress)
        inputs = [plain.tokenize(text, add_special=False) for text in texts]
        method = memory_method()
        runs: Dict[Tuple[str, str], List[Tuple[Result, float]]] = {}
        for i in range(settings.repeat):
            for prompt, tokens in zip(prompts, inputs):
                for name in rotated(names, i):
                    spec = specs[name]
                    bar.set_postfix_str(f"{prompt.name} {name}")
                    spec.reset()  # every run evaluates the whole prompt
                    reset_peak_rss()
                    seed = None if settings.seed is None else settings.seed + i
                    result = spec.generate(tokens, max_tokens=settings.n_predict, temperature=settings.temperature,
                                           seed=seed, json_schema=prompt.schema)
                    runs.setdefault((prompt.name, name), []).append((result, peak_rss_mb()))
                    bar.update()
    finally:
        bar.close()
        for spec in specs.values():
            spec.close()
    greedy = settings.temperature == 0
    infos_p = [PromptInfo(p.name, p.description, len(t),
                          copy_oracle(t, runs[(p.name, "plain")][0][0].tokens, curve.cost, curve.switch), p.schema is not None)
               for p, t in zip(prompts, inputs)]
    report = BenchReport(version(), datetime.now(timezone.utc).isoformat(timespec="seconds"),
                         machine, settings, method, infos, infos_p, decode_ms=curve.ms_per_token)
    for prompt, info in zip(prompts, infos_p):
        plain_tokens = runs[(prompt.name, "plain")][0][0].tokens
        base = _row(prompt.name, "plain", runs[(prompt.name, "plain")], None, plain_tokens, greedy, info.copy_bound)
        report.rows.append(base)
        report.rows += [_row(prompt.name, name, runs[(prompt.name, name)], base, plain_tokens, greedy, info.copy_bound)
                        for name in names[1:]]
    return report


def rotated(names: Sequence[str], i: int) -> List[str]:
    """The order of repetition ``i``: ``names`` rotated by i, so that over len(names) repetitions
    every strategy runs once in every place."""
    k = i % len(names) if names else 0
    return [*names[k:], *names[:k]]


def _row(prompt: str, strategy: str, runs: List[Tuple[Result, float]], plain: Optional[Row],
         plain_tokens: List[int], greedy: bool, bound: float) -> Row:
    stats = [r.stats for r, _ in runs]
    tps = [s.decode_tps for s in stats]
    median = statistics.median(tps)
    n_predict, n_calls = sum(s.n_predict for s in stats), sum(s.n_target_calls for s in stats)
    n_drafted, n_accept = sum(s.n_drafted for s in stats), sum(s.n_accept for s in stats)
    sources = sum_sources(stats)
    output = "not checked (sampling)"
    if greedy:
        diffs = [first_difference(r.tokens, plain_tokens) for r, _ in runs]
        first = min((d for d in diffs if d is not None), default=None)
        output = "same" if first is None else f"differs from token {first}"
    # paired: each repetition against plain's run of the same prompt in the same repetition, which
    # ran seconds apart, so a machine whose speed drifts between repetitions slows both alike
    speedup = statistics.median(t / b for t, b in zip(tps, plain.decode_tps)) if plain else 1.0
    speculative = max(sum(s.speculative_steps for s in stats), 1)
    return Row(prompt, strategy, tps, median, min(tps), max(tps), speedup, speedup / bound if bound else 0.0,
               100.0 * n_accept / n_drafted if n_drafted else 0.0, n_predict / n_calls if n_calls else 0.0,
               statistics.median(s.prompt_tps for s in stats), n_predict, n_drafted, n_accept, n_calls, sources,
               max(peak for _, peak in runs), output, 1000 * sum(s.t_grammar for s in stats) / max(n_predict, 1),
               depth=sum(sum(s.drafted_by_pos) for s in stats) / speculative, rows=n_drafted / speculative,
               branches=sum(s.n_branches for s in stats) / speculative,
               python_share=outside_llama(sum(s.t_llama for s in stats), sum(s.t_decode for s in stats)),
               asked=sum(s.n_asked for s in stats) / n_calls if n_calls else 0.0)
