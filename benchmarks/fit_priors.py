"""Choose the acceptance model's priors by replaying the target's real answers, and show what
the planner would reach on them against the copy-oracle bound.

    python benchmarks/fit_priors.py [-m MODEL] [-n 256] [--answers FILE ...]
        [--curve measured|reference|steep|flatter|flat] [--jitter K]

1. The target's greedy answers to the bench suite's prompts (plain decoding, -n tokens) are
   generated once and kept in --answers (JSON: prompt tokens and answer tokens per prompt).
   ``tests/data/more_answers.json`` holds the answers to fourteen more prompts (edits of code,
   conversions, extraction, summaries with quotes, open questions): pass both to pool them.
   ``tests/data/held_out_answers.json`` holds sixteen more that no prior was fitted on: check a
   change on them too.
2. Every candidate token each source offers while replaying them is counted per evidence key
   (verified or not: the answer shows whether the target would have accepted it). The rates,
   over all prompts, are the suggested priors (each source module's PLUGIN).
3. The answers are replayed with the current priors through lookup, lookahead and both (auto
   without a draft model), and the predicted speed-up over plain is printed beside the copy
   oracle's, with the chosen cost curve (the measured one of this machine, one of three 2-core
   CPUs', or a GPU-like flat one). "perfect" replays both with acceptance estimates that know
   the answer: the share of the bound that better estimates alone could reach.
4. One replay is a chaotic thing: a cost a few percent off flips a decision, the acceptance
   model learns from other outcomes, and one answer's speed-up moves by 5-10%. To tell a change
   that helps from chance, ``--jitter 8`` averages every replay over the curve and seven copies
   with each cost moved by 6% at random, and the last row averages over the prompts.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from statistics import geometric_mean as geomean
from typing import Dict, List

import numpy as np

import llamaspec
from llamaspec.llama import models
from llamaspec.planning.acceptance_model import AcceptanceModel
from llamaspec.measure.suite import greedy_answers
from llamaspec.planning.costs import CPU_CURVES, CostCurve, cached_curve
from llamaspec.config import default_threads
from llamaspec.llama.binding import Model
from llamaspec.measure.replay import copy_oracle, replay, speculator

# How far --jitter moves each cost of a copy of the curve (a standard deviation, relative).
JITTER = 0.06


def record(model: str, n: int, path: Path) -> Dict[str, Dict[str, List[int]]]:
    if path.is_file():
        return json.loads(path.read_text())
    spec = llamaspec.load(model, spec="none")
    try:
        answers = greedy_answers(spec, n)
    finally:
        spec.close()
    for name, streams in answers.items():
        print(f"recorded {name}: {len(streams['answer'])} tokens", file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(answers) + "\n")
    return answers


def jittered(curve: CostCurve, k: int, sd: float = JITTER) -> List[CostCurve]:
    """``curve`` and k - 1 copies whose cost of every n > 1 is multiplied by 1 + sd * N(0, 1)
    (seeded: the same copies every run); a copy keeps the rest of the curve (its costs behind a
    longer text, measured, as they are)."""
    rng = np.random.default_rng(1)
    copies = [replace(curve, relative=[1.0] + [c * (1 + sd * float(rng.standard_normal())) for c in curve.relative[1:]])
              for _ in range(k - 1)]
    return [curve, *copies]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default=models.default_pair()[0])
    parser.add_argument("-n", type=int, default=256)
    parser.add_argument("--answers", type=Path, action="append",
                        help="recorded answers (JSON); repeat to pool several [default: tests/data/answers.json, "
                             "recorded if missing]")
    parser.add_argument("--curve", choices=["measured", *CPU_CURVES, "flat"], default="reference")
    parser.add_argument("--jitter", type=int, default=1, metavar="K",
                        help=f"average every replay over the curve and K - 1 copies with each cost moved by "
                             f"{JITTER * 100:.0f}%% at random [default: 1, the curve alone]")
    args = parser.parse_args()
    if args.jitter < 1:
        parser.error("--jitter must be at least 1")
    answers = {}
    for path in args.answers or [Path("tests/data/answers.json")]:
        answers.update(record(args.model, args.n, path))
    vocab = Model(models.resolve_model(args.model), vocab_only=True)
    if args.curve == "measured":
        curve = cached_curve(models.resolve_model(args.model), default_threads(), models.cache_dir() / "costs.json")
        if curve is None:
            raise SystemExit("no measured curve: run `llamaspec profile` first")
    else:
        curve = CPU_CURVES[args.curve] if args.curve in CPU_CURVES else CostCurve.flat()

    counts = AcceptanceModel(weight=1e-6, decay=1.0)  # (almost) raw counts: no decay, a negligible prior
    for item in answers.values():
        replay(item["prompt"], item["answer"], speculator(curve, vocab=vocab, model=counts))
    print("observed acceptance per evidence key (seen):")
    for (source, key), (acc, seen) in sorted(counts._counts.items(), key=lambda item: (item[0][0], repr(item[0][1]))):
        print(f"  {source:10} {key!r:50}  {acc / seen:.2f}  ({seen:.0f})")

    curves = jittered(curve, args.jitter)
    print(f"\npredicted speed-up over plain with the {args.curve} curve"
          + (f" (geometric mean over it and {args.jitter - 1} jittered copies)" if args.jitter > 1 else "")
          + ", current priors:")
    print(f"  {'prompt':18} {'lookup':>8} {'lookahead':>10} {'both':>8} {'perfect':>8} {'oracle':>8} "
          f"{'both/oracle':>12} {'perfect/oracle':>15}")
    both = ["lookup", "lookahead"]
    rows = []
    for name, item in answers.items():
        def speedup(names: List[str], c: CostCurve, perfect: bool = False) -> float:
            spec = speculator(c, names, vocab)
            return replay(item["prompt"], item["answer"], spec, perfect=perfect).speedup

        row = [geomean([speedup(names, c) for c in curves]) for names in (["lookup"], ["lookahead"], both)]
        row.append(geomean([speedup(both, c, perfect=True) for c in curves]))
        row.append(geomean([copy_oracle(item["prompt"], item["answer"], c.cost) for c in curves]))
        rows.append(row)
        print_row(name, row)
    print_row("geometric mean", [geomean(list(column)) for column in zip(*rows)])
    return 0


def print_row(name: str, row: List[float]) -> None:
    lookup, lookahead, both, perfect, bound = row
    print(f"  {name:18} {lookup:7.2f}x {lookahead:9.2f}x {both:7.2f}x {perfect:7.2f}x {bound:7.2f}x "
          f"{100 * both / bound:11.0f}% {100 * perfect / bound:14.0f}%")


if __name__ == "__main__":
    sys.exit(main())
