"""The HTTP server's cost: the bench suite's prompts through ``llamaspec serve`` beside the same
prompts in process, on one machine, in one run.

    python benchmarks/server_cost.py [-m MODEL] [-md DRAFT] [--spec auto] [-n 128] [-t THREADS] [--runs 3]

Both sides load the same model with the same speculation; the server runs as its own process on
127.0.0.1 and a free port and waits idle while the in-process side decodes. Each run asks every
prompt in process, then through the server, then through the server streamed, so that drift
hits all three alike and each side reuses its KV cache in the same pattern. Per request:

- ``t/s``: generated tokens over the decoding time each side reports (the server's ``timings``).
  While streaming, the decoding waits whenever chunks are sent, so what sending costs shows
  as a lower ``streamed t/s``;
- ``overhead``: the client's wall time (streamed: until ``data: [DONE]``) minus the server's own
  prompt and decoding time: HTTP, JSON, the queue, the chat template and tokenizing;
- ``of gen``: the larger overhead over the in-process decoding time of the answer (the bar:
  below 5% for a 128-token answer). Medians over ``--runs``. ``same text``: every answer equals the
in-process one (with speculation, a draft verified in a batch of another shape can flip a
near-tie: the server's sources learned from more requests).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Tuple

import llamaspec
from llamaspec.llama import models
from llamaspec.measure import load_suite
from llamaspec.config import default_threads


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: argparse.Namespace, port: int, *extra: str) -> subprocess.Popen:
    """``llamaspec serve`` with ``args``' model, threads, context, --spec and draft (when given),
    and ``extra`` flags, once it answers /health."""
    command = [sys.executable, "-m", "llamaspec", "serve", "-m", args.model, "-t", str(args.threads), "-c",
               str(args.ctx), "--spec", args.spec, "--port", str(port), *extra]
    if args.draft:
        command += ["-md", args.draft]
    proc = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited with {proc.returncode}: {' '.join(command)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    sys.exit("the server did not come up in 300 s")


def ask(port: int, body: Dict, stream: bool) -> Tuple[str, Dict, float]:
    """(text, timings, client wall seconds) of one chat completion."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", method="POST",
                                     data=json.dumps({**body, "stream": stream}).encode(),
                                     headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        if not stream:
            answer = json.loads(response.read())
            wall = time.perf_counter() - t0
            return answer["choices"][0]["message"]["content"], answer["timings"], wall
        text, timings = "", {}
        for line in response:
            if line.startswith(b"data: [DONE]"):
                break
            if line.startswith(b"data: "):
                chunk = json.loads(line[6:])
                text += chunk["choices"][0]["delta"].get("content") or ""
                timings = chunk.get("timings", timings)
        return text, timings, time.perf_counter() - t0


def main() -> None:
    default_model, _ = models.default_pair()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default=default_model)
    parser.add_argument("-md", "--draft", default=None)
    parser.add_argument("--spec", default="auto")
    parser.add_argument("-n", "--n-predict", type=int, default=128)
    parser.add_argument("-t", "--threads", type=int, default=default_threads())
    parser.add_argument("-c", "--ctx", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompts", nargs="*", default=None, help="suite prompt names (default: all)")
    args = parser.parse_args()

    suite = load_suite(args.prompts)
    spec = llamaspec.load(args.model, args.draft, n_ctx=args.ctx, n_threads=args.threads, spec=args.spec)
    port = free_port()
    server = start(args, port)
    rows: Dict[str, Dict[str, List[float]]] = {p.name: {} for p in suite}
    same = {p.name: True for p in suite}
    texts: Dict[str, str] = {}
    try:
        for _ in range(args.runs):  # each side asks the prompts in one order: the same cache reuse
            for prompt in suite:
                row = rows[prompt.name]
                result = spec.chat(prompt.messages, max_tokens=args.n_predict, temperature=0)
                s = result.stats
                row.setdefault("local_tps", []).append(s.decode_tps)
                row.setdefault("gen_s", []).append(s.t_decode)
                texts[prompt.name] = result.text
            for mode, stream in (("http", False), ("sse", True)):
                for prompt in suite:
                    body = {"messages": prompt.messages, "max_tokens": args.n_predict, "temperature": 0}
                    text, timings, wall = ask(port, body, stream)
                    same[prompt.name] &= text == texts[prompt.name]
                    rows[prompt.name].setdefault(f"{mode}_tps", []).append(timings["predicted_per_second"])
                    rows[prompt.name].setdefault(f"{mode}_overhead", []).append(
                        wall - (timings["prompt_ms"] + timings["predicted_ms"]) / 1000)
    finally:
        server.terminate()
        server.wait(timeout=60)
        spec.close()

    med = {name: {key: statistics.median(values) for key, values in row.items()} for name, row in rows.items()}
    print(f"model {Path(args.model).name}, --spec {args.spec}, {args.n_predict} tokens, {args.threads} threads, "
          f"temperature 0, median of {args.runs}")
    print(f"{'prompt':<18} {'in-process t/s':>14} {'server t/s':>10} {'streamed t/s':>12} {'overhead ms':>11} "
          f"{'streamed ms':>11} {'of gen':>7} {'same text':>9}")
    for name, m in med.items():
        http, sse = m["http_overhead"], m["sse_overhead"]
        print(f"{name:<18} {m['local_tps']:>14.2f} {m['http_tps']:>10.2f} {m['sse_tps']:>12.2f} "
              f"{1000 * http:>11.1f} {1000 * sse:>11.1f} {100 * max(http, sse) / m['gen_s']:>6.1f}% "
              f"{'yes' if same[name] else 'NO':>9}")


if __name__ == "__main__":
    main()
