"""Choose lookahead's W, N, G by measurement: plain decoding and each configuration on the same
prompts, greedy, interleaved in one process, speed-up over plain measured in the same run.

    python benchmarks/lookahead_sweep.py --configs 4,4,4 2,5,2 15,5,15,fixed -n 128 --repeat 2

A configuration is W,N,G with an optional ",fixed" (every step decodes the whole window and
all G candidates, as llama.cpp's llama-lookahead does; by default the planner sizes each step).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from typing import Tuple

import llamaspec
from llamaspec import LlamaSpec, LookaheadConfig, ModelConfig, SpecConfig

DATA = Path(llamaspec.__file__).resolve().parent / "data"


def parse(text: str) -> Tuple[LookaheadConfig, SpecConfig]:
    parts = text.split(",")
    w, n, g = (int(x) for x in parts[:3])
    return LookaheadConfig(w, n, g), SpecConfig(frozenset({"lookahead"}),
                                                frozenset({"lookahead"}) if parts[3:] == ["fixed"] else frozenset())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--configs", nargs="+", default=["4,4,4"])
    ap.add_argument("--prompts", default="baseline_type_hints,open_chat")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()

    target = ModelConfig(a.model, n_ctx=4096, n_threads=a.threads)
    specs = {"plain": LlamaSpec(target, spec=SpecConfig(frozenset()))}
    specs.update({c: LlamaSpec(target, lookahead=parse(c)[0], spec=parse(c)[1]) for c in a.configs})
    print(f"{a.model}, {a.n} tokens, greedy, {a.threads} threads, {a.repeat} runs each (median)")
    print(f"{'prompt':20} {'W,N,G':14} {'t/s':>6} {'vs plain':>8} {'tok/call':>8} {'accept':>7}  output")
    for name in a.prompts.split(","):
        prompt = (DATA / f"{name}.txt").read_text(encoding="utf-8")
        runs = {c: [] for c in specs}
        for _ in range(a.repeat):
            for c, spec in specs.items():
                spec.reset()
                runs[c].append(spec.generate(prompt, max_tokens=a.n, temperature=0))
        base = statistics.median(r.stats.decode_tps for r in runs["plain"])
        for c, rs in runs.items():
            tps = statistics.median(r.stats.decode_tps for r in rs)
            s = rs[0].stats
            same = "same" if rs[0].tokens == runs["plain"][0].tokens else "differs"
            print(f"{name:20} {c:14} {tps:6.2f} {tps / base:7.2f}x {s.tokens_per_call:8.2f} {s.accept:6.1f}%  {same}")


if __name__ == "__main__":
    main()
