"""Choose the acceptance model's priors by replaying the target's real answers, and show what
the planner would reach on them against the copy-oracle bound.

    python scripts/fit_priors.py [-m MODEL] [-n 256] [--answers FILE ...] [--curve measured|reference|flat]

1. The target's greedy answers to the bench suite's prompts (plain decoding, -n tokens) are
   generated once and kept in --answers (JSON: prompt tokens and answer tokens per prompt).
   ``tests/data/more_answers.json`` holds the answers to fourteen more prompts (edits of code,
   conversions, extraction, summaries with quotes, open questions): pass both to pool them.
2. Every candidate token each source offers while replaying them is counted per evidence bucket
   (verified or not: the answer shows whether the target would have accepted it). The rates,
   over all prompts, are the suggested priors (acceptance_model.PRIORS).
3. The answers are replayed with the current priors through lookup, lookahead and both (auto
   without a draft model), and the predicted speed-up over plain is printed beside the copy
   oracle's, with the chosen cost curve (the measured one of this machine, the reference
   machine's, or a GPU-like flat one). "perfect" replays both with acceptance estimates that
   know the answer: the share of the bound that better estimates alone could reach.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's llamaspec

import llamaspec  # noqa: E402
from llamaspec import LookaheadConfig, models  # noqa: E402
from llamaspec.acceptance_model import AcceptanceModel  # noqa: E402
from llamaspec.bench.suite import greedy_answers  # noqa: E402
from llamaspec.costs import REFERENCE_CPU, CostCurve, CostModel, cached_curve  # noqa: E402
from llamaspec.config import default_threads  # noqa: E402
from llamaspec.lookahead import LookaheadSource  # noqa: E402
from llamaspec._llama import Model  # noqa: E402
from llamaspec.lookup import LookupSource  # noqa: E402
from llamaspec.planner import Planner  # noqa: E402
from llamaspec.replay import copy_oracle, replay  # noqa: E402
from llamaspec.speculator import Speculator  # noqa: E402


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


def speculator(names: List[str], curve: CostCurve, model: AcceptanceModel, piece: Callable[[int], bytes]) -> Speculator:
    sources: list = []
    if "lookup" in names:
        sources.append(LookupSource(piece=piece))
    if "lookahead" in names:
        sources.append(LookaheadSource(LookaheadConfig()))
    return Speculator(sources, model, Planner(CostModel(curve)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default=models.default_pair()[0])
    parser.add_argument("-n", type=int, default=256)
    parser.add_argument("--answers", type=Path, action="append",
                        help="recorded answers (JSON); repeat to pool several [default: tests/data/answers.json, "
                             "recorded if missing]")
    parser.add_argument("--curve", choices=["measured", "reference", "flat"], default="reference")
    args = parser.parse_args()
    answers = {}
    for path in args.answers or [Path("tests/data/answers.json")]:
        answers.update(record(args.model, args.n, path))
    piece = Model(models.resolve_model(args.model), vocab_only=True).piece  # lookup compares text
    if args.curve == "measured":
        curve = cached_curve(models.resolve_model(args.model), default_threads(), models.cache_dir() / "costs.json")
        if curve is None:
            raise SystemExit("no measured curve: run `llamaspec profile` first")
    else:
        curve = REFERENCE_CPU if args.curve == "reference" else CostCurve.flat()

    counts = AcceptanceModel(weight=1e-6, decay=1.0)  # (almost) raw counts: no decay, a negligible prior
    for item in answers.values():
        replay(item["prompt"], item["answer"], speculator(["lookup", "lookahead"], curve, counts, piece))
    print("observed acceptance per bucket (seen):")
    for (source, bucket), (acc, seen) in sorted(counts._counts.items()):
        print(f"  {source:10} {bucket:3}  {acc / seen:.2f}  ({seen:.0f})")

    print(f"\npredicted speed-up over plain with the {args.curve} curve, current priors:")
    print(f"  {'prompt':18} {'lookup':>8} {'lookahead':>10} {'both':>8} {'perfect':>8} {'oracle':>8} "
          f"{'both/oracle':>12} {'perfect/oracle':>15}")
    both = ["lookup", "lookahead"]
    for name, item in answers.items():
        row = [replay(item["prompt"], item["answer"], speculator(s, curve, AcceptanceModel(), piece)).speedup
               for s in (["lookup"], ["lookahead"], both)]
        perfect = replay(item["prompt"], item["answer"], speculator(both, curve, AcceptanceModel(), piece), perfect=True).speedup
        bound = copy_oracle(item["prompt"], item["answer"], curve.cost)
        print(f"  {name:18} {row[0]:7.2f}x {row[1]:9.2f}x {row[2]:7.2f}x {perfect:7.2f}x {bound:7.2f}x "
              f"{100 * row[2] / bound:11.0f}% {100 * perfect / bound:14.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
