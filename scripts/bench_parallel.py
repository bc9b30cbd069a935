"""Concurrent clients against ``llamaspec serve --parallel 1`` and ``--parallel N``, on one
machine, in one run.

    python scripts/bench_parallel.py [-m MODEL] [--parallel 4] [--clients 4] [-n 128] [-t THREADS] [--runs 3]

Both servers run as processes on 127.0.0.1 with the same model and speculation; while one is
measured the other waits idle, and the order alternates from run to run. In a round every client
asks every suite prompt once (greedy, ``-n`` tokens), client k starting at prompt k, so that
different prompts run at the same time. Aggregate t/s: all completion tokens over the round's
wall time (the clients' view: queueing, prompts and HTTP included). ``same text``: answers equal
to the ``--parallel 1`` server's (a sequence decoded beside others can flip a near-tie).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's llamaspec

from llamaspec.llama import models  # noqa: E402
from llamaspec.measure import load_suite  # noqa: E402
from llamaspec.config import default_threads  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import free_port, start  # noqa: E402


def start_parallel(args: argparse.Namespace, parallel: int) -> Tuple[subprocess.Popen, int]:
    port = free_port()
    return start(args, port, "--parallel", str(parallel), "--queue", str(args.clients)), port


def ask(port: int, body: Dict) -> Tuple[str, int]:
    """(text, completion tokens) of one chat completion."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", method="POST",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=1800) as response:
        answer = json.loads(response.read())
    return answer["choices"][0]["message"]["content"], answer["usage"]["completion_tokens"]


def round_trip(port: int, suite: list, clients: int, n_predict: int) -> Tuple[float, Dict[str, str]]:
    """(aggregate t/s, text per prompt) of one round: every client asks every prompt once."""
    def client(k: int) -> List[Tuple[str, str, int]]:
        out = []
        for i in range(len(suite)):
            prompt = suite[(k + i) % len(suite)]
            body = {"messages": prompt.messages, "max_tokens": n_predict, "temperature": 0}
            out.append((prompt.name, *ask(port, body)))
        return out
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        answers = [a for answers in pool.map(client, range(clients)) for a in answers]
    wall = time.perf_counter() - t0
    return sum(n for _, _, n in answers) / wall, {name: text for name, text, _ in answers}


def main() -> None:
    default_model, _ = models.default_pair()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default=default_model)
    parser.add_argument("--spec", default="auto")
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("-n", "--n-predict", type=int, default=128)
    parser.add_argument("-t", "--threads", type=int, default=default_threads())
    parser.add_argument("-c", "--ctx", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompts", nargs="*", default=None, help="suite prompt names (default: all)")
    parser.set_defaults(draft=None)  # --parallel serves without a draft model
    args = parser.parse_args()

    suite = load_suite(args.prompts)
    servers = {p: start_parallel(args, p) for p in (1, args.parallel)}
    tps: Dict[int, List[float]] = {p: [] for p in servers}
    texts: Dict[int, Dict[str, str]] = {}
    try:
        for run in range(args.runs):
            for p in sorted(servers, reverse=run % 2 == 1):
                rate, texts[p] = round_trip(servers[p][1], suite, args.clients, args.n_predict)
                tps[p].append(rate)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)

    one, many = statistics.median(tps[1]), statistics.median(tps[args.parallel])
    same = sum(texts[1][name] == texts[args.parallel][name] for name in texts[1])
    print(f"model {Path(args.model).name}, --spec {args.spec}, {args.clients} clients x {len(suite)} prompts, "
          f"{args.n_predict} tokens, {args.threads} threads, temperature 0, median of {args.runs}")
    print("| server | aggregate t/s | runs |")
    print("|---|---:|---|")
    for p in servers:
        print(f"| --parallel {p} | {statistics.median(tps[p]):.2f} | {', '.join(f'{r:.2f}' for r in tps[p])} |")
    print(f"speed-up: {many / one:.2f}x; same text as --parallel 1: {same}/{len(texts[1])} prompts")


if __name__ == "__main__":
    main()
