"""llamaspec's own time a step, as a GPU's host spends it, measured on any machine: the real
engine, scheduler, sources and planner run over the target's context with its decode replaced
by a null one, which computes nothing and answers as the recorded target did.

    python scripts/host_time.py --spec none,auto --answers open_chat,long_answer,code_edit
    python scripts/host_time.py --spec none --pad 6000      # behind a 6,000-token prompt

On a GPU the host's time between two decodes counts as much as they do (a decode of the 1.5B
takes 1.36 ms on the H200 curve in tests/data), and it is what this measures: a decode on the
CPU runs through every cache, so the Python that follows it runs two to five times slower than
it would beside a GPU, and a generation's own ``t_decode - t_llama`` on a CPU says little of it.

The null decode: a row at position p whose token is the recorded text's token at p answers with
the text's next token as its argmax (a logits row of the target's vocabulary, one entry set);
any other row with a token that is not it. Its time is the curve's (``--curve``, by default the
H200's), added to ``t_llama`` without waiting, and the planner plans on that curve too, so the
gate and the planner weigh this host's time against the GPU's decodes. The text is the
recorded answer whatever is verified (greedy), which the script checks.

Printed per answer and spec: target decodes, steps that asked the sources, tokens a decode, and
the host's time a step (``t_decode`` over the decodes, best of ``--repeats``; every run a fresh
load, as n-gram caches would otherwise remember the answer) and what that is of a step on the
curve (host / (host + the decodes' mean time)).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np

import llamaspec
from llamaspec.llama import models
from llamaspec.planning.costs import CostCurve, cache_curve

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
THREADS = 2


class NullDecode:
    """The engine's target with a decode that answers from ``text`` in the curve's time."""

    def __init__(self, ctx, text: Sequence[int], curve: CostCurve) -> None:
        self._ctx, self.text, self.curve = ctx, list(text), curve
        self.t_llama = 0.0
        self.decodes: List[float] = []  # each decode's time (seconds)
        self._rows = np.zeros((ctx.n_batch, ctx.model.n_vocab), np.float32)
        self._set: List[Tuple[int, int]] = []

    def __getattr__(self, name: str):  # everything but the decode is the context's own
        return getattr(self._ctx, name)

    def decode_rows(self, rows, hidden: bool = False) -> int:
        for i, token in self._set:
            self._rows[i, token] = 0.0
        self._set = []
        for token, pos, _, logits in rows:
            if logits:
                right = pos + 1 < len(self.text) and self.text[pos] == token
                answer = self.text[pos + 1] if right else (token * 7919 + pos + 1) % self._rows.shape[1]
                self._rows[len(self._set), answer] = 1.0
                self._set.append((len(self._set), answer))
        seconds = self.curve.ms(len(rows)) / 1000
        self.t_llama += seconds
        self.decodes.append(seconds)
        return len(self._set)

    def logits(self, n_rows: int) -> np.ndarray:
        return self._rows[:n_rows]


def run(model: Path, spec: str, cache: Path, prompt: List[int], answer: List[int], curve: CostCurve):
    """One generation of ``answer`` after ``prompt`` over a null decode: (stats, text equal, decodes' mean ms)."""
    lm = llamaspec.load(str(model), spec=spec, n_threads=THREADS, n_ctx=8192, cache_dir=cache, progress=False)
    try:
        null = NullDecode(lm.engine.target, prompt + answer, curve)
        lm.engine.target = null
        result = lm.generate(prompt, max_tokens=len(answer), temperature=0)
        decodes = null.decodes[1:]  # the prompt's decode is before t_decode's clock
        return result.stats, result.tokens == answer[:len(result.tokens)], 1000 * sum(decodes) / max(len(decodes), 1)
    finally:
        lm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="qwen2.5-coder-0.5b-instruct",
                    help="a model of the recorded answers' vocabulary (Qwen2.5's): its tokenizer and context")
    ap.add_argument("--spec", default="none,auto", help="specs to compare, comma-separated")
    ap.add_argument("--answers", default="open_chat,long_answer,code_edit",
                    help="names in tests/data/answers.json, comma-separated")
    ap.add_argument("--curve", type=Path, default=DATA / "gpu_curve.json", help="the decodes' costs")
    ap.add_argument("--pad", type=int, default=0,
                    help="tokens of other recorded text before each prompt (text the answer does not copy)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    curve = CostCurve(**json.loads(args.curve.read_text())["curve"])
    model = models.resolve_model(args.model)
    answers = json.loads((DATA / "answers.json").read_text())
    more = json.loads((DATA / "more_answers.json").read_text())
    filler = [t for a in more.values() for t in a["prompt"] + a["answer"]]
    filler = (filler * (args.pad // max(len(filler), 1) + 1))[:args.pad]
    print(f"{model.name}, curve: {curve.ms_per_token:.2f} ms a token ({args.curve.name}), prompt padded by {args.pad}")
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        cache_curve(curve, model, THREADS, cache / "costs.json")  # the planner plans on the curve
        first = answers[args.answers.split(",")[0]]
        run(model, args.spec.split(",")[0], cache, filler + first["prompt"], first["answer"], curve)  # warm-up
        for name in args.answers.split(","):
            prompt, answer = filler + answers[name]["prompt"], answers[name]["answer"]
            for spec in args.spec.split(","):
                runs = [run(model, spec, cache, prompt, answer, curve) for _ in range(args.repeats)]
                host = min(stats.t_decode / stats.n_target_calls for stats, _, _ in runs) * 1000
                stats, same, decode_ms = runs[-1]
                print(f"{name:12s} {spec:18s} decodes {stats.n_target_calls:3d}  asked {stats.n_asked:3d}  "
                      f"tokens/decode {stats.n_predict / stats.n_target_calls:.2f}  host {host:.3f} ms a step "
                      f"({host / (host + decode_ms):.1%} of a step)  text {'equal' if same else 'DIFFERS'}")


if __name__ == "__main__":
    main()
