"""Several clients at once against any OpenAI-compatible servers, measured by one client in one
run on one machine: llama-server and ``llamaspec serve`` side by side.

    python benchmarks/serving.py --clients 1,2,4,8 --runs 3 -n 128 \\
        --server 'plain=llama-server -m M.gguf -t 2 -np {parallel} -c {ctx} --port {port}' \\
        --server 'none=llamaspec serve -m M.gguf -t 2 --parallel {parallel} --spec none --port {port}'

Each ``--server NAME=COMMAND`` is started for every client count N with ``{parallel}`` = N,
``{ctx}`` = N times ``--ctx`` (llama-server splits its context across slots, llamaspec gives
each lane the whole ``--ctx``) and a free ``{port}`` on 127.0.0.1; while one is measured the
others are not running, and their order turns from run to run; one short request warms each
server up before it is measured. ``--url NAME=URL`` measures a
server already running instead (the same at every N).

A round: N clients, client k starting ``--stagger`` seconds after client k - 1 and asking every
suite prompt once in turn, from prompt k on (greedy, streamed, ``-n`` tokens), so prompts of
different lengths arrive at different times and decode beside each other. Per configuration,
medians over runs of:

- aggregate t/s: every completion token over the round's wall time (queueing, prompts and HTTP
  included);
- TTFT: from sending a request to its first streamed token; p50/p95 latency of whole requests;
- per-request decode t/s: tokens after the first over the time after the first;
- prompt tokens read a round (``timings.prompt_n``: the rest of each prompt came from the
  server's cache);
- outside: for llamaspec, the share of its requests' decoding time the target spent outside
  llama_decode (``timings.llama_ms``; llama-server reports none).
"""

from __future__ import annotations

import argparse
import json
import shlex
import socket
import statistics
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from llamaspec.measure import load_suite


@dataclass
class Answer:
    prompt: str
    text: str
    tokens: int
    ttft: float  # seconds to the first streamed token
    latency: float  # seconds to the end of the stream
    llama_ms: Optional[float]  # llamaspec: the target's time in llama_decode while it decoded
    predicted_ms: Optional[float]
    prompt_n: Optional[int]  # prompt tokens the server read (the rest came from its cache)

    @property
    def decode_tps(self) -> float:
        after = self.latency - self.ttft
        return (self.tokens - 1) / after if self.tokens > 1 and after > 0 else 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ask(url: str, messages: List[Dict[str, str]], n_predict: int) -> Tuple[str, int, float, float, Dict]:
    """(text, completion tokens, TTFT, latency, timings) of one streamed greedy chat completion."""
    body = {"messages": messages, "max_tokens": n_predict, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    text, ttft, usage, timings, pieces = "", 0.0, {}, {}, 0
    with urllib.request.urlopen(request, timeout=1800) as response:
        for line in response:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece:
                    ttft = ttft or time.perf_counter() - t0
                    text += piece
                    pieces += 1
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    latency = time.perf_counter() - t0
    tokens = usage.get("completion_tokens") or timings.get("predicted_n") or pieces
    return text, tokens, ttft, latency, timings


def one_round(url: str, suite: Sequence, clients: int, n_predict: int, stagger: float) -> Tuple[float, List[Answer]]:
    """(aggregate t/s, every answer) of one round."""
    answers: List[Answer] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        time.sleep(k * stagger)
        for i in range(len(suite)):
            prompt = suite[(k + i) % len(suite)]
            text, tokens, ttft, latency, timings = ask(url, prompt.messages, n_predict)
            with lock:
                answers.append(Answer(prompt.name, text, tokens, ttft, latency, timings.get("llama_ms"),
                                      timings.get("predicted_ms"), timings.get("prompt_n")))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return sum(a.tokens for a in answers) / wall, answers


class Server:
    """A server command started for one client count, or a URL already serving."""

    def __init__(self, name: str, command: Optional[str] = None, url: Optional[str] = None) -> None:
        self.name, self.command, self.url = name, command, url
        self.proc: Optional[subprocess.Popen] = None

    def start(self, parallel: int, ctx: int) -> str:
        if self.command is None:
            assert self.url is not None
            return self.url
        port = free_port()
        argv = shlex.split(self.command.format(parallel=parallel, ctx=ctx * parallel, port=port))
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.proc.returncode}: {' '.join(argv)}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                    if response.status == 200:
                        return url
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise SystemExit(f"{self.name} did not answer /health in 300 s")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else 0.0


