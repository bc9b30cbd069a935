"""llamaspec's own time a step, as a GPU's host spends it, measured on any machine: the real
engine, scheduler, sources and planner run over the target's context with its decode replaced
by a null one, which computes nothing, answers as the recorded target did and takes a GPU's time.

    python benchmarks/host_time.py --spec none,auto --answers open_chat,long_answer,code_edit
    python benchmarks/host_time.py --spec none --pad 6000 --overlap on    # behind a 6,000-token prompt

On a GPU the host's time between two decodes counts as much as they do (a decode of the 1.5B
takes 1.36 ms on the H200 curve in tests/data), and it is what this measures: a decode on the
CPU runs through every cache, so the Python that follows it runs slower than it would beside a
GPU, and a generation's own ``t_decode - t_llama`` on a CPU says little of it.

The null decode: a row at position p whose token is the recorded text's token at p answers with
the text's next token as its argmax (a logits row of the target's vocabulary, one entry set);
any other row with a token that is not it. It is queued when llama_decode returns and done the
curve's time (``--curve``, by default the H200's) after it began, as on a GPU: reading its
outputs or changing the cache waits for it (a busy wait, as CUDA's by default). The planner
plans on that curve too, so the gate and the planner weigh this host's time against the GPU's
decodes. ``--overlap``: the engine queuing each next decode before a step returns (what it does
on a GPU), off, on or both. The text is the recorded answer whatever is verified (greedy), which
the script checks.

Printed per answer, spec and overlap: target decodes, steps that asked the sources, tokens a
decode, and the host's time a step: the wall time of the decoding over the decodes, less the
decodes' own, and what that is of a step (host / (host + the decodes' mean time)); and the
median step's (from one decode queued to the next, less the decode's time: a plain step's,
where the sources are asked now and then). Each the median of ``--repeats`` runs, every run a
fresh load (n-gram caches would otherwise remember the answer). Machines differ, and one VM
from run to run by a fifth: compare in one run, alternating, several times.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np

import llamaspec
from llamaspec.llama import models
from llamaspec.planning.costs import CostCurve, cache_curve

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
THREADS = 2


class NullDecode:
    """The engine's target with a decode that answers from ``text`` and takes the curve's time as
    a GPU would: queued when llama_decode returns, done that long after it began (after the
    decode before it), waited for by reading its outputs or changing the cache."""

    def __init__(self, ctx, text: Sequence[int], curve: CostCurve) -> None:
        self._ctx, self.text, self.curve = ctx, list(text), curve
        self.t_llama = 0.0
        self.decodes: List[float] = []  # each decode's time (seconds)
        self._rows = np.zeros((ctx.n_batch, ctx.model.n_vocab), np.float32)
        self._set: List[Tuple[int, int]] = []
        self._done = 0.0  # when the last decode queued ends (perf_counter's time)
        self.queued: List[float] = []  # when each decode was queued

    def __getattr__(self, name: str):  # everything else is the context's own
        return getattr(self._ctx, name)

    def decode_rows(self, rows, hidden: bool = False, wait: bool = True) -> int:
        self.synchronize()  # one output buffer: llama.cpp's next decode writes over the last one's rows
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
        self.decodes.append(seconds)
        self.queued.append(time.perf_counter())
        self._done = time.perf_counter() + seconds
        if wait:
            self.synchronize()
        return len(self._set)

    def synchronize(self) -> None:
        t0 = time.perf_counter()
        while time.perf_counter() < self._done:
            pass
        self.t_llama += time.perf_counter() - t0

    def logits(self, n_rows: int) -> np.ndarray:
        self.synchronize()
        return self._rows[:n_rows]

    def seq_rm(self, *args) -> None:
        self.synchronize()
        self._ctx.seq_rm(*args)

    def seq_cp(self, *args) -> None:
        self.synchronize()
        self._ctx.seq_cp(*args)


def run(model: Path, spec: str, cache: Path, prompt: List[int], answer: List[int], curve: CostCurve,
        overlap: bool):
    """One generation of ``answer`` after ``prompt`` over a null decode, the engine overlapping
    its decodes or not: (stats, text equal, the host's ms a step (mean, median step), the
    decodes' mean ms)."""
    lm = llamaspec.load(str(model), spec=spec, n_threads=THREADS, n_ctx=8192, cache_dir=cache, progress=False)
    try:
        null = NullDecode(lm.engine.target, prompt + answer, curve)
        lm.engine.target, lm.engine.overlap = null, overlap
        result = lm.generate(prompt, max_tokens=len(answer), temperature=0)
        stats = result.stats
        decodes = null.decodes[1:]  # the prompt's decode is before t_decode's clock
        host = 1000 * (stats.t_decode - sum(decodes)) / stats.n_target_calls
        # each step's: from one decode queued to the next, less the decode's own time
        gaps = 1000 * (np.diff(null.queued)[1:] - np.array(null.decodes[1:-1]))
        median = float(np.median(gaps)) if len(gaps) else host
        return stats, result.tokens == answer[:len(result.tokens)], (host, median), 1000 * np.mean(decodes)
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
    ap.add_argument("--overlap", default="off,on",
                    help="the engine queuing each next decode before a step returns, as on a GPU: off, on or both")
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
        run(model, args.spec.split(",")[0], cache, filler + first["prompt"], first["answer"], curve, False)  # warm-up
        for name in args.answers.split(","):
            prompt, answer = filler + answers[name]["prompt"], answers[name]["answer"]
            for spec in args.spec.split(","):
                for overlap in args.overlap.split(","):
                    runs = [run(model, spec, cache, prompt, answer, curve, overlap == "on")
                            for _ in range(args.repeats)]
                    stats, _, _, decode_ms = runs[-1]
                    host = float(np.median([r[2][0] for r in runs]))
                    step = float(np.median([r[2][1] for r in runs]))
                    same = all(r[1] for r in runs)
                    print(f"{name:12s} {spec:18s} overlap {overlap:3s}  decodes {stats.n_target_calls:3d}  "
                          f"asked {stats.n_asked:3d}  tokens/decode {stats.n_predict / stats.n_target_calls:.2f}  "
                          f"host {host:.3f} ms a step ({host / (host + decode_ms):.1%} of a step), "
                          f"median step {step:.3f} ms  text {'equal' if same else 'DIFFERS'}")

if __name__ == "__main__":
    main()
