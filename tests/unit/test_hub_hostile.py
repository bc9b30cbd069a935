"""The hub path against a hub that stalls or lies: a fake hub on 127.0.0.1 (reached through
HF_ENDPOINT, with a temporary HF_HOME and HF_HUB_CACHE) whose listing, metadata and download
answers are stalled (no answer; headers and no body; a byte now and then), cut mid-body,
longer in their Content-Length than their body, short, of the wrong bytes or size, malformed,
hostile in their file names, or error statuses; and names no hub holds. Whatever it does: the
right file, or one line within a bounded time (LLAMASPEC_HUB_TIMEOUT and LLAMASPEC_HUB_DEADLINE
set small), and never a partial or corrupt file that a later run would load as the model."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Optional, Tuple
from urllib.parse import unquote, urlsplit

import pytest
from huggingface_hub import constants
from hypothesis import HealthCheck, given, settings, strategies as st

from llamaspec.errors import ConfigError, LlamaspecError, UnknownModelError
from llamaspec.llama import hub
from llamaspec.llama.hub import DEADLINE_VAR, TIMEOUT_VAR, HubModel, choose, hub_spec, plain

from checks import console_script
from fuzzing import values

COMMIT = "0123456789abcdef0123456789abcdef01234567"
NAME = "m-Q4_K_M.gguf"
DATA = b"GGUF" + b"".join(hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(4096))  # 128 KiB
TIMEOUT, DEADLINE = 1, 3  # seconds, as the tests set them
STALL = 20.0  # seconds a stalled answer waits at most (each test releases its own sooner)
HOSTILE_NAMES = ["../../x.gguf", "/abs/x.gguf", "a\\..\\x.gguf", "a//x.gguf", "./x.gguf", "x/../y.gguf", "",
                 "C:x.gguf", "x.gguf/", "a/./x.gguf", "x\n.gguf", "x\x00.gguf", "q" * 10_000 + ".gguf",
                 "a/" + "b" * 300 + "/x.gguf"]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class HostileHub:
    """The hub's endpoints huggingface_hub and llamaspec use (``GET /api/models/REPO/tree/REV``,
    ``HEAD``/``GET /REPO/resolve/REV/FILE``) for one repository ``o/r``, each answering as its
    mode in ``modes`` (``listing``, ``HEAD``, ``GET``) says:

    ok        the right answer (a GET honours Range)
    stall     the connection accepted, never an answer
    headers   the status and headers, then no body
    trickle   the headers, then a byte every 0.3 s
    cut       half the body, then the connection closed (every time; Range ignored)
    cut-once  cut the first time, right (with Range) afterwards
    long      a Content-Length 1000 bytes over the body, then the connection closed
    short     half the body, with a Content-Length that says so (a listing cut short)
    wrong     other bytes of the same size (a GET)
    nocommit  no X-Repo-Commit header (a HEAD)
    500, 404, gated   those errors

    ``listing``: the listing's bytes where a test sets them; ``lie_size``: a listing's size of
    every file that much over the truth; ``next``: the address of a listing's next page."""

    def __init__(self) -> None:
        hub_ = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub_.answer(self)

            def do_GET(self) -> None:
                hub_.answer(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.released = threading.Event()
        self.reset()
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def reset(self) -> None:
        """Every answer right again, and every stalled one released."""
        self.released.set()
        self.released = threading.Event()
        self.files: Dict[str, bytes] = {NAME: DATA}
        self.modes: Dict[str, str] = {}
        self.listing: Optional[bytes] = None
        self.lie_size = 0
        self.next: Optional[str] = None
        self.cut_done = False
        self.log: List[Tuple[str, str]] = []

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def listing_body(self) -> bytes:
        if self.listing is not None:
            return self.listing
        return json.dumps([{"type": "file", "path": name, "size": len(data) + self.lie_size,
                            "oid": hashlib.sha1(data).hexdigest(),
                            "lfs": {"oid": sha256(data), "size": len(data), "pointerSize": 130}}
                           for name, data in self.files.items()] + [{"type": "directory", "path": "sub"}]).encode()

    def answer(self, h: BaseHTTPRequestHandler) -> None:
        released = self.released
        parts = urlsplit(h.path).path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and "tree" in parts:
            kind, repo = "listing", "/".join(parts[2:parts.index("tree")])
            name, data, headers = "", self.listing_body(), {"Content-Type": "application/json"}
            if self.next:
                headers["Link"] = f'<{self.next}>; rel="next"'
        elif "resolve" in parts:
            kind, repo = h.command, "/".join(parts[:parts.index("resolve")])
            name = unquote("/".join(parts[parts.index("resolve") + 2:]))
            data = self.files.get(name, b"")
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{sha256(data)}"', "Accept-Ranges": "bytes"}
        else:
            return self.error(h, 404, "EntryNotFound")
        self.log.append((kind, name))
        if repo != "o/r":
            return self.error(h, 404, "RepoNotFound")
        if kind != "listing" and name not in self.files:
            return self.error(h, 404, "EntryNotFound")
        self.send(h, kind, self.modes.get(kind, "ok"), data, headers, released)

    def send(self, h: BaseHTTPRequestHandler, kind: str, mode: str, data: bytes, headers: Dict[str, str],
             released: threading.Event) -> None:
        if mode == "stall":
            released.wait(STALL)
            return
        if mode in ("500", "404", "gated"):
            return self.error(h, 403 if mode == "gated" else int(mode), "GatedRepo" if mode == "gated" else "")
        if mode == "nocommit":
            headers.pop("X-Repo-Commit")
        body = kind != "HEAD"
        start = int(h.headers["Range"].split("=")[1].split("-")[0]) if h.headers.get("Range") else 0
        if mode == "cut-once" and self.cut_done:
            mode = "ok"
        if mode == "ok" and start and body:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            return self.write(h, 206, headers, data[start:], len(data) - start)
        if mode == "wrong" and body:
            data = bytes(reversed(data))
        length = {"long": len(data) + 1000, "short": len(data) // 2}.get(mode, len(data)) if body else len(data)
        sent = {"cut": len(data) // 2, "cut-once": len(data) // 2, "short": len(data) // 2}.get(mode, len(data))
        if mode == "cut-once":
            self.cut_done = True
        h.send_response(200)
        for key, value in headers.items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(length))
        h.end_headers()
        h.wfile.flush()
        if not body:
            return
        if mode == "headers":
            released.wait(STALL)
            return
        if mode == "trickle":
            for i in range(len(data)):
                if released.wait(0.3):
                    return
                h.wfile.write(data[i:i + 1])
                h.wfile.flush()
            return
        h.wfile.write(data[:sent])
        h.wfile.flush()
        h.close_connection = True

    @staticmethod
    def write(h: BaseHTTPRequestHandler, status: int, headers: Dict[str, str], data: bytes, length: int) -> None:
        h.send_response(status)
        for key, value in headers.items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(length))
        h.end_headers()
        h.wfile.write(data)

    @staticmethod
    def error(h: BaseHTTPRequestHandler, status: int, code: str) -> None:
        HostileHub.write(h, status, {"X-Error-Code": code, "Content-Type": "application/json"} if code else {},
                         b'{"error": "no"}', len(b'{"error": "no"}'))


@pytest.fixture(scope="module")
def server():
    hub_ = HostileHub()
    yield hub_
    hub_.close()


@pytest.fixture
def fake(server, tmp_path, monkeypatch):
    """The fake hub, right again, and huggingface_hub pointed at it with an empty cache; the
    timeouts small. huggingface_hub reads its settings when imported: they are set in it too."""
    server.reset()
    cache = tmp_path / "hub"
    for name, value in {"HF_ENDPOINT": server.url, "HF_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(cache),
                        TIMEOUT_VAR: str(TIMEOUT), DEADLINE_VAR: str(DEADLINE)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", server.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        server.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", constants.HF_HUB_DOWNLOAD_TIMEOUT)  # restored after
    server.cache = cache
    yield server
    server.reset()


def fetch(spec: str = "hf://o/r:Q4_K_M") -> Tuple[object, float]:
    """hub.resolve(spec): the path, or the error; and the seconds it took."""
    t0 = time.monotonic()
    try:
        result: object = hub.resolve(spec, progress=False)
    except LlamaspecError as e:
        result = e
    return result, time.monotonic() - t0


def one_line(result: object, fragment: str = "") -> str:
    assert isinstance(result, LlamaspecError), result
    message = str(result)
    assert message and "\n" not in message and "\r" not in message and len(message) <= 600, message
    assert fragment in message, message
    return message


def nothing_loadable(cache: Path) -> None:
    """No file of the cache's snapshots (what a later run would load) but whole, right ones,
    and no partial download left behind."""
    for path in cache.rglob("*"):
        assert not path.name.endswith(".incomplete"), path
        if path.is_file() and "snapshots" in path.parts:
            assert path.read_bytes() == DATA, path


def right(result: object) -> None:
    assert isinstance(result, Path) and result.read_bytes() == DATA, result


# --- names no hub holds: refused before any network ------------------------------------------

@pytest.mark.parametrize("spec", ["o" * 10_000 + "/r", "o/" + "r" * 97, "o/r:" + "Q" * 10_000, "é/r", "o/r r",
                                  "o/r--x", "o/r..x", "o/r.git", "-o/r", "o/r-", "o/r:Q4 K", "o/r:Q4/..",
                                  "o/r/../../x.gguf", "o/r//abs/x.gguf", "o/r/a\\x.gguf", "o/r/x.gguf/"])
def test_a_name_no_hub_holds_is_refused_before_any_network(fake, spec):
    result, took = fetch(spec if spec.startswith("hf://") else "hf://" + spec)
    assert isinstance(result, ConfigError), result
    one_line(result, "hub")
    assert len(str(result)) <= 300 and fake.log == [] and took < 1


@pytest.mark.parametrize("name", [name for name in HOSTILE_NAMES if name])  # an empty --hf-file is none
def test_a_hostile_hf_file_is_refused_in_one_line(fake, name):
    with pytest.raises(ConfigError) as refused:
        hub_spec("o/r", name)
    one_line(refused.value, "a hub file is a plain path inside its repository")
    assert fake.log == []


def test_a_listing_s_hostile_names_are_never_chosen(fake):
    fake.files = {name: DATA for name in HOSTILE_NAMES}
    result, _ = fetch("hf://o/r")
    one_line(result, "o/r holds no GGUF model")
    assert not [entry for entry in fake.log if entry[0] != "listing"]  # nothing asked for
    fake.files = {**fake.files, "sub/" + NAME: DATA}
    result, _ = fetch("hf://o/r:Q4_K_M")
    right(result)
    assert {name for _, name in fake.log if name} == {"sub/" + NAME}  # only the plain one asked for
    assert not (fake.cache.parent / "x.gguf").exists() and not Path("/abs/x.gguf").exists()


def test_plain():
    assert plain("m.gguf") and plain("sub/dir/m-Q4_K_M.gguf") and plain("a..b.gguf")
    assert not any(plain(name) for name in HOSTILE_NAMES)


# --- the listing ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode, fragment, most", [
    ("stall", f"did not answer the listing of o/r within {TIMEOUT} s ({TIMEOUT_VAR} raises it)", TIMEOUT + 1.5),
    ("headers", f"did not answer the listing of o/r within {TIMEOUT} s ({TIMEOUT_VAR} raises it)", TIMEOUT + 1.5),
    ("trickle", f"did not finish the listing of o/r within {DEADLINE} s ({DEADLINE_VAR} raises it)", DEADLINE + 1.5),
    ("cut", "failed the listing of o/r (RemoteProtocolError", 2),
    ("long", "failed the listing of o/r (RemoteProtocolError", 2),
    ("short", "sent a listing of o/r that is not one (not JSON)", 2),
    ("500", "answered 500 to the listing of o/r", 2),
])
def test_a_listing_that_fails_is_one_line_in_bounded_time(fake, mode, fragment, most):
    fake.modes["listing"] = mode
    result, took = fetch()
    message = one_line(result, f"the hub at {fake.url} ")
    assert fragment in message and message.endswith("and the local cache holds nothing of o/r"), message
    assert took < most, took


