"""A target placed on llama.cpp RPC servers (real rpc-server processes on 127.0.0.1, built from
the llama.cpp that llama-cpp-python vendors by scripts/build_llama_cpp.sh, once): the same greedy
text as the local run, faults that end a generation with a clear error in bounded time and keep
what it had, a server that stays up and answers 503 until the model is back, wrong addresses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from openai import OpenAI

import llamaspec
from llamaspec import LlamaSpec, ModelConfig, ModelError, RemoteError, SpecConfig
from llamaspec.llama import models, remote
from llamaspec.measure.compare import default_bin_dir, find_program

from conftest import ROOT, SMOL, THREADS, assert_one_line_error, run
from checks import Server, assert_as_alone, free_port


SCRIPT = ROOT / "scripts" / "build_llama_cpp.sh"
PROGRAM = "ggml-rpc-server"
CTX = 512  # too small for the cost curve's deep measurement (behind 1024 tokens): half the decodes over RPC
TIMEOUT = 5.0  # seconds a decode may take on the test's servers before they count as gone


@pytest.fixture(scope="module")
def rpc_program() -> str:
    path = find_program(PROGRAM, default_bin_dir())
    if path is None:
        print(f"building {PROGRAM} from llama-cpp-python's llama.cpp sources (once, ~5 minutes)")
        done = subprocess.run(["bash", str(SCRIPT)], env={**os.environ, "TARGETS": PROGRAM, "PYTHON": sys.executable},
                              capture_output=True, text=True, timeout=3600)
        assert done.returncode == 0, done.stderr[-3000:]
        path = find_program(PROGRAM, default_bin_dir())
    assert path is not None, f"{PROGRAM} is missing after `bash scripts/build_llama_cpp.sh`"
    return str(path)


class RpcServer:
    """One rpc-server on 127.0.0.1 (its CPU, one thread: two of them share this machine's cores)."""

    def __init__(self, program: str, port: int = 0) -> None:
        self.program, self.port = program, port or free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen([self.program, "-H", "127.0.0.1", "-p", str(self.port), "-t", "1"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while remote.unreachable([self.endpoint], timeout=1.0):
            assert self.proc.poll() is None, f"rpc-server on port {self.port} exited with {self.proc.returncode}"
            assert time.monotonic() < deadline, "rpc-server did not come up"
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _servers(program):
    servers = [RpcServer(program) for _ in range(2)]
    yield servers
    for s in servers:
        if s.proc.poll() is None:
            os.kill(s.proc.pid, signal.SIGCONT)  # a stopped one cannot die before it goes on
        s.kill()


@pytest.fixture
def rpc_servers(rpc_program):
    """Two fresh rpc-servers, stopped after the test (which may kill or stop one)."""
    yield from _servers(rpc_program)


@pytest.fixture(scope="module")
def shared_servers(rpc_program):
    """Two rpc-servers for the tests that leave them running: a cost curve measured on them
    (keyed by their addresses) is measured once."""
    yield from _servers(rpc_program)


def endpoints(servers):
    return [s.endpoint for s in servers]


def test_greedy_text_on_two_rpc_servers_is_the_local_run_s(model_file, shared_servers, module_spec, reference):
    """SmolLM2's layers on two rpc-servers (one thread each): the text of plain decoding and of
    auto is the local plain run's (auto's up to a near-tie: a verify batch's rows are not bit for
    bit single rows); the costs are measured and cached for that placement."""
    prompt = "def quicksort(items):\n"
    local = module_spec(SMOL, spec="none").generate(prompt, max_tokens=32, temperature=0)
    for spec in ("none", "auto"):
        with llamaspec.load(str(model_file(SMOL)), spec=spec, rpc=endpoints(shared_servers), n_threads=THREADS,
                            n_ctx=CTX, progress=False) as placed:
            assert placed.model.rpc == tuple(endpoints(shared_servers))
            result = placed.generate(prompt, max_tokens=32, temperature=0)
            if spec == "none":
                assert result.text == local.text
            else:
                assert_as_alone(reference(SMOL), placed.tokenize(prompt), result.tokens, local.tokens, spec)
    table = json.loads((models.cache_dir() / "costs.json").read_text())
    assert any("RPC[127.0.0.1:" in key for key in table), list(table)


def test_a_draft_model_on_the_rpc_servers_drafts_from_there(model_file, shared_servers, smol_quant, reference):
    """--rpc-draft: a draft beside its target on the same servers (one client: an rpc-server
    serves one at a time), its KV-cache sequences in the worker too, verified every step: the
    text of plain decoding on the same servers (the servers' kernels are not this process's: at
    a near-tie the local text may differ), or one that leaves it first at a near-tie (a verify
    batch's rows are not bit for bit single rows). The target is SmolLM2 and the draft the same model
    made Q2_K with llama.cpp's quantizer; the draft is rejected somewhere, so the caches are cut
    there."""
    prompt = "def fibonacci(n):"
    target, draft = model_file(SMOL), smol_quant("Q2_K")
    placed_on = dict(rpc=tuple(endpoints(shared_servers)), n_threads=THREADS, n_ctx=CTX)
    with llamaspec.load(str(target), spec="none", rpc=placed_on["rpc"], n_threads=THREADS, n_ctx=CTX,
                        progress=False) as plain:
        expected = plain.generate(prompt, max_tokens=24, temperature=0).tokens
    with LlamaSpec(ModelConfig(str(target), **placed_on), ModelConfig(str(draft), **placed_on),
                   settings=dict(draft_max=4, draft_p_min=0.0), progress=False,
                   spec=SpecConfig.parse("draft").with_fixed(frozenset({"draft"}))) as placed:
        assert placed.draft_model.rpc == tuple(endpoints(shared_servers))
        assert placed.draft_model.worker is placed.model.worker
        result = placed.generate(prompt, max_tokens=24, temperature=0)
        assert_as_alone(reference(SMOL), placed.tokenize(prompt), result.tokens, expected, "draft")
        assert 0 < result.stats.n_accept < result.stats.n_drafted, result.stats.summary()


def test_a_server_killed_mid_generation_ends_it_with_a_clear_error_keeping_its_text(model_file, rpc_servers,
                                                                                   make_spec):
    with llamaspec.load(str(model_file(SMOL)), spec="none", rpc=endpoints(rpc_servers), n_threads=THREADS,
                        n_ctx=1024, rpc_timeout=TIMEOUT, progress=False) as placed:
        stream = placed.stream("Once upon a time", max_tokens=400, temperature=0)
        streamed = "".join(next(stream).text for _ in range(8))
        rpc_servers[1].kill()
        t0 = time.monotonic()
        with pytest.raises(RemoteError) as failure:
            for chunk in stream:
                streamed += chunk.text
        assert time.monotonic() - t0 < TIMEOUT + 10
        message = str(failure.value)
        assert rpc_servers[1].endpoint in message and "stopped answering" in message and "\n" not in message
        assert failure.value.results and failure.value.results[0].text == streamed and streamed
        with pytest.raises(RemoteError, match="must be loaded again"):  # the object says so, at once
            placed.generate("Hello", max_tokens=4)
    local = make_spec(SMOL, spec="none")  # this process goes on with a local model
    assert local.generate("Once upon a time", max_tokens=8, temperature=0).text


def test_a_server_that_stops_answering_ends_the_generation_within_the_timeout(model_file, rpc_servers):
    with llamaspec.load(str(model_file(SMOL)), spec="none", rpc=endpoints(rpc_servers), n_threads=THREADS,
                        n_ctx=1024, rpc_timeout=TIMEOUT, progress=False) as placed:
        stream = placed.stream("Once upon a time", max_tokens=400, temperature=0)
        next(stream)
        os.kill(rpc_servers[0].proc.pid, signal.SIGSTOP)  # alive, accepting connections, silent
        t0 = time.monotonic()
        with pytest.raises(RemoteError, match=f"did not answer within {TIMEOUT:g} s"):
            for _ in stream:
                pass
        assert TIMEOUT - 1 < time.monotonic() - t0 < TIMEOUT + 10


def test_a_wrong_address_is_one_line(model_file, smol):
    closed = f"127.0.0.1:{free_port()}"
    with pytest.raises(ModelError, match=f"cannot reach the RPC server {closed} "):
        llamaspec.load(str(model_file(SMOL)), rpc=[closed], progress=False)
    assert_one_line_error(run("generate", "-m", smol, "--rpc", closed, "-p", "Hi", "-n", "4"),
                          f"cannot reach the RPC server {closed}")
    assert_one_line_error(run("generate", "-m", smol, "--rpc", "localhost", "-p", "Hi"), "HOST:PORT")
    assert_one_line_error(run("profile", "-m", smol, "--rpc", closed), "cannot reach")


def test_compare_hands_the_servers_to_llama_cpp_s_program_and_gets_the_same_text(smol, rpc_servers, tmp_path):
    """An rpc-server serves one client at a time: the program runs first, then llamaspec, both on
    the servers."""
    out = tmp_path / "compare.json"
    result = run("compare", "-m", smol, "--rpc", ",".join(endpoints(rpc_servers)), "-t", str(THREADS), "-c", "1024",
                 "-n", "16", "--strategies", "plain", "--prompt-name", "open_chat", "--json", str(out))
    assert result.exit_code == 0, result.output
    row = json.loads(out.read_text())["rows"][0]
    assert row["status"] == "ok" and row["text"] == "same", row
    assert "--rpc" in row["command"] and ",".join(endpoints(rpc_servers)) in row["command"]


def test_a_build_without_the_rpc_backend_names_the_fix(model_file, monkeypatch):
    monkeypatch.setattr(remote, "supports_rpc", lambda: False)
    with pytest.raises(ModelError, match="built without llama.cpp's RPC backend.*GGML_RPC|cmake_args"):
        llamaspec.load(str(model_file(SMOL)), rpc=["127.0.0.1:50052"], progress=False)


def test_the_server_answers_503_while_the_rpc_servers_are_gone_then_serves_again(smol, rpc_program):
    servers = [RpcServer(rpc_program) for _ in range(2)]
    app = Server("-m", smol, "-t", str(THREADS), "-c", "1024", "--spec", "none", "--rpc", ",".join(endpoints(servers)),
                 "--rpc-timeout", str(TIMEOUT))
    try:
        client = OpenAI(base_url=f"{app.url}/v1", api_key="none", max_retries=0, timeout=120)
        first = client.completions.create(model="x", prompt="Once upon a time", max_tokens=8, temperature=0)
        servers[1].kill()
        status, body = app.request("POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8})
        assert status == 503 and servers[1].endpoint in body["error"]["message"]
        status, body = app.get("/health")
        assert status == 503 and body["status"] == "unavailable"
        assert app.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})[0] == 503
        servers[1] = RpcServer(rpc_program, servers[1].port)  # back on the same address
        deadline = time.monotonic() + 120
        while app.get("/health")[0] != 200:
            assert app.proc.poll() is None and time.monotonic() < deadline, "the model was not loaded again"
            time.sleep(0.5)
        again = client.completions.create(model="x", prompt="Once upon a time", max_tokens=8, temperature=0)
        assert again.choices[0].text == first.choices[0].text
    finally:
        app.stop()
        for s in servers:
            s.kill()
