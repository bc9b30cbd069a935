"""Models from the Hugging Face hub (-hf, -hfd, --hf-file, hf= in Python), against a real HTTP
server on 127.0.0.1 that serves the hub's file endpoints for small local repositories
(SmolLM2's file, its Q8_0 and split requantizations, Qwen2.5-Coder-0.5B's), reached through
HF_ENDPOINT: the tag picks the file, a split model is fetched whole, a download cut off resumes,
a cached model is used offline, and every error is one line."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict

import pytest

from llamaspec.measure.compare import default_bin_dir, find_program

from conftest import QWEN_DRAFT, ROOT, SMOL, THREADS
from checks import console_script

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CUT = 24 << 20  # bytes of SmolLM2's first download before the connection closes (huggingface_hub keeps 10 MB chunks)


class FakeHub:
    """The hub's endpoints huggingface_hub uses to list and download a repository's files:
    ``GET /api/models/REPO/tree/REV`` and ``HEAD``/``GET /REPO/resolve/REV/FILE`` (with Range).
    ``cut``: files whose first GET ends after that many bytes (the connection closed)."""

    def __init__(self, repos: Dict[str, Dict[str, Path]], cut: Dict[str, int] = {}) -> None:  # noqa: B006
        self.repos, self.cut, self.log = repos, dict(cut), []  # type: ignore[var-annotated]
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

            def do_GET(self) -> None:
                hub.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        self.log.append((h.command, h.path, h.headers.get("Range")))
        parts = h.path.split("?")[0].strip("/").split("/")
        if parts[:2] == ["api", "models"] and "tree" in parts:
            repo = "/".join(parts[2:parts.index("tree")])
            if repo not in self.repos:
                return self.error(h, 404, "RepoNotFound", "Repository not found")
            listing = [{"type": "file", "path": name, "size": path.stat().st_size, "oid": _oid(name)}
                       for name, path in self.repos[repo].items()]
            return self.send(h, 200, json.dumps(listing).encode(), {"Content-Type": "application/json"}, body)
        if "resolve" in parts:
            at = parts.index("resolve")
            repo, name = "/".join(parts[:at]), "/".join(parts[at + 2:])
            if repo not in self.repos:
                return self.error(h, 404, "RepoNotFound", "Repository not found")
            if name not in self.repos[repo]:
                return self.error(h, 404, "EntryNotFound", "Entry not found")
            data = self.repos[repo][name].read_bytes()
            headers = {"ETag": f'"{_oid(name)}"', "X-Repo-Commit": COMMIT, "Accept-Ranges": "bytes"}
            start = int(h.headers["Range"].split("=")[1].split("-")[0]) if h.headers.get("Range") else 0
            if not body:
                return self.send(h, 200, data, headers, False)
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            cut = self.cut.pop(name, None) if not start else None
            return self.send(h, 206 if start else 200, data[start:], headers, True, cut)
        return self.error(h, 404, "EntryNotFound", "not an endpoint of this hub")

    @staticmethod
    def error(h: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
        FakeHub.send(h, status, json.dumps({"error": message}).encode(),
                     {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}, True)

    @staticmethod
    def send(h: BaseHTTPRequestHandler, status: int, data: bytes, headers: Dict[str, str], body: bool,
             cut: "int | None" = None) -> None:
        h.send_response(status)
        for key, value in headers.items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data if cut is None else data[:cut])
            h.wfile.flush()
        if cut is not None:
            h.close_connection = True
            h.connection.shutdown(2)


def _oid(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()


@pytest.fixture(scope="module")
def split_smol(smol_quant, tmp_path_factory):
    """SmolLM2 (Q8_0) split in parts by llama.cpp's llama-gguf-split (built once if missing)."""
    program = find_program("llama-gguf-split", default_bin_dir())
    if program is None:
        done = subprocess.run(["bash", str(ROOT / "scripts" / "build_llama_cpp.sh")],
                              env={**os.environ, "TARGETS": "llama-gguf-split", "PYTHON": sys.executable},
                              capture_output=True, text=True, timeout=3600)
        assert done.returncode == 0, done.stderr[-3000:]
        program = find_program("llama-gguf-split", default_bin_dir())
    out = tmp_path_factory.mktemp("split") / "SmolLM2-135M-Instruct-Q8_0"
    done = subprocess.run([str(program), "--split", "--split-max-tensors", "120", str(smol_quant("Q8_0")), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    parts = sorted(out.parent.glob(out.name + "-*-of-*.gguf"))
    assert len(parts) > 1, parts
    return parts


@pytest.fixture(scope="module")
def hub(model_file, smol_quant, split_smol):
    repos = {
        "test/SmolLM2-GGUF": {"SmolLM2-135M-Instruct.Q4_1.gguf": model_file(SMOL),
                              "SmolLM2-135M-Instruct.Q8_0.gguf": smol_quant("Q8_0"),
                              "README.md": ROOT / "README.md"},
        "test/SmolLM2-split-GGUF": {p.name: p for p in split_smol},
        "test/Qwen-draft-GGUF": {"qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": model_file(QWEN_DRAFT)},
    }
    server = FakeHub(repos, cut={"SmolLM2-135M-Instruct.Q4_1.gguf": CUT})
    yield server
    server.close()


def llamaspec(hub, cache: Path, *args: str, offline: bool = False, endpoint: "str | None" = None):
    env = {**os.environ, "HF_ENDPOINT": endpoint or hub.url, "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_XET": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "LLAMASPEC_HUB_TIMEOUT": "30"}
    for name in ("HF_TOKEN", "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT", "LLAMASPEC_HUB_DEADLINE"):
        env.pop(name, None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([console_script(), *args], capture_output=True, text=True, env=env, timeout=600)


def one_line(done, fragment: str) -> None:
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and fragment in lines[-1], done.stderr
    assert all(not line.startswith("error: ") for line in lines[:-1])


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_a_tag_picks_the_file_a_cut_download_resumes_and_the_text_is_the_local_file_s(hub, tmp_path, model_file,
                                                                                       smol):
    cache = tmp_path / "hub"
    done = llamaspec(hub, cache, "models", "path", "-hf", "test/SmolLM2-GGUF:q4_1")
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and str(cache) in str(path)
    assert sha256(path) == sha256(model_file(SMOL))  # whole, though the first download was cut off
    ranges = [r for method, url, r in hub.log if method == "GET" and url.endswith("Q4_1.gguf") and r]
    assert len(ranges) == 1 and 0 < int(ranges[0][len("bytes="):-1]) <= CUT, hub.log  # resumed, not begun again
    ours = llamaspec(hub, cache, "generate", "-hf", "test/SmolLM2-GGUF:Q4_1", "-t", str(THREADS), "-n", "8",
                     "--temp", "0", "--spec", "none", "-p", "The capital of France is")
    local = subprocess.run([console_script(), "generate", "-m", smol, "-t", str(THREADS), "-n", "8", "--temp", "0",
                            "--spec", "none", "-p", "The capital of France is"], capture_output=True, text=True)
    assert ours.returncode == 0 and ours.stdout == local.stdout, ours.stderr
    named = llamaspec(hub, cache, "models", "path", "-hf", "test/SmolLM2-GGUF", "--hf-file",
                      "SmolLM2-135M-Instruct.Q8_0.gguf")
    assert named.returncode == 0 and Path(named.stdout.strip()).name == "SmolLM2-135M-Instruct.Q8_0.gguf"
    listed = llamaspec(hub, cache, "models", "list")
    assert "hf://test/SmolLM2-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf" in listed.stdout, listed.stdout


def test_a_split_model_is_fetched_whole_and_loaded_from_its_first_part(hub, tmp_path, split_smol):
    cache = tmp_path / "hub"
    done = llamaspec(hub, cache, "generate", "-hf", "test/SmolLM2-split-GGUF", "-t", str(THREADS), "-n", "4",
                     "--temp", "0", "--spec", "none", "-p", "Hello")
    assert done.returncode == 0, done.stderr
    fetched = sorted(p.name for p in cache.rglob("*.gguf"))
    assert fetched == [p.name for p in split_smol]


def test_a_cached_model_is_used_offline_and_with_no_hub_at_all(hub, tmp_path):
    cache = tmp_path / "hub"
    assert llamaspec(hub, cache, "models", "path", "-hf", "test/SmolLM2-GGUF:Q8_0").returncode == 0
    offline = llamaspec(hub, cache, "models", "path", "-hf", "test/SmolLM2-GGUF:Q8_0", offline=True)
    t0 = time.monotonic()
    gone = llamaspec(hub, cache, "models", "path", "-hf", "test/SmolLM2-GGUF:Q8_0", endpoint="http://127.0.0.1:9")
    assert time.monotonic() - t0 < 12  # no waiting out the listing's retries (about 25 s)
    assert offline.returncode == 0 and gone.returncode == 0, (offline.stderr, gone.stderr)
    assert offline.stdout == gone.stdout and offline.stdout.strip().endswith("Q8_0.gguf")
    one_line(llamaspec(hub, cache, "models", "path", "-hf", "test/Qwen-draft-GGUF", offline=True),
             "HF_HUB_OFFLINE is set, and the local cache holds nothing of test/Qwen-draft-GGUF")
    one_line(llamaspec(hub, cache, "models", "path", "-hf", "test/Qwen-draft-GGUF", endpoint="http://127.0.0.1:9"),
             "the hub at http://127.0.0.1:9 cannot be reached (ConnectError), and the local cache holds nothing")


def test_every_error_is_one_line(hub, tmp_path):
    cache = tmp_path / "hub"
    cases = [(["-hf", "test/no-such-repo"], "no repository test/no-such-repo on the hub"),
             (["-hf", "test/SmolLM2-GGUF"], "test/SmolLM2-GGUF has 2 models: give a tag, one of Q4_1, Q8_0"),
             (["-hf", "test/SmolLM2-GGUF:Q5_K_M"], "no GGUF file for Q5_K_M; its tags: Q4_1, Q8_0"),
             (["-hf", "test/SmolLM2-GGUF", "--hf-file", "nope.gguf"], "test/SmolLM2-GGUF has no file nope.gguf"),
             (["-hf", "not a repo"], "a hub model is OWNER/REPO[:QUANT]"),
             (["-hf", "test/SmolLM2-GGUF:Q4_1", "-hfd", "test/Qwen-draft-GGUF"],
              "draft qwen2.5-coder-0.5b-instruct-q4_k_m.gguf cannot draft for SmolLM2-135M-Instruct.Q4_1.gguf")]
    for args, fragment in cases:
        one_line(llamaspec(hub, cache, "generate", *args, "-t", str(THREADS), "-n", "2", "-p", "Hi"), fragment)


def test_from_python(hub, tmp_path):
    script = ("import llamaspec\n"
              "spec = llamaspec.load(hf='test/SmolLM2-GGUF:Q4_1', spec='none', n_threads=2, progress=False)\n"
              "print(spec.model_name, spec.generate('Hello', max_tokens=4, temperature=0).text != '')\n")
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_DISABLE_XET": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "test/SmolLM2-GGUF:Q4_1 True", done.stderr
