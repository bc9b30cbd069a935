"""The heads' time a step on this machine, for heads of a target's shape with random weights:
K heads as ``Drafter`` computes them (the block's K steps, each reading the best token before
it), through r inner units, with E_N h computed, and with E_N h taken from the target's logits
as a run takes it (the source's own step).

    python benchmarks/heads_time.py --d 1536 --n 3260 --ranks 512,256
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np

from llamaspec.draft_heads import Heads, one_thread


def best_ms(step: Callable[[], None], steps: int = 200, repeats: int = 5) -> float:
    for _ in range(20):
        step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - t0) / steps * 1000)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d", type=int, default=1536, help="the target's width (the 1.5B's)")
    ap.add_argument("--n", type=int, default=3260, help="tokens of the map")
    ap.add_argument("--k", type=int, default=3, help="heads")
    ap.add_argument("--ranks", default="512,256")
    ap.add_argument("--vocab", type=int, default=151936, help="the target's vocabulary (the 1.5B's)")
    args = ap.parse_args()
    d, n, k = args.d, args.n, args.k
    rng = np.random.default_rng(0)
    out = rng.normal(0, 1, (n, d)).astype(np.float32)
    h = rng.normal(0, 1, d).astype(np.float32)

    def heads(r: int) -> Heads:
        return Heads(rng.normal(0, 0.02, (r, 2 * d)).astype(np.float32), np.zeros(r, np.float32),
                     rng.normal(0, 0.02, (d, r)).astype(np.float32), np.arange(n) * (args.vocab // n), out, k, {})

    logits = rng.normal(0, 1, args.vocab).astype(np.float32)

    def step(drafter, from_logits=False):  # type: ignore[no-untyped-def]
        def run() -> None:  # as the heads' source runs them: on one thread
            with one_thread():
                at = drafter.start(h, logits[drafter.tokens] if from_logits else drafter.base(h))
                token = 5
                for _ in range(k):
                    at = drafter.head(at, token)
                    token = int(drafter.tokens[at.logits.argmax()])
        return run

    print(f"{k} heads, d {d}, N {n}: ms a step, best of 5 x 200 steps")
    for r in (int(x) for x in args.ranks.split(",")):
        drafter = heads(r).drafter()
        print(f"  {f'r = {r}:':50s}{best_ms(step(drafter)):.2f}")
        print(f"  {f'r = {r}, E_N h from the logits:':50s}{best_ms(step(drafter, True)):.2f}")


if __name__ == "__main__":
    main()