def named(value: str) -> Tuple[str, str]:
    name, _, rest = value.partition("=")
    if not name or not rest:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {value!r}")
    return name, rest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", type=named, action="append", default=[], metavar="NAME=COMMAND")
    parser.add_argument("--url", type=named, action="append", default=[], metavar="NAME=URL")
    parser.add_argument("--clients", default="1,2,4,8", help="client counts, comma-separated")
    parser.add_argument("-n", "--n-predict", type=int, default=128)
    parser.add_argument("-c", "--ctx", type=int, default=4096, help="context per client")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--stagger", type=float, default=0.5, help="seconds between clients' first requests")
    parser.add_argument("--prompts", nargs="*", default=None, help="suite prompt names (default: all)")
    parser.add_argument("--json", default=None, help="write every answer's figures here")
    args = parser.parse_args()
    servers = [Server(n, command=c) for n, c in args.server] + [Server(n, url=u) for n, u in args.url]
    if not servers:
        parser.error("name at least one --server or --url")
    suite = load_suite(args.prompts)
    counts = [int(c) for c in args.clients.split(",")]

    results: Dict[Tuple[int, str], List[Tuple[float, List[Answer]]]] = {}
    for n in counts:
        for run in range(args.runs):
            order = servers[run % len(servers):] + servers[:run % len(servers)]
            for server in order:
                url = server.start(n, args.ctx)
                try:
                    for prompt in suite[:1]:  # a first request's one-time costs are not measured
                        ask(url, prompt.messages, 8)
                    results.setdefault((n, server.name), []).append(
                        one_round(url, suite, n, args.n_predict, args.stagger))
                finally:
                    server.stop()
            print(f"clients {n}, run {run + 1}: " + ", ".join(
                f"{s.name} {results[(n, s.name)][-1][0]:.2f}" for s in servers), flush=True)

    print(f"\n{len(suite)} prompts per client ({', '.join(p.name for p in suite)}), {args.n_predict} tokens, "
          f"greedy, streamed, clients {args.stagger} s apart; medians of {args.runs} runs")
    print("| clients | server | aggregate t/s | runs | TTFT p50 s | latency p50 s | latency p95 s "
          "| decode t/s per request | prompt tokens read a round | outside llama_decode | same text as the first |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for n in counts:
        first: Dict[str, str] = {a.prompt: a.text for a in results[(n, servers[0].name)][0][1]}
        for server in servers:
            rounds = results[(n, server.name)]
            rates = [r for r, _ in rounds]
            answers = [a for _, ans in rounds for a in ans]
            shares = [1 - a.llama_ms / a.predicted_ms for a in answers if a.llama_ms is not None and a.predicted_ms]
            same = sum(first.get(a.prompt) == a.text for a in rounds[0][1])
            read = statistics.median([sum(a.prompt_n or 0 for a in ans) for _, ans in rounds])
            print(f"| {n} | {server.name} | {statistics.median(rates):.2f} | {', '.join(f'{r:.1f}' for r in rates)} "
                  f"| {pct([a.ttft for a in answers], 0.5):.2f} | {pct([a.latency for a in answers], 0.5):.2f} "
                  f"| {pct([a.latency for a in answers], 0.95):.2f} "
                  f"| {statistics.median([a.decode_tps for a in answers]):.2f} | {read:.0f} "
                  f"| {f'{statistics.median(shares):.1%}' if shares else '-'} | {same}/{len(rounds[0][1])} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({f"{n} {name}": [[rate, [a.__dict__ for a in answers]] for rate, answers in rounds]
                       for (n, name), rounds in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
