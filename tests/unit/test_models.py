"""Unit tests of the model list and fetching. No internet: a local HTTP server plays PyPI."""

from __future__ import annotations

import functools
import hashlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List

import pytest

from llamaspec.llama import models
from llamaspec.errors import ConfigError, FetchError, ModelError, UnknownModelError
from llamaspec.llama.models import (
    cache_dir,
    default_pair,
    fetch,
    load_model_list,
    model_path,
    resolve_model,
)


def data(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


class _QuietHandler(SimpleHTTPRequestHandler):
    def __init__(self, *args: object, index: "FakeIndex", **kwargs: object) -> None:
        self.index = index
        super().__init__(*args, **kwargs)

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.endswith(".whl"):
            self.index.downloads.append(self.path)
        super().do_GET()

    def copyfile(self, source, outputfile) -> None:  # type: ignore[no-untyped-def]
        while True:  # at most bytes_per_second when the index is slow
            chunk = source.read(self.index.chunk)
            if not chunk:
                return
            outputfile.write(chunk)
            if self.index.delay:
                time.sleep(self.index.delay)


class FakeIndex:
    """A PEP 503 simple index and file server on 127.0.0.1, serving files from ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "files").mkdir(parents=True)
        self.links: Dict[str, List[str]] = {}
        self.downloads: List[str] = []
        self.chunk, self.delay = 1 << 16, 0.0
        handler = functools.partial(_QuietHandler, directory=str(root), index=self)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.open = True

    def add_wheel(
        self,
        name: str,
        version: str,
        members: Dict[str, bytes],
        compression: int = zipfile.ZIP_DEFLATED,
        sha256: str = "",
    ) -> None:
        """Publish a wheel; ``sha256`` overrides the hash the index states for it."""
        dist = re.sub(r"[-_.]+", "_", name)
        filename = f"{dist}-{version}-py3-none-any.whl"
        path = self.root / "files" / filename
        with zipfile.ZipFile(path, "w") as wheel:
            for member, content in members.items():
                wheel.writestr(member, content, compress_type=compression)
            wheel.writestr(f"{dist}-{version}.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n")
        digest = sha256 or sha(path.read_bytes())
        self._link(name, f"../../files/{filename}#sha256={digest}", filename)

    def add_file(self, filename: str, content: bytes) -> str:
        (self.root / "files" / filename).write_bytes(content)
        return f"{self.url}/files/{filename}"

    def _link(self, name: str, href: str, text: str) -> None:
        normalized = re.sub(r"[-_.]+", "-", name).lower()
        links = self.links.setdefault(normalized, [f'<a href="../../files/{normalized}-0.tar.gz">sdist</a><br/>'])
        links.append(f'<a href="{href}" data-requires-python="&gt;=3.9">{text}</a><br/>')
        page = self.root / "simple" / normalized / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")

    def close(self) -> None:
        if self.open:
            self.server.shutdown()
            self.server.server_close()
            self.open = False


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("LLAMASPEC_MODELS", "LLAMASPEC_CACHE", "LLAMASPEC_PYPI_INDEX", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    server = FakeIndex(tmp_path / "server")
    monkeypatch.setenv("LLAMASPEC_PYPI_INDEX", server.url + "/simple")
    yield server
    server.close()


def listed(tmp_path: Path, text: str) -> Dict[str, models.ModelEntry]:
    path = tmp_path / "models.txt"
    path.write_text(text)
    return load_model_list(path)


def section(name: str, content: bytes, *sources: str, sha256: str = "") -> str:
    lines = "\n".join(f"    {s}" for s in sources)
    return (
        f"[{name}]\nfile = {name}.gguf\nsize = {len(content)}\n"
        f"sha256 = {sha256 or sha(content)}\nsources =\n{lines}\n"
    )


def leftovers(cache: Path) -> List[str]:
    return sorted(p.name for p in cache.glob("*") if p.name.endswith((".partial", ".tmp")))


PARTS = [data(3000, 1) + b"gguf" * 1000, data(5000, 2), data(2500, 3) + bytes(4000)]
MULTI = "pypi fake-model-part{N}==1.0.0 fake_model_part{N}/data/part{N:02d}.bin N=1..3"


def publish_parts(index: FakeIndex, version: str = "1.0.0", bad_hash_for: int = 0) -> None:
    for n, part in enumerate(PARTS, 1):
        compression = zipfile.ZIP_STORED if n == 2 else zipfile.ZIP_DEFLATED
        bad = "0" * 64 if n == bad_hash_for else ""
        index.add_wheel(f"fake-model-part{n}", version, {f"fake_model_part{n}/data/part{n:02d}.bin": part}, compression, bad)


# ---------------------------------------------------------------- fetching from the fake index


def test_multipart_assembly(tmp_path, index, capsys):
    for n in (1, 2, 3):  # an older version with other bytes, listed first: must be skipped
        index.add_wheel(f"fake-model-part{n}", "0.9.0", {f"fake_model_part{n}/data/part{n:02d}.bin": b"old"})
    publish_parts(index)
    whole = b"".join(PARTS)
    reg = listed(tmp_path, section("multi", whole, MULTI))
    path = fetch("multi", cache=tmp_path / "cache", progress=True, model_list=reg)
    assert path == tmp_path / "cache" / "multi.gguf"
    assert path.read_bytes() == whole and sha(path.read_bytes()) == reg["multi"].sha256
    assert leftovers(tmp_path / "cache") == []
    assert (tmp_path / "cache" / "multi.gguf.verified").is_file()
    assert "multi" in capsys.readouterr().err  # the tqdm bar


def test_wheel_with_wrong_hash_is_refused(tmp_path, index):
    publish_parts(index, bad_hash_for=2)
    reg = listed(tmp_path, section("multi", b"".join(PARTS), MULTI))
    with pytest.raises(FetchError, match=r"multi.*fake-model-part2==1.0.0.*sha256"):
        fetch("multi", cache=tmp_path / "cache", progress=False, model_list=reg)
    assert not (tmp_path / "cache" / "multi.gguf").exists()
    assert leftovers(tmp_path / "cache") == []


def test_model_with_wrong_hash_is_refused(tmp_path, index):
    publish_parts(index)
    reg = listed(tmp_path, section("multi", b"".join(PARTS), MULTI, sha256="ab" * 32))
    with pytest.raises(FetchError, match="assembled file has sha256"):
        fetch("multi", cache=tmp_path / "cache", progress=False, model_list=reg)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["multi.gguf.lock"]  # only the (empty) lock


def test_missing_member_and_missing_wheel(tmp_path, index):
    index.add_wheel("one-part", "1.0", {"one_part/other.bin": b"x"})
    content = data(100, 4)
    reg = listed(
        tmp_path,
        section("nomember", content, "pypi one-part==1.0 one_part/model.bin")
        + section("noversion", content, "pypi one-part==2.0 one_part/model.bin"),
    )
    with pytest.raises(FetchError, match="no member one_part/model.bin"):
        fetch("nomember", cache=tmp_path / "cache", progress=False, model_list=reg)
    with pytest.raises(FetchError, match=r"no wheel of one-part==2\.0"):
        fetch("noversion", cache=tmp_path / "cache", progress=False, model_list=reg)


def test_second_fetch_is_offline(tmp_path, index, monkeypatch):
    publish_parts(index)
    reg = listed(tmp_path, section("multi", b"".join(PARTS), MULTI))
    first = fetch("multi", cache=tmp_path / "cache", progress=False, model_list=reg)
    index.close()
    monkeypatch.setenv("LLAMASPEC_PYPI_INDEX", "http://127.0.0.1:9/nothing")
    assert fetch("multi", cache=tmp_path / "cache", progress=False, model_list=reg) == first
    assert model_path("multi", cache=tmp_path / "cache", model_list=reg) == first


def test_sidecar_skips_rehash(tmp_path, index, monkeypatch):
    publish_parts(index)
    reg = listed(tmp_path, section("multi", b"".join(PARTS), MULTI))
    first = fetch("multi", cache=tmp_path / "cache", progress=False, model_list=reg)

    def no_hashing(path):
        raise AssertionError("re-hashed a file the sidecar vouches for")

    monkeypatch.setattr(models, "_sha256_file", no_hashing)
    assert fetch("multi", cache=tmp_path / "cache", progress=False, model_list=reg) == first


def test_corrupted_cache_is_refetched(tmp_path, index):
    publish_parts(index)
    whole = b"".join(PARTS)
    reg = listed(tmp_path, section("multi", whole, MULTI))
    path = fetch("multi", cache=tmp_path / "cache", progress=False, model_list=reg)
    broken = bytearray(whole)
    broken[100] ^= 0xFF
    path.write_bytes(bytes(broken))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    assert model_path("multi", cache=tmp_path / "cache", model_list=reg) is None
    assert fetch("multi", cache=tmp_path / "cache", progress=False, model_list=reg) == path
    assert path.read_bytes() == whole


def test_url_source(tmp_path, index):
    content = data(7000, 5)
    url = index.add_file("plain.gguf", content)
    reg = listed(tmp_path, section("plain", content, url))
    assert fetch("plain", cache=tmp_path / "cache", progress=False, model_list=reg).read_bytes() == content


def test_local_sources_and_fallback(tmp_path):
    content = data(4000, 6)
    local = tmp_path / "local.gguf"
    local.write_bytes(content)
    reg = listed(
        tmp_path,
        section("abs", content, str(tmp_path / "missing.gguf"), str(local))
        + section("prefixed", content, f"file:{local}")
        + section("fileurl", content, local.as_uri()),
    )
    for name in reg:
        path = fetch(name, cache=tmp_path / "cache", progress=False, model_list=reg)
        assert path.read_bytes() == content


def test_all_sources_fail(tmp_path):
    content = b"x" * 10
    reg = listed(tmp_path, section("gone", content, str(tmp_path / "a.gguf"), "http://127.0.0.1:9/b.gguf"))
    with pytest.raises(FetchError) as info:
        fetch("gone", cache=tmp_path / "cache", progress=False, model_list=reg)
    message = str(info.value)
    assert "gone" in message and "127.0.0.1:9" in message and "\n" not in message
    assert leftovers(tmp_path / "cache") == []


# ---------------------------------------------------------------- registry format


def test_range_template_expansion():
    parts = models._wheel_parts("pypi g-part{N}==1.0.0 g_part{N}/data/g.gguf.part{M:02d} N=1..4 M=0..3")
    assert parts[0] == ("g-part1", "1.0.0", "g_part1/data/g.gguf.part00")
    assert parts[-1] == ("g-part4", "1.0.0", "g_part4/data/g.gguf.part03")
    assert len(parts) == 4
    assert models._wheel_parts("pypi single==0.1.2 single/m.gguf") == [("single", "0.1.2", "single/m.gguf")]
    assert len(models._wheel_parts(MULTI)) == 3


@pytest.mark.parametrize(
    "source, message",
    [
        ("pypi a{N}==1 a/b N=1..3 M=0..1", "differ in length"),
        ("pypi a{N}==1 a/b N=3..1", "bad range"),
        ("pypi a{K}==1 a/b N=1..2", "bad template"),
        ("pypi a-1 a/b", "NAME==VERSION"),
        ("pypi a==1", "expected 'pypi"),
        ("relative/path.gguf", "unknown source"),
    ],
)
def test_bad_sources(tmp_path, source, message):
    with pytest.raises(ConfigError, match=message) as info:
        listed(tmp_path, section("m", b"x", source))
    assert "[m]" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("[m]\nfile = m.gguf\nsize = 1\n", "sha256"),
        ("[m]\nfile = m.gguf\nsize = big\nsha256 = " + "0" * 64 + "\nsources = /x\n", "size"),
        ("[m]\nfile = a/m.gguf\nsize = 1\nsha256 = " + "0" * 64 + "\nsources = /x\n", "plain file name"),
        ("[m]\nfile = m.gguf\nsize = 1\nsha256 = " + "0" * 64 + "\n", "no 'sources'"),
        ("[m]\nfile = m.gguf\nsha265 = x\n", "unknown key 'sha265'"),
        ("no section header\n", "malformed"),
        ("[m]\nfile = a\n[m]\nfile = b\n", "malformed"),
    ],
)
def test_malformed_registry(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message) as info:
        listed(tmp_path, text)
    assert "\n" not in str(info.value)


def test_real_registry():
    reg = load_model_list()
    assert set(reg) == {
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "smollm2-135m-instruct",
        "gemma-3-270m",
    }
    assert default_pair() == ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")
    for entry in reg.values():
        assert re.fullmatch(r"[0-9a-f]{64}", entry.sha256)
        assert entry.size > 1_000_000 and entry.file.endswith(".gguf")
    wheel_counts = {name: len(models._wheel_parts(e.sources[0])) for name, e in reg.items()}
    assert wheel_counts == {
        "qwen2.5-coder-1.5b-instruct": 22,
        "qwen2.5-coder-0.5b-instruct": 6,
        "smollm2-135m-instruct": 1,
        "gemma-3-270m": 4,
    }


def test_user_registry_adds_models(tmp_path, monkeypatch):
    user = tmp_path / "mine.txt"
    user.write_text(section("mine", b"abc", "/srv/mine.gguf"))
    monkeypatch.setenv("LLAMASPEC_MODELS", str(user))
    reg = load_model_list()
    assert "mine" in reg and "smollm2-135m-instruct" in reg
    assert reg["mine"].sources == ("/srv/mine.gguf",)


# ---------------------------------------------------------------- resolve_model and cache_dir


def test_resolve_model(tmp_path, monkeypatch):
    content = data(1000, 7)
    local = tmp_path / "local.gguf"
    local.write_bytes(content)
    reg = listed(tmp_path, section("tiny", content, str(local)))
    monkeypatch.chdir(tmp_path)
    cache = tmp_path / "cache"
    assert resolve_model(str(local), cache=cache, model_list=reg) == local
    assert resolve_model("local.gguf", cache=cache, model_list=reg) == Path("local.gguf")
    assert resolve_model("tiny", cache=cache, progress=False, model_list=reg) == cache / "tiny.gguf"
    with pytest.raises(ModelError, match="model file not found: x.gguf") as info:
        resolve_model("x.gguf", cache=cache, model_list=reg)
    assert not isinstance(info.value, UnknownModelError)
    with pytest.raises(ModelError, match="model file not found: some/dir/model"):
        resolve_model("some/dir/model", cache=cache, model_list=reg)
    with pytest.raises(UnknownModelError, match=r"'nope'.*known models: tiny"):
        resolve_model("nope", cache=cache, model_list=reg)


def test_unknown_name_in_fetch_and_model_path(tmp_path):
    reg = listed(tmp_path, section("tiny", b"x", "/x.gguf"))
    with pytest.raises(UnknownModelError, match="tiny"):
        fetch("other", cache=tmp_path, model_list=reg)
    with pytest.raises(UnknownModelError):
        model_path("other", cache=tmp_path, model_list=reg)
    assert model_path("tiny", cache=tmp_path, model_list=reg) is None


def test_cache_dir_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(models.sys, "platform", "linux")
    assert cache_dir() == tmp_path / "home" / ".cache" / "llamaspec"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "llamaspec"
    monkeypatch.setenv("LLAMASPEC_CACHE", str(tmp_path / "env"))
    assert cache_dir() == tmp_path / "env"
    assert cache_dir(tmp_path / "arg") == tmp_path / "arg"
    assert cache_dir(str(tmp_path / "arg")) == tmp_path / "arg"


def test_cache_dir_platforms(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(models.sys, "platform", "darwin")
    assert cache_dir() == tmp_path / "Library" / "Caches" / "llamaspec"
    monkeypatch.setattr(models.sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "local"))
    assert cache_dir() == tmp_path / "local" / "llamaspec" / "Cache"


# ---------------------------------------------------------------- killed and concurrent fetches

FETCH = """
import sys
from llamaspec.llama.models import fetch, load_model_list
print(fetch("multi", cache=sys.argv[1], progress=False, model_list=load_model_list(sys.argv[2])))
"""


def slow_registry(tmp_path: Path, index: FakeIndex) -> Path:
    publish_parts(index)
    index.chunk, index.delay = 1024, 0.05  # about 20 kB/s: a fetch takes a few seconds
    path = tmp_path / "models.txt"
    path.write_text(section("multi", b"".join(PARTS), MULTI))
    return path


def fetch_process(cache: Path, reg: Path) -> subprocess.Popen:
    env = {**os.environ, "LLAMASPEC_PYPI_INDEX": os.environ["LLAMASPEC_PYPI_INDEX"]}
    return subprocess.Popen([sys.executable, "-c", FETCH, str(cache), str(reg)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_fetch_killed_midway_leaves_nothing_once_the_next_fetch_ran(tmp_path, index):
    reg = slow_registry(tmp_path, index)
    cache = tmp_path / "cache"
    proc = fetch_process(cache, reg)
    deadline = time.monotonic() + 60
    while not leftovers(cache) and time.monotonic() < deadline:  # a temporary file is being written
        time.sleep(0.02)
    assert leftovers(cache), "the fetch never started writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert leftovers(cache)  # kill -9 leaves them behind
    index.delay = 0.0
    path = fetch("multi", cache=cache, progress=False, model_list=load_model_list(reg))
    assert path.read_bytes() == b"".join(PARTS)
    assert leftovers(cache) == []


def test_two_fetches_of_one_model_at_once_download_it_once(tmp_path, index):
    reg = slow_registry(tmp_path, index)
    cache = tmp_path / "cache"
    procs = [fetch_process(cache, reg) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][0] == outs[1][0] == f"{cache / 'multi.gguf'}\n"
    assert len(index.downloads) == len(PARTS)  # each wheel once: the second fetch waited and reused
    assert leftovers(cache) == []