def test_a_listing_that_fails_falls_back_on_the_cache(fake):
    right(fetch()[0])
    fake.modes["listing"] = "stall"
    result, took = fetch()
    right(result)
    assert took < TIMEOUT + 1.5 and [kind for kind, _ in fake.log].count("listing") == 2
    assert fake.log[-1] == ("listing", "")  # and nothing asked for after it


@pytest.mark.parametrize("mode, error, fragment", [
    ("404", UnknownModelError, "no repository o/r on the hub at"),
    ("gated", LlamaspecError, "o/r is gated on the hub: accept its terms there and set HF_TOKEN"),
])
def test_a_repository_the_hub_refuses_is_one_line(fake, mode, error, fragment):
    fake.modes["listing"] = mode
    result, _ = fetch()
    assert isinstance(result, error)
    one_line(result, fragment)


def test_a_listing_s_pages_are_bounded_and_stay_on_the_hub(fake, monkeypatch):
    fake.next = "http://elsewhere.invalid/api/models/o/r/tree/main"  # where our token must not go
    one_line(fetch()[0], "sent the listing of o/r on to another host")
    fake.next = "/api/models/o/r/tree/main?page=again"  # the same page, forever
    monkeypatch.setattr(hub, "MAX_PAGES", 20)
    one_line(fetch()[0], f"the hub at {fake.url} sent a listing of o/r of more than 20 pages")
    fake.next = None
    monkeypatch.setattr(hub, "MAX_LISTING", 100)
    one_line(fetch()[0], "sent a listing of o/r over")


