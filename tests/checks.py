"""Checks the real-model tests share: greedy text against a one-token-at-a-time evaluation
(near ties allowed), sampled text against its seed's text alone, the KV invariant after every
step, a server as a real process on 127.0.0.1 and the installed console script."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, List

import numpy as np
from openai import OpenAI

from llamaspec import Result, SamplingConfig, Stats
from llamaspec.engine.generation import make_config
from llamaspec.engine.scheduler import Request
from llamaspec.sampling import Uniforms, sample_at, transform

from conftest import NEAR_TIE, chatml


N_TOKENS = 128
MIN_WHOLE = 16  # tokens at least of a plain answer that ends before the n compared (greedy text differs
# between CPUs: on an AVX2-only EPYC SmolLM2's answers to two test prompts end at 22 and 32 tokens)


def check_greedy(ref, prompt_tokens, plain_tokens, spec_tokens, label, n=N_TOKENS, near_tie=None):
    """Return (tokens compared, near-tie differences); fail on any other difference.

    Where the speculative output leaves the plain one, every speculative token is checked
    against a one-token-at-a-time evaluation of its own prefix. A plain answer that ends before
    n tokens is compared whole (at least MIN_WHOLE tokens), and the speculative one must be as long.
    ``near_tie``: the reference's own unless given.
    """
    near_tie = ref.near_tie if near_tie is None else near_tie
    need = n if len(plain_tokens) >= n else MIN_WHOLE  # a plain answer that ended sooner is compared whole
    assert len(plain_tokens) >= need, f"prompt must yield {need} tokens"
    assert len(spec_tokens) >= min(n, len(plain_tokens)), f"{label}: {len(spec_tokens)} tokens, plain gave more"
    near_ties = 0
    if spec_tokens != plain_tokens:
        argmax, gap = ref.top2(prompt_tokens, spec_tokens)
        for i, (token, best, g) in enumerate(zip(spec_tokens, argmax, gap)):
            if token != best:
                assert g < near_tie, f"{label}: token {i} is {token}, plain greedy gives {best} (gap {g:.3f})"
                near_ties += 1
    print(f"{label}: compared {len(spec_tokens)} tokens, {near_ties} near-tie differences, "
          f"identical to the plain run: {spec_tokens == plain_tokens}")
    return len(spec_tokens), near_ties


def assert_engine_kv(engine) -> None:
    """Between steps: every lane's home holds exactly what it caches, a prefix of its text but the
    pending token (while decoding: exactly that); a lane's draft sequence holds a prefix of it
    too; the scratch sequences hold nothing. While the next step's decode is queued (an engine
    that overlaps) a home holds that decode's rows after what it caches (at most a batch of
    them), scratch sequences its branches and a draft sequence its draft after the text."""
    ctx = engine.target
    for ln in engine.lanes:
        n = len(ln.cached)
        held = (ctx.pos_min(ln.home), ctx.pos_max(ln.home))
        if engine.queued and held[1] >= n:
            held = (held[0], n - 1) if held[1] < n + ctx.n_batch else held
        assert held == ((0, n - 1) if n else (-1, -1)), f"lane {ln.home}"
        assert ln.cached == ln.tokens[:n] and n <= max(len(ln.tokens) - 1, 0)
        if ln.state == "decoding":
            assert n == len(ln.tokens) - 1
        for seq in ln.speculator.contexts() if ln.speculator is not None else ():
            text = ln.tokens[:max(len(ln.tokens) - 1, 0)]
            if engine.queued:  # and then the draft of the decode queued
                assert seq.tokens[:len(text)] == text[:len(seq.tokens)]
            else:
                assert seq.tokens == text[:len(seq.tokens)] and len(seq.tokens) <= len(text)
            assert seq.pos_max() == len(seq.tokens) - 1
    for seq in engine.scratch if not engine.queued else ():
        assert ctx.pos_max(seq) == -1, f"sequence {seq} has stale cells"


def assert_kv_invariant(spec) -> None:
    assert_engine_kv(spec.engine)


def run_to_end(sched, requests, check, max_steps: int) -> None:
    """Submit ``requests`` to the scheduler and step it until they are done (at most
    ``max_steps`` steps), calling ``check(engine)`` after every step."""
    for r in requests:
        sched.submit(r)
    for _ in range(max_steps):
        if not sched.busy:
            break
        sched.step()
        check(sched.engine)
    assert all(r.done.is_set() for r in requests)


def generate_checked(spec, prompt: List[int], n: int = 1, **options) -> List[Result]:
    """One text (or ``n`` samples) through ``spec``'s scheduler, as generate decodes it, one engine
    step at a time, every cache checked after each; their results."""
    request = Request(prompt, make_config(**options), n, spec.spec_name)
    spec._scheduler.submit(request)
    for _ in range(10_000):
        if request.done.is_set():
            break
        spec._scheduler.step()
        assert_kv_invariant(spec)
    assert request.done.is_set() and request.error is None
    return request.results


JSON_PROMPT = chatml("Return a JSON list of 3 fictional people, each with name, age, email and city.")


def assert_as_alone(ref, prompt, tokens, expected, label=""):
    """``tokens`` equal ``expected`` (plain greedy), or leave them first where the top-1/top-2 logit
    gap of a one-token-at-a-time evaluation is below the model's near-tie (``ref.near_tie``)."""
    first = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), None)
    if first is None:
        assert tokens == expected, label
        return
    _, gap = ref.top2(prompt, tokens[:first + 1])
    assert gap[first] < ref.near_tie, f"{label} token {first}: {tokens[first]} against {expected[first]} (gap {gap[first]:.3f})"


