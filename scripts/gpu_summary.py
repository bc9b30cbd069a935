"""One table from what scripts/gpu_check.sh measured: the cost curves (GPU and CPU), what the
planner chose on each prompt and what it gained, and `auto` against the best single source.

    python scripts/gpu_summary.py OUT      (OUT holds bench.json and costs.json)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List

from llamaspec.cli.manage import curve_summary
from llamaspec.measure.report import format_columns
from llamaspec.planning.costs import CostCurve

SIZES = (1, 2, 4, 8, 16, 32)
SINGLE = ("lookup", "draft")  # the single sources the bench runs beside auto


def curves(costs: Dict[str, dict]) -> List[str]:
    """Every curve measured, one line each: one row's milliseconds, the relative cost of n rows."""
    lines = []
    for key, entry in sorted(costs.items()):
        c = CostCurve(**entry)
        lines.append(f"  {key.split(':')[0]} on {c.backend}, {c.threads} threads: {c.ms_per_token:.2f} ms per "
                     f"token; n rows cost {curve_summary(c, SIZES)}")
    return lines


def main(out: Path) -> int:
    report = json.loads((out / "bench.json").read_text())
    costs = json.loads((out / "costs.json").read_text()) if (out / "costs.json").is_file() else {}
    s, m = report["settings"], report["machine"]
    lines = [f"{Path(s['model']).name} (draft {Path(s['draft_model'] or '-').name}), {s['n_predict']} tokens, greedy, "
             f"{s['repeat']} runs each, on {m['backend']}, {m['cpus']} cores; cost curves:"]
    lines += curves(costs)
    bounds = {p["name"]: p["copy_bound"] for p in report["prompts"]}
    header = ("prompt", "strategy", "t/s", "vs plain", "of bound", "accept", "tok/call", "depth", "rows", "branches",
              "draft tokens", "asked", "python", "output")
    cells = [header]
    best: Dict[str, Dict[str, float]] = {}
    for r in report["rows"]:
        best.setdefault(r["prompt"], {})[r["strategy"]] = r["speedup"]
        draft = r["sources"].get("draft", {}).get("drafted", 0)
        cells.append((r["prompt"], r["strategy"], f"{r['decode_tps_median']:.0f}", f"{r['speedup']:.2f}x",
                      f"{100 * r['bound_share']:.0f}%", f"{r['accept']:.0f}%" if r["n_drafted"] else "-",
                      f"{r['tokens_per_call']:.2f}", f"{r['depth']:.1f}", f"{r['rows']:.1f}", f"{r['branches']:.1f}",
                      str(draft), f"{100 * r.get('asked', 0):.0f}%", f"{100 * r['python_share']:.0f}%", r["output"]))
    lines += format_columns(cells, left=(0, 1, len(header) - 1))
    lines.append("depth, rows, branches: per target call that verified candidates; asked: share of target calls "
                 "that asked the sources; python: share of the loop's time outside llama_decode")
    verdicts = []
    for prompt, speeds in best.items():
        singles = {k: v for k, v in speeds.items() if k in SINGLE}
        if "auto" in speeds and singles:
            name = max(singles, key=singles.get)
            verdicts.append(f"{prompt} {speeds['auto'] / singles[name]:.2f} (best single: {name} {singles[name]:.2f}x, "
                            f"copy bound {bounds.get(prompt, 0):.2f}x)")
    lines.append("auto over the best single source: " + "; ".join(verdicts))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