FILE_ENTRY = st.fixed_dictionaries(
    {"type": st.sampled_from(["file", "file", "directory", 7, None]),
     "path": st.one_of(st.sampled_from([NAME, "other-Q8_0.gguf", "README.md"] + HOSTILE_NAMES), st.text(max_size=20))},
    optional={"size": st.one_of(st.just(len(DATA)), st.integers(-5, 10**6), values),
              "lfs": st.one_of(values, st.fixed_dictionaries({"oid": st.sampled_from([sha256(DATA), "0" * 64, 5])}))})


@settings(derandomize=True, database=None, deadline=None, max_examples=60,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(body=st.one_of(st.lists(FILE_ENTRY, max_size=6).map(lambda items: json.dumps(items).encode()),
                      values.map(lambda value: json.dumps(value).encode()), st.binary(max_size=40)),
       spec=st.sampled_from(["hf://o/r", "hf://o/r:Q4_K_M", "hf://o/r/" + NAME]))
def test_any_listing_gives_the_right_file_or_one_line(fake, body, spec):
    fake.listing = body
    fake.files = {NAME: DATA, "other-Q8_0.gguf": DATA, "README.md": b"# no"}
    result, took = fetch(spec)
    assert took < 2, took
    if isinstance(result, Path):
        right(result)
    else:
        one_line(result)
    assert all(plain(name) for _, name in fake.log if name)
    nothing_loadable(fake.cache)


# --- the download --------------------------------------------------------------------------

@pytest.mark.parametrize("kind, mode, fragments, most", [
    ("HEAD", "stall", [f"did not answer the download of o/r/{NAME} within {TIMEOUT} s ({TIMEOUT_VAR} raises it)"],
     TIMEOUT + 1.5),
    ("HEAD", "500", [f"answered 500 to the download of o/r/{NAME}"], 2),
    ("HEAD", "404", [f"answered 404 to the download of o/r/{NAME}"], 2),
    ("HEAD", "nocommit", [f"downloading o/r/{NAME} from the hub at", "missing the 'X-Repo-Commit' header"], 2),
    ("GET", "stall", [f"did not finish sending o/r/{NAME} within {DEADLINE} s ({DEADLINE_VAR} raises it)"],
     DEADLINE + 1.5),
    ("GET", "headers", [f"did not finish sending o/r/{NAME} within {DEADLINE} s"], DEADLINE + 1.5),
    ("GET", "trickle", [f"did not finish sending o/r/{NAME} within {DEADLINE} s"], DEADLINE + 1.5),
    ("GET", "cut", [f"o/r/{NAME}"], DEADLINE + 1.5),
    ("GET", "long", [f"o/r/{NAME}"], DEADLINE + 1.5),
    ("GET", "short", [f"downloading o/r/{NAME} from the hub at", "Consistency check failed"], 2),
    ("GET", "wrong", [f"sent o/r/{NAME} with sha256", "where its listing says", "it was not kept"], 2),
    ("GET", "500", [f"answered 500 to the download of o/r/{NAME}"], 2),
    ("GET", "404", [f"answered 404 to the download of o/r/{NAME}"], 2),
])
def test_a_download_that_fails_is_one_line_and_a_second_run_gets_the_right_file(fake, monkeypatch, kind, mode,
                                                                                 fragments, most):
    fake.modes[kind] = mode
    result, took = fetch()
    message = one_line(result, f"the hub at {fake.url}")
    assert all(f in message for f in fragments), message
    assert took < most, took
    nothing_loadable(fake.cache)
    fake.reset()
    monkeypatch.setenv(DEADLINE_VAR, "30")  # the thread given up on may hold the file's lock a moment longer
    right(fetch()[0])


def test_a_size_the_listing_does_not_give_is_not_kept(fake):
    fake.lie_size = 1
    result, _ = fetch()
    one_line(result, f"sent o/r/{NAME} of {len(DATA)} bytes, where its listing says {len(DATA) + 1}; it was not kept")
    nothing_loadable(fake.cache)


def test_a_download_cut_once_resumes(fake):
    fake.modes["GET"] = "cut-once"
    right(fetch()[0])
    gets = [name for kind, name in fake.log if kind == "GET"]
    assert len(gets) == 2, fake.log


def test_a_cached_file_is_used_when_its_hub_stalls(fake):
    right(fetch()[0])
    fake.modes["HEAD"] = "stall"
    result, took = fetch()
    right(result)
    assert took < TIMEOUT + 1.5


def test_bad_limits_are_one_line(fake, monkeypatch):
    for value in ("0", "-1", "abc", "inf", "nan"):
        monkeypatch.setenv(TIMEOUT_VAR, value)
        with pytest.raises(ConfigError, match=f"{TIMEOUT_VAR} is a number of seconds above 0"):
            hub.resolve("hf://o/r", progress=False)
    assert fake.log == []


def test_choose_skips_what_is_not_plain():
    assert choose(HubModel.parse("hf://o/r"), ["../m-Q4_K_M.gguf", "/m-Q8_0.gguf", "ok-Q5_0.gguf"]) == ["ok-Q5_0.gguf"]


# --- through the command line ----------------------------------------------------------------

def llamaspec(fake, *args: str, deadline: int = DEADLINE) -> Tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "HF_ENDPOINT": fake.url, "HF_HOME": str(fake.cache.parent / "home"),
           "HF_HUB_CACHE": str(fake.cache), "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
           TIMEOUT_VAR: str(TIMEOUT), DEADLINE_VAR: str(deadline)}
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"):
        env.pop(name, None)
    t0 = time.monotonic()
    done = subprocess.run([console_script(), "models", "path", *args], capture_output=True, text=True, env=env,
                          timeout=60)
    return done, time.monotonic() - t0


