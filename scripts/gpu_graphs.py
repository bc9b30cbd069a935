"""How a decode's cost depends on the decodes before it (on a GPU: CUDA graphs).

llama.cpp's CUDA backend replays a captured CUDA graph when a decode has the shape of the two
before it; a decode of another shape runs its kernels one by one, and the next decode of the
first shape runs uncaptured again until it has been seen twice. Speculation alternates shapes
(a verify of n rows, then single tokens), so what one decode of n rows costs alone (the cost
curve) is not what it costs in a run. This prints, for the model where it is placed:

  steady n    decodes of n rows, each after decodes of n rows (median ms)
  after n, k  the k-th single-token decode after a decode of n rows (median ms), and that n one

Run: python scripts/gpu_graphs.py MODEL [-ngl N] [--json FILE]; with GGML_CUDA_DISABLE_GRAPHS=1 in
the environment for the same without graphs.
"""
import argparse
import json
import statistics
import time

import llamaspec
from llamaspec.llama.binding import Model
from llamaspec.planning.costs import FILLER, PREFIX, backend_name

SIZES = (1, 2, 4, 8, 16, 32)
AFTER = (2, 8, 16)
SINGLES = 4  # single-token decodes timed after each n-row one
ROUNDS = 10


def timed(ctx, tokens, end):
    t0 = time.perf_counter()
    ctx.eval(tokens, logits="all")
    dt = time.perf_counter() - t0
    ctx.truncate(end)
    return 1000 * dt


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("-ngl", type=int, default=-1)
    parser.add_argument("-t", type=int, default=4)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    model = Model(llamaspec.fetch(args.model, progress=False), n_gpu_layers=args.ngl)
    ctx = model.context(2048, args.t)
    words = model.tokenize(FILLER, add_special=False, parse_special=False)
    filler = (words * (PREFIX // len(words) + 2))[:PREFIX]
    ctx.eval(filler)
    end = len(ctx.tokens)
    steady = {}
    for n in SIZES:
        times = [timed(ctx, filler[:n], end) for _ in range(ROUNDS + 3)]
        steady[n] = statistics.median(times[3:])
    after = {}
    for n in AFTER:
        rows = [[] for _ in range(SINGLES + 1)]
        for _ in range(ROUNDS):
            rows[0].append(timed(ctx, filler[:n], end))
            for k in range(1, SINGLES + 1):
                rows[k].append(timed(ctx, filler[:1], end))
        after[n] = [statistics.median(r) for r in rows]
    out = {"backend": backend_name(model), "steady_ms": steady, "after_ms": after}
    print(f"{args.model} on {out['backend']}")
    print("steady: " + "  ".join(f"{n}: {ms:.2f} ms ({ms / steady[1]:.2f}x)" for n, ms in steady.items()))
    for n, ms in after.items():
        print(f"after {n} rows ({ms[0]:.2f} ms): " + "  ".join(f"single {k}: {v:.2f} ms" for k, v in
                                                              enumerate(ms[1:], 1)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    ctx.close()
    model.close()


if __name__ == "__main__":
    main()
