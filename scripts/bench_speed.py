"""Plain vs draft-model decoding on the BASELINE task, measured in one run.

    python scripts/bench_speed.py [-m TARGET] [-md DRAFT] [-n 256] [-t 2] [--repeat 3]
           [--draft-max 16 --draft-min 0 --draft-p-min 0.75] [-f PROMPT_FILE]

The prompt (default: llamaspec/data/baseline_type_hints.txt, ChatML already applied) is raw
text, as llama.cpp's programs take it. Greedy. Runs alternate plain / draft so that drift of
a shared machine hits both; the table reports medians and the ratio of medians.

"python share" is the part of the generation loop's wall time spent outside llama_decode:
our Python code (drafting logic, acceptance, numpy on logits, cache bookkeeping).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from llamaspec import DraftConfig, LlamaSpec, ModelConfig

DATA = Path(__file__).resolve().parent.parent / "llamaspec" / "data"


def run_once(spec: LlamaSpec, prompt: str, n: int) -> dict:
    spec.reset()  # every run evaluates the whole prompt
    result = spec.generate(prompt, max_tokens=n, temperature=0)
    s = result.stats
    return {"tokens": result.tokens, "decode_tps": s.decode_tps, "prompt_tps": s.prompt_tps,
            "accept": s.accept, "tokens_per_call": s.tokens_per_call, "python_share": s.python_share}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("-md", "--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("-f", "--file", type=Path, default=DATA / "baseline_type_hints.txt")
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--draft-min", type=int, default=0)
    ap.add_argument("--draft-p-min", type=float, default=0.75)
    a = ap.parse_args()

    prompt = a.file.read_text(encoding="utf-8")
    target = ModelConfig(a.model, n_ctx=a.ctx_size, n_threads=a.threads)
    draft = ModelConfig(a.draft, n_ctx=a.ctx_size, n_threads=a.threads)
    plain = LlamaSpec(target)
    spec = LlamaSpec(target, draft, DraftConfig(a.draft_max, a.draft_min, a.draft_p_min))
    for s in (plain, spec):  # warm-up: page the weights in, build the graphs
        s.generate(prompt, max_tokens=8, temperature=0)

    runs = {"plain": [], "draft": []}
    for _ in range(a.repeat):
        runs["plain"].append(run_once(plain, prompt, a.n))
        runs["draft"].append(run_once(spec, prompt, a.n))

    same = all(r["tokens"] == runs["plain"][0]["tokens"] for rs in runs.values() for r in rs)
    base = statistics.median(r["decode_tps"] for r in runs["plain"])
    print(f"task: {a.file.name}, {a.n} tokens, greedy, {a.threads} threads, {a.repeat} runs each, "
          f"draft-max {a.draft_max}, draft-min {a.draft_min}, draft-p-min {a.draft_p_min}")
    print(f"{'strategy':8} {'decode t/s':>10} {'(min-max)':>13} {'vs plain':>8} {'prompt t/s':>10} "
          f"{'accept':>7} {'tok/call':>8} {'python share':>12}")
    for name, rs in runs.items():
        tps = [r["decode_tps"] for r in rs]
        med = statistics.median(tps)
        print(f"{name:8} {med:10.1f} {min(tps):6.1f}-{max(tps):<6.1f} {med / base:7.2f}x "
              f"{statistics.median(r['prompt_tps'] for r in rs):10.1f} "
              f"{statistics.median(r['accept'] for r in rs):6.1f}% "
              f"{statistics.median(r['tokens_per_call'] for r in rs):8.2f} "
              f"{100 * statistics.median(r['python_share'] for r in rs):11.2f}%")
    print(f"greedy outputs identical across strategies and runs: {same}")


if __name__ == "__main__":
    main()