def cli_one_line(done: subprocess.CompletedProcess, fragment: str) -> None:
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], done.stderr


def test_the_cli_gives_one_line_for_a_stalled_listing_a_stalled_or_cut_download_and_bad_names(fake):
    fake.modes["listing"] = "stall"
    done, took = llamaspec(fake, "-hf", "o/r:Q4_K_M")
    cli_one_line(done, f"error: the hub at {fake.url} did not answer the listing of o/r within {TIMEOUT} s "
                       f"({TIMEOUT_VAR} raises it), and the local cache holds nothing of o/r")
    assert took < TIMEOUT + 5, took

    fake.reset()
    fake.modes["GET"] = "headers"
    done, took = llamaspec(fake, "-hf", "o/r:Q4_K_M")
    cli_one_line(done, f"did not finish sending o/r/{NAME} within {DEADLINE} s ({DEADLINE_VAR} raises it)")
    assert took < DEADLINE + 5, took
    nothing_loadable(fake.cache)

    fake.reset()
    fake.modes["GET"] = "long"
    done, took = llamaspec(fake, "-hf", "o/r:Q4_K_M", deadline=30)
    cli_one_line(done, f"o/r/{NAME}")
    assert took < 20, took
    nothing_loadable(fake.cache)

    fake.reset()
    done, _ = llamaspec(fake, "-hf", "o/r:Q4_K_M")  # the second run, the hub right again
    assert done.returncode == 0 and Path(done.stdout.strip()).read_bytes() == DATA, done.stderr

    fake.reset()
    for args, fragment in [(["-hf", "o/r", "--hf-file", "../../x.gguf"], "a hub file is a plain path inside"),
                           (["-hf", "o/r", "--hf-file", "/abs/x.gguf"], "a hub file is a plain path inside"),
                           (["-hf", "o" * 10_000 + "/r"], "a hub model is OWNER/REPO[:QUANT]")]:
        done, took = llamaspec(fake, *args)
        cli_one_line(done, fragment)
        assert len(done.stderr) < 400
    assert fake.log == []
