"""Replay answers of the target through draft heads (and lookup and lookahead) on a cost curve:
what the heads would gain where a batch of n rows costs what the curve says, such as the H200's
recorded in tests/data, with no GPU at hand.

    python benchmarks/heads_replay.py -m smollm2-135m-instruct --curve tests/data/gpu_curve.json -n 256

For each prompt of the bench suite named, the target's greedy answer is decoded here with its
hidden states (plain decoding) and its logits (the prompt and the answer read again in one
prefill: where the heads take E_N h from, as in a real run), then replayed
(llamaspec.measure.replay) through each set of sources on the curve twice: first as if the
host's own time cost nothing (the curve without its milliseconds: no gate weighs a source's
time), then charged each step's planning time as it took here, in units of the curve's single
decode (the gates weighing it as they would), since on a GPU that time counts as much as the
decodes.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import List

import numpy as np

from llamaspec.llama import models
from llamaspec.llama.binding import Context, Model
from llamaspec.llama.chat import ChatTemplate
from llamaspec.measure.replay import replay, speculator
from llamaspec.measure.suite import load_suite
from llamaspec.planning.costs import CostCurve
from llamaspec.draft_heads import Heads, cached_path
from llamaspec.training.data import answers

SETS = (("lookup", "lookahead"), ("heads",), ("lookup", "lookahead", "heads"))


def logits_rows(ctx: Context, prompt: List[int], answer: List[int]) -> np.ndarray:
    """The target's logits at the row that chose each token of ``answer`` after ``prompt``
    (len(answer), n_vocab), read in windows of n_batch rows."""
    text, first = prompt + answer, len(prompt) - 1
    ctx.seq_rm(0, -1, -1)
    rows = []
    for start in range(0, len(text) - 1, ctx.n_batch):
        window = range(start, min(start + ctx.n_batch, len(text) - 1))
        n = ctx.decode_rows([(text[i], i, (0,), i >= first) for i in window])
        if n:
            rows.append(np.array(ctx.logits(n)))
    ctx.seq_rm(0, -1, -1)
    return np.concatenate(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=models.default_pair()[0])
    ap.add_argument("--heads", type=Path, default=None, help="heads file [default: the cached one]")
    ap.add_argument("--curve", type=Path, required=True, help="a JSON file with a cost curve under 'curve'")
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--prompts", default="open_chat,long_answer")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    path = models.resolve_model(args.model)
    model = Model(path)
    file = args.heads or cached_path(path, models.cache_dir())
    heads = Heads.read(file)
    heads.check_model(path, model.n_vocab, model.n_embd, file)
    drafter = heads.drafter()
    curve = CostCurve(**json.loads(args.curve.read_text())["curve"])
    untimed = replace(curve, ms_per_token=0.0)  # time is not weighed: every source asked every step
    ctx = model.context(4096, args.threads, 512, 1)
    template = ChatTemplate(model)
    print(f"{path.name}, heads {file.name}, curve {args.curve} ({curve.ms_per_token:.2f} ms a decode)")
    for item in load_suite(args.prompts.split(",")):
        prompt = model.tokenize(template.render(item.messages), add_special=False, parse_special=True)
        states = answers(ctx, model, [prompt], args.n, [0])[0][0]
        tokens, hidden = [int(t) for t in states.labels], states.hidden
        logits = logits_rows(ctx, prompt, tokens)
        for sources in SETS:
            free = replay(prompt, tokens, speculator(untimed, sources, model, loaded={"heads": drafter}), hidden=hidden,
                          logits=logits)
            t0 = time.perf_counter()
            charged = replay(prompt, tokens, speculator(curve, sources, model, loaded={"heads": drafter}),
                             hidden=hidden, logits=logits, timed=True)
            host = (time.perf_counter() - t0) * 1000 / max(1, charged.n_steps) / curve.ms_per_token
            print(f"{item.name:12s} {'+'.join(sources):24s} {free.speedup:.2f}x before the host's time (accepted "
                  f"{free.n_accept}/{free.n_drafted}), {charged.speedup:.2f}x after it ({host:.2f} decodes a "
                  f"step; accepted {charged.n_accept}/{charged.n_drafted})")


if __name__ == "__main__":
    main()
