"""Which lookup match policy and n-gram range to use, decided by replaying real output.

    python scripts/replay_policies.py [-m MODEL] [--prompts baseline_type_hints,open_chat]
           [--curve measured|baseline] [-t 2]

Generates the model's greedy output for each prompt in llamaspec/data/ (plain decoding, until
the end of generation, at most 600 tokens), then replays it through the lookup drafter for
every policy and n-gram range, charging each step the cost of its verify batch: the measured
curve of this machine (cached by any --lookup run) or the one in the project's BASELINE.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from llamaspec import LlamaSpec, ModelConfig, cache_dir
from llamaspec.costs import CostCurve, cached_curve, load_or_measure
from llamaspec.draft_length import DraftLength
from llamaspec.drafters import LookupDrafter
from llamaspec.lookup import MATCH_POLICIES, PromptLookup, replay

DATA = Path(__file__).resolve().parent.parent / "llamaspec" / "data"
# BASELINE.md: cost of one llama_decode of n tokens with logits for all rows, relative to n = 1
BASELINE = CostCurve(list(np.interp(np.arange(1, 33), [1, 2, 4, 8, 12, 16, 20, 24, 32],
                                    [1.00, 1.59, 2.63, 4.54, 5.51, 5.20, 6.98, 7.71, 8.91])), 26.0, 2, "cpu")
RANGES = [(1, 4), (2, 4), (3, 4), (1, 3), (2, 3)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--prompts", default="baseline_type_hints,open_chat")
    ap.add_argument("--curve", choices=["measured", "baseline"], default="baseline")
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()

    spec = LlamaSpec(ModelConfig(a.model, n_threads=a.threads))
    if a.curve == "baseline":
        curve = BASELINE
    else:
        curve = (cached_curve(spec.model.path, a.threads, cache_dir() / "costs.json")
                 or load_or_measure(spec.ctx, cache_dir() / "costs.json"))
    print(f"cost curve: {a.curve}; predicted decode speed over plain decoding")
    print(f"{'prompt':20} {'n-grams':8} " + " ".join(f"{p:>9}" for p in MATCH_POLICIES))
    for name in a.prompts.split(","):
        prompt = (DATA / f"{name}.txt").read_text(encoding="utf-8")
        tokens = spec.tokenize(prompt)
        output = spec.generate(prompt, max_tokens=600, temperature=0).tokens
        for lo, hi in RANGES:
            cells = []
            for policy in MATCH_POLICIES:
                drafter = LookupDrafter(PromptLookup(lo, hi, policy), DraftLength(curve), 31)
                cells.append(replay(drafter, tokens + output, len(tokens), curve.cost).speedup)
            print(f"{name:20} {lo}..{hi}     " + " ".join(f"{c:8.2f}x" for c in cells))


if __name__ == "__main__":
    main()
