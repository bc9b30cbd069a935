"""Plain decoding against auto with the target's layers here, on two rpc-servers on 127.0.0.1,
and on the same servers behind an added round-trip latency, in one run (one process tree):

    python benchmarks/rpc_bench.py [--latency-ms 2] [--prompts code_edit,open_chat] [-n 128] [--repeat 2]

Each placement is one `llamaspec bench --strategies plain,auto` (default pair: Qwen2.5-Coder-1.5B,
its 0.5B draft here) and one `llamaspec profile` (the curve the planner prices steps with). The
servers are ggml-rpc-server from scripts/build_llama_cpp.sh. The latency comes from a proxy in
front of each server (a process of this script, on 127.0.0.1) that forwards each chunk of bytes
half the latency later in each direction: the delay of a network, without its bandwidth limit
(tc netem does the same where the kernel has it; this one needs nothing). Prints one table
(Markdown) and writes every report as JSON beside --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from llamaspec.config import endpoint
from llamaspec.llama import remote
from llamaspec.measure.compare import default_bin_dir, find_program


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(endpoint: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while remote.unreachable([endpoint], timeout=1.0):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{proc.args[0]} on {endpoint} did not come up")
        time.sleep(0.1)


# --- the delaying proxy ------------------------------------------------------------------------
async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Each chunk read, written ``delay`` seconds after it arrived, in order."""
    queue: "asyncio.Queue" = asyncio.Queue()

    async def later() -> None:
        while True:
            due, data = await queue.get()
            if data is None:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            await writer.drain()
        writer.close()

    sending = asyncio.ensure_future(later())
    while True:
        data = await reader.read(1 << 20)
        queue.put_nowait((time.monotonic() + delay, data or None))
        if not data:
            break
    await sending


def proxy(listen_port: int, target: str, one_way: float) -> None:
    host, port = endpoint(target)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, port)
        for sock in (writer.get_extra_info("socket"), up_writer.get_extra_info("socket")):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pipe(reader, up_writer, one_way), _pipe(up_reader, writer, one_way))

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# --- the runs ----------------------------------------------------------------------------------
def llamaspec(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "llamaspec", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"llamaspec {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--proxy":
        proxy(int(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latency-ms", type=float, default=2.0, help="Round-trip latency the proxies add.")
    ap.add_argument("--prompts", default="code_edit,summarize_quotes,open_chat")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("-m", "--model", help="Target [default: the default pair's].")
    ap.add_argument("-md", "--model-draft", help="Draft model, kept here [default: the default pair's].")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "rpc_bench.json")
    args = ap.parse_args()
    program = find_program("ggml-rpc-server", default_bin_dir())
    if program is None:
        raise SystemExit("ggml-rpc-server is missing: run `bash scripts/build_llama_cpp.sh`")
    procs: List[subprocess.Popen] = []
    try:
        servers = []
        for _ in range(2):
            port = free_port()
            procs.append(subprocess.Popen([str(program), "-H", "127.0.0.1", "-p", str(port), "-t", str(args.threads)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            servers.append(f"127.0.0.1:{port}")
            wait_for(servers[-1], procs[-1])
        delayed = []
        for server in servers:
            port = free_port()
            procs.append(subprocess.Popen([sys.executable, __file__, "--proxy", str(port), server,
                                           str(args.latency_ms / 2000)]))
            delayed.append(f"127.0.0.1:{port}")
            wait_for(delayed[-1], procs[-1])
        placements: Dict[str, List[str]] = {"local": [], "rpc, loopback": ["--rpc", ",".join(servers)],
                                            f"rpc, +{args.latency_ms:g} ms RTT": ["--rpc", ",".join(delayed)]}
        reports = {}
        for name, placed in placements.items():
            common = ["-t", str(args.threads), *placed, *(["-m", args.model] if args.model else [])]
            profile = llamaspec("profile", *common, "--repeats", "2")
            out = args.out.with_name(f"{args.out.stem}-{len(reports)}.json")
            llamaspec("bench", *common, *(["-md", args.model_draft] if args.model_draft else []), "--strategies", "plain,auto", "--prompts", args.prompts, "-n", str(args.n),
                      "--repeat", str(args.repeat), "--json", str(out))
            reports[name] = {"profile": profile, "bench": json.loads(out.read_text())}
            print(f"{name}: done", file=sys.stderr)
        args.out.write_text(json.dumps(reports, indent=1) + "\n")
        print(table(reports))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def table(reports: Dict[str, dict]) -> str:
    """Each placement's decode costs (from its profile), then per prompt: plain and auto decode
    t/s (medians), auto's speed-up over plain (the median of the runs' ratios), auto's text."""
    lines = ["| placement | 1-token decode | 4 rows cost | 16 rows cost |", "|---|---|---|---|"]
    for name, report in reports.items():
        curve = {int(cells[0]): cells for cells in (line.split() for line in report["profile"].splitlines())
                 if cells and cells[0].isdigit()}
        lines.append(f"| {name} | {float(curve[1][1]):.1f} ms | {float(curve[4][2]):.2f} | {float(curve[16][2]):.2f} |")
    lines += ["", "| placement | prompt | plain t/s | auto t/s | auto / plain | auto's text |", "|---|---|---|---|---|---|"]
    for name, report in reports.items():
        by_prompt: Dict[str, Dict[str, dict]] = {}
        for row in report["bench"]["rows"]:
            by_prompt.setdefault(row["prompt"], {})[row["strategy"]] = row
        for prompt, rows_of in by_prompt.items():
            plain, auto = rows_of["plain"], rows_of["auto"]
            lines.append(f"| {name} | {prompt} | {plain['decode_tps_median']:.1f} | {auto['decode_tps_median']:.1f} | "
                         f"{auto['speedup']:.2f}x | {auto['output']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