def assert_sampled_as_alone(ref, prompt, tokens, expected, sampling: SamplingConfig, seed: int, label=""):
    """``tokens`` equal ``expected`` (sampled alone with ``seed``), or leave them first at a sampling
    near-tie (``sampled_near_tie``) of a one-token-at-a-time evaluation."""
    first = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), None)
    if first is None:
        assert tokens == expected, label
        return
    row = ref.row_after(prompt, expected[:first])
    u = Uniforms(seed)(len(prompt) + first)
    assert sampled_near_tie(row, sampling, u, tokens[first], expected[first], ref.near_tie), \
        f"{label} token {first}: {tokens[first]} against {expected[first]} (u {u:.4f})"


def check_stats(stats: Stats, n_tokens: int):
    assert stats.n_accept <= stats.n_drafted
    # every target call emits its accepted drafts plus one token
    assert stats.n_predict == stats.n_accept + stats.n_target_calls == n_tokens


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([console_script(), "serve", *args, "--port", str(self.port)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while True:
            assert self.proc.poll() is None, self.proc.communicate()[1]
            assert time.monotonic() < deadline, "the server did not come up"
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)

    def client(self, **kw) -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", api_key=kw.pop("api_key", "none"), max_retries=0, timeout=300, **kw)

    def get(self, path: str, headers: Dict[str, str] = {}):  # noqa: B006
        return self.request("GET", path, None, headers)

    def request(self, method: str, path: str, body, headers: Dict[str, str] = {}):  # noqa: B006
        """The status and JSON answer of a request; a body is declared JSON unless ``headers``
        give a Content-Type (urllib's own default, a form, the server refuses with 415)."""
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        if data is not None and not any(k.lower() == "content-type" for k in headers):
            headers = {"Content-Type": "application/json", **headers}
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def stop(self) -> str:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=60)
        return err


def console_script() -> str:
    path = shutil.which("llamaspec") or str(Path(sys.executable).parent / "llamaspec")
    assert Path(path).exists(), "the console script is installed with the package"
    return path


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}


STEP = 0.025  # the moves sampled_near_tie tries, apart by this much: a token may be reached in a narrow range of them


def sampled_near_tie(row: np.ndarray, sampling: SamplingConfig, u: float, a: int, b: int,
                     near_tie: float = NEAR_TIE) -> bool:
    """Whether the draw at uniform ``u`` gives ``a`` for some logits and ``b`` for others, each
    within ``near_tie`` / 2 of ``row`` (so any two logits' gap moved by less than ``near_tie``, as a greedy
    near-tie allows): the sampled analogue of a near-tie, which a batch of another size may flip.

    For each token, two families of moves are tried: lower the logits the sampler orders before
    it and raise the rest (its interval of the inverse CDF slides down), or raise it and those
    before it and lower the rest (it slides up). Every move tried is within the bound, so a token
    found is truly reachable."""
    def reachable(token: int) -> bool:
        order = [int(t) for t in transform(row, sampling).ids]
        if token in order:
            k = order.index(token)
            blocks = (order[:k], order[:k + 1])
        else:
            blocks = (order,)
        for before in blocks:
            for s in np.linspace(0.0, near_tie / 2, 1 + round(near_tie / 2 / STEP)):
                moved = row + np.float32(s)
                moved[before] = row[before] - np.float32(s)
                for shifted in (moved, 2 * row - moved):  # slide down, slide up
                    if sample_at(transform(shifted, sampling), u) == token:
                        return True
        return False
    return reachable(a) and reachable(b)
