"""Decode speed of each strategy against plain decoding, measured in one run.

    python scripts/bench_speed.py [-m TARGET] [-md DRAFT] [--strategies plain,lookup,draft]
           [--prompts baseline_type_hints,open_chat] [-n 256] [-t 2] [--repeat 3]

Prompts are files in llamaspec/data/ (ChatML already applied), used as raw text like
llama.cpp's programs take them. Greedy. Within each repetition the strategies run one after
the other, so drift of a shared machine hits all of them; the table reports medians and the
ratio of medians to plain. Every strategy's greedy output is checked against plain's.

"python share" is the part of the generation loop's wall time spent outside llama_decode:
our own code (drafting, acceptance, numpy on logits, cache bookkeeping).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from llamaspec import DraftConfig, LlamaSpec, LookupConfig, ModelConfig

DATA = Path(__file__).resolve().parent.parent / "llamaspec" / "data"


def build(strategy: str, target: ModelConfig, draft: ModelConfig, draft_cfg: DraftConfig) -> LlamaSpec:
    lookup = LookupConfig() if "lookup" in strategy else None
    return LlamaSpec(target, draft if "draft" in strategy else None, draft_cfg, lookup=lookup)


def run_once(spec: LlamaSpec, prompt: str, n: int) -> dict:
    spec.reset()  # every run evaluates the whole prompt
    result = spec.generate(prompt, max_tokens=n, temperature=0)
    s = result.stats
    return {"tokens": result.tokens, "decode_tps": s.decode_tps, "accept": s.accept,
            "tokens_per_call": s.tokens_per_call, "python_share": s.python_share}


def first_difference(plain: list, runs: list) -> str:
    """"same", or where the first run that differs leaves plain's greedy output. A difference
    can be legitimate: batches of different sizes may flip near-ties of the top two logits
    (the tests check that every difference is such a near-tie)."""
    for r in runs:
        if r["tokens"] != plain:
            i = next((i for i, (a, b) in enumerate(zip(r["tokens"], plain)) if a != b), len(plain))
            return f"differs from token {i}"
    return "same"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("-md", "--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--strategies", default="plain,lookup,draft")
    ap.add_argument("--prompts", default="baseline_type_hints,open_chat")
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--draft-min", type=int, default=0)
    ap.add_argument("--draft-p-min", type=float, default=0.75)
    a = ap.parse_args()

    strategies = a.strategies.split(",")
    if strategies[0] != "plain":
        strategies.insert(0, "plain")
    target = ModelConfig(a.model, n_ctx=a.ctx_size, n_threads=a.threads)
    draft = ModelConfig(a.draft, n_ctx=a.ctx_size, n_threads=a.threads)
    specs = {s: build(s, target, draft, DraftConfig(a.draft_max, a.draft_min, a.draft_p_min)) for s in strategies}
    print(f"{a.model}, {a.n} tokens, greedy, {a.threads} threads, {a.repeat} runs each; "
          f"draft {a.draft} (draft-max {a.draft_max}, draft-p-min {a.draft_p_min})")
    print(f"{'prompt':20} {'strategy':13} {'decode t/s':>10} {'min-max':>11} {'vs plain':>8} "
          f"{'accept':>7} {'tok/call':>8} {'python':>7}  output vs plain")
    for name in a.prompts.split(","):
        prompt = (DATA / f"{name}.txt").read_text(encoding="utf-8")
        for spec in specs.values():  # warm-up: page the weights in
            spec.generate(prompt, max_tokens=4, temperature=0)
        runs = {s: [] for s in strategies}
        for _ in range(a.repeat):
            for s, spec in specs.items():
                runs[s].append(run_once(spec, prompt, a.n))
        base = statistics.median(r["decode_tps"] for r in runs["plain"])
        for s, rs in runs.items():
            tps = [r["decode_tps"] for r in rs]
            med = statistics.median(tps)
            same = first_difference(runs["plain"][0]["tokens"], rs)
            print(f"{name:20} {s:13} {med:10.2f} {min(tps):5.1f}-{max(tps):<5.1f} {med / base:7.2f}x "
                  f"{statistics.median(r['accept'] for r in rs):6.1f}% "
                  f"{statistics.median(r['tokens_per_call'] for r in rs):8.2f} "
                  f"{100 * statistics.median(r['python_share'] for r in rs):6.2f}%  {same}")


if __name__ == "__main__":
    main()
