"""Models from the Hugging Face hub, named as llama.cpp's ``-hf`` names them: ``REPO[:QUANT]``.

    hf://Qwen/Qwen2.5-Coder-7B-Instruct-GGUF:Q4_K_M       the file whose name holds Q4_K_M
    hf://unsloth/SmolLM2-135M-Instruct-GGUF               a repository of one GGUF: no tag needed
    hf://owner/repo/path/in/repo/model-Q8_0.gguf          one file by its name (--hf-file)

A tag picks the file whose name holds it (case-insensitive, as Q4_K_M in model-q4_k_m.gguf,
never Q4_K in Q4_K_M); with none, a repository's one model, else its Q4_K_M, as llama.cpp
chooses. A model split in parts (``-00001-of-00003.gguf``) is fetched whole and loaded from its
first part. Vision projectors (``mmproj``) are never chosen.

Downloads go through huggingface_hub: its cache (``HF_HUB_CACHE``), resumable downloads with
its progress bar, ``HF_TOKEN``, ``HF_HUB_OFFLINE`` and ``HF_ENDPOINT``. A file already in the
cache is used without a network: when the hub cannot be reached, the cache's files of the
repository are chosen from.

The hub is not trusted to behave: every wait on it is bounded (``LLAMASPEC_HUB_TIMEOUT``
seconds a connect or a read may wait) and so is the whole fetch (``LLAMASPEC_HUB_DEADLINE``);
a listing's file names that are not plain paths inside the repository are never chosen; a
downloaded file whose size or sha256 is not the listing's is removed, never loaded. Every
failure is one line that names the hub's address and what it did not do.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, TypeVar
from urllib.parse import urljoin, urlsplit

from ..errors import ConfigError, FetchError, LlamaspecError, ModelError, UnknownModelError, shown

PREFIX = "hf://"
# a hub name (owner or repository) as huggingface_hub checks it: letters, digits, '-', '_', '.',
# 1 to 96 of them, beginning and ending with a letter, a digit or '_'
_NAME = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_REPO = re.compile(rf"^{_NAME}/{_NAME}$")
_TAG = re.compile(r"^[A-Za-z0-9_.-]{1,96}$")
_ODD = re.compile(r"[\x00-\x1f\x7f\\]|^[A-Za-z]:")  # control characters, backslashes, a drive
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# a quantization's name in a file's: Q4_K_M, IQ2_XS, Q8_0, F16, BF16...
_QUANT = re.compile(r"(?<![A-Za-z0-9])((?:I?Q\d+(?:_[A-Z0-9]+)*)|BF16|F16|F32)(?![A-Za-z0-9])", re.IGNORECASE)
DEFAULT_TAG = "Q4_K_M"  # llama.cpp's choice where a repository has several models and no tag is given
MAX_TAGS = 20  # tags a message lists at most

TIMEOUT_VAR = "LLAMASPEC_HUB_TIMEOUT"
DEADLINE_VAR = "LLAMASPEC_HUB_DEADLINE"
DEFAULT_TIMEOUT = 10.0  # seconds: huggingface_hub's own default for a request
DEFAULT_DEADLINE = 6 * 3600.0  # seconds: a big model on a slow line, never forever
MAX_LISTING = 64 << 20  # bytes of a repository's listing, all its pages
MAX_PAGES = 1000
MAX_PART = 255  # characters of a file name's part: what a file system takes
WORKER = "llamaspec-hub"  # the name of the threads that talk to the hub
# huggingface_hub's loggers that report each retry of a request in a thread of ours
_RETRY_LOGGERS = ("huggingface_hub.file_download", "huggingface_hub.utils._http", "huggingface_hub.utils._fixes",
                  "huggingface_hub.utils._shared_blobs")

T = TypeVar("T")


@dataclass(frozen=True)
class HubModel:
    """A model on the hub: its repository and the tag or file name that picks the file."""

    repo: str
    tag: Optional[str] = None
    file: Optional[str] = None

    @staticmethod
    def parse(spec: str) -> "HubModel":
        """``REPO[:QUANT]``, ``REPO/FILE`` or either after ``hf://``; ConfigError otherwise, before
        any network: a name the hub cannot hold is the user's mistake, not the hub's silence."""
        text = spec[len(PREFIX):] if spec.startswith(PREFIX) else spec
        parts = text.split("/")
        if len(parts) > 2:
            repo, file = "/".join(parts[:2]), "/".join(parts[2:])
            if _REPO.match(repo) and file:
                if not plain(file):
                    raise ConfigError(f"a hub file is a plain path inside its repository (no '..', '.' or empty parts, "
                                      f"no backslash, no leading '/'), got {shown(file)}")
                return HubModel(repo, file=file)
        repo, _, tag = text.partition(":")
        if not _REPO.match(repo) or (":" in text and not _TAG.match(tag)):
            raise ConfigError(f"a hub model is OWNER/REPO[:QUANT] (as llama.cpp's -hf takes it: names of letters, "
                              f"digits, '-', '_' and '.', at most 96 each), got {shown(spec)}")
        if "--" in repo or ".." in repo or repo.endswith(".git"):
            raise ConfigError(f"a hub repository's name has no '--' or '..' and does not end in .git, "
                              f"got {shown(repo)}")
        return HubModel(repo, tag or None)

    def spec(self) -> str:
        """Its ``hf://`` form, as a model argument anywhere."""
        return PREFIX + self.repo + (f"/{self.file}" if self.file else f":{self.tag}" if self.tag else "")


def is_hub(spec: str) -> bool:
    return spec.startswith(PREFIX)


def hub_spec(repo: str, file: Optional[str] = None) -> str:
    """The model argument of ``-hf REPO[:QUANT]`` (and ``--hf-file FILE``)."""
    model = HubModel.parse(repo)
    if file:
        if model.tag:
            raise ConfigError("give a tag (-hf REPO:QUANT) or a file (--hf-file), not both")
        model = HubModel.parse(HubModel(model.repo, file=file).spec())
    return model.spec()


def plain(name: str) -> bool:
    """Whether a file name (from a listing, or --hf-file) is a plain relative path inside its
    repository: a name with ``..``, ``.`` or empty parts, a leading ``/``, a backslash, a drive or
    a control character could name a file outside the cache, or another file than it seems."""
    parts = name.split("/")
    return (bool(name) and _ODD.search(name) is None
            and all(p not in ("", ".", "..") and len(p) <= MAX_PART for p in parts))


def resolve(spec: str, progress: bool = True) -> Path:
    """The local path of ``spec``'s model (its first part), fetched where it is not in the cache."""
    model = HubModel.parse(spec)
    limits = Limits.from_env()
    listing, online = _listing(model.repo, limits)
    chosen = choose(model, list(listing))
    paths = [_fetch(model.repo, f, listing[f], progress, online, limits) for f in chosen]
    return paths[0]


def choose(model: HubModel, files: Sequence[str]) -> List[str]:
    """The files of ``model`` among a repository's ``files``: one, or every part of a split one,
    the first part first. ModelError (one line) where there is none or it is not clear which.
    Names that are not plain paths inside the repository are never chosen (see plain)."""
    if model.file is not None:
        if not plain(model.file):
            raise ConfigError(f"a hub file is a plain path inside its repository, got {shown(model.file)}")
        if model.file not in files:
            raise ModelError(f"{model.repo} has no file {model.file}")
        return _parts(model.file, files)
    ggufs = [f for f in files if plain(f) and f.lower().endswith(".gguf") and "mmproj" not in f.lower()]
    models = [f for f in ggufs if _first_part(f)]
    if not models:
        raise ModelError(f"{model.repo} holds no GGUF model")
    if model.tag is None:
        if len(models) == 1:
            return _parts(models[0], files)
        default = [f for f in models if _holds(f, DEFAULT_TAG)]
        if len(default) == 1:
            return _parts(default[0], files)
        raise ModelError(f"{model.repo} has {len(models)} models: give a tag, one of {', '.join(tags(models))}")
    matching = [f for f in models if _holds(f, model.tag)]
    if not matching:
        raise ModelError(f"{model.repo} has no GGUF file for {model.tag}; its tags: {', '.join(tags(models))}")
    if len(matching) > 1:
        raise ModelError(f"{model.repo} has {len(matching)} files for {model.tag} ({', '.join(matching[:3])}); "
                         f"pick one with --hf-file")
    return _parts(matching[0], files)


def tags(files: Sequence[str]) -> List[str]:
    """The quantizations the files' names hold, in order, each once (the first MAX_TAGS, then ...)."""
    found: Dict[str, None] = {}
    for f in files:
        for m in _QUANT.finditer(Path(f).name):
            found[m.group(1).upper()] = None
    listed = list(found) or ["(none)"]
    return listed if len(listed) <= MAX_TAGS else listed[:MAX_TAGS] + ["..."]


def _holds(file: str, tag: str) -> bool:
    name = Path(file).name
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(tag)}(?![A-Za-z0-9_])", name, re.IGNORECASE) is not None


def _first_part(file: str) -> bool:
    """Whether ``file`` is a model's file or its first part (not a later part)."""
    m = _SPLIT.search(file)
    return m is None or int(m.group(1)) == 1


def _parts(file: str, files: Sequence[str]) -> List[str]:
    """``file``, or every part of the split model it is the first part of (ModelError for a missing one)."""
    m = _SPLIT.search(file)
    if m is None:
        return [file]
    count = int(m.group(2))
    stem = file[:m.start()]
    parts = [f"{stem}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    missing = [p for p in parts if p not in files]
    if missing:
        raise ModelError(f"{file} is the first of {count} parts, but {missing[0]} is missing")
    return parts


# --- how long the hub may take ---------------------------------------------------------------

@dataclass
class Limits:
    """How long the hub may take: ``timeout`` seconds for a connect or a read, ``deadline`` seconds
    for the whole fetch (listing and every file), which ends at ``end`` (time.monotonic()).
    ``abandoned`` is set when the fetch gave up on a thread still talking to the hub."""

    timeout: float = DEFAULT_TIMEOUT
    deadline: float = DEFAULT_DEADLINE
    end: float = 0.0
    abandoned: threading.Event = field(default_factory=threading.Event)

    @staticmethod
    def from_env() -> "Limits":
        """From LLAMASPEC_HUB_TIMEOUT and LLAMASPEC_HUB_DEADLINE; the deadline runs from now."""
        timeout = _seconds(TIMEOUT_VAR, DEFAULT_TIMEOUT)
        deadline = _seconds(DEADLINE_VAR, DEFAULT_DEADLINE)
        return Limits(timeout, deadline, time.monotonic() + deadline)

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def over(self) -> bool:
        """Whether a thread talking to the hub should stop: given up on, or past the deadline."""
        return self.abandoned.is_set() or time.monotonic() > self.end


def _seconds(name: str, default: float) -> float:
    """A number of seconds from the environment variable ``name``; ConfigError for anything but a
    finite number above 0 (a wait of 0 or of forever is what the variable exists to prevent)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf):
        raise ConfigError(f"{name} is a number of seconds above 0, got {shown(text)}")
    return value


def _bounded(work: Callable[[], T], limits: Limits, what: str) -> T:
    """``work()``, in a thread of its own that is given up on at the deadline. A hub can hold a
    request open past every timeout (a byte now and then; retries of huggingface_hub that begin
    anew after each cut), and only a thread left behind bounds that. The thread is a daemon, so it
    does not hold up the program's exit; left behind, it stops at its next read or chunk and
    never puts a file in the cache (see _bar). _Unusable where it was given up on."""
    _quiet_retries()
    done: Dict[str, Any] = {}

    def run() -> None:
        try:
            done["value"] = work()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            done["error"] = e

    thread = threading.Thread(target=run, name=WORKER, daemon=True)
    thread.start()
    try:
        thread.join(limits.left())
    finally:
        if thread.is_alive():
            limits.abandoned.set()
    if thread.is_alive() or isinstance(done.get("error"), _Abandoned):
        raise _Unusable(f"the hub at {_endpoint()} did not finish {what} within {limits.deadline:g} s "
                        f"({DEADLINE_VAR} raises it)")
    if "error" in done:
        raise done["error"]
    return done["value"]


class _Unusable(Exception):
    """The hub did not give what was asked: no answer in time, an error status, an answer that is
    not one. For a listing, the local cache is used instead where it holds the repository."""


class _Abandoned(Exception):
    """Raised in a thread the fetch gave up on, to end its download."""


_quieted = False


def _quiet_retries() -> None:
    """Hide huggingface_hub's log of each retry ("Trying to resume download...") in our threads:
    the fetch reports what failed, once, in one line. Its other threads and logs are untouched."""
    global _quieted
    if not _quieted:
        for name in _RETRY_LOGGERS:
            logging.getLogger(name).addFilter(_NotOurs())
        _quieted = True


class _NotOurs(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.threadName.startswith(WORKER)


def _endpoint() -> str:
    from huggingface_hub import constants
    return constants.ENDPOINT.rstrip("/")


# --- the listing: from the hub, or from the local cache --------------------------------------

@dataclass(frozen=True)
class Entry:
    """What a listing says of a file: its size and, for a file in LFS, its sha256 (None where it
    says nothing, or the listing is the local cache's)."""

    size: Optional[int] = None
    sha256: Optional[str] = None


def _listing(repo: str, limits: Limits) -> Tuple[Dict[str, Entry], bool]:
    """The repository's files, and whether the hub answered: from the hub, or, where it cannot
    be reached or gives no listing (offline, no network, no answer in time, an error status, a
    malformed one), from the local cache. A repository the hub says is not there, or gated, is an
    error whatever the cache holds."""
    from huggingface_hub import constants
    if constants.HF_HUB_OFFLINE:
        why = "HF_HUB_OFFLINE is set"
    else:
        try:
            return _bounded(lambda: _hub_listing(repo, limits), limits, f"the listing of {repo}"), True
        except _Unusable as e:
            why = str(e)
    files = {f: Entry() for f, _ in cached(repo)}
    if not files:
        raise FetchError(f"{why}, and the local cache holds nothing of {repo}")
    return files, False


def _hub_listing(repo: str, limits: Limits) -> Dict[str, Entry]:
    """The hub's listing of the repository's files (``/api/models/REPO/tree/main``, every page)."""
    endpoint = _endpoint()
    url: Optional[str] = f"{endpoint}/api/models/{repo}/tree/main?recursive=true&expand=false"
    entries: Dict[str, Entry] = {}
    read = 0
    for _ in range(MAX_PAGES):
        assert url is not None
        body, url = _page(url, repo, limits, MAX_LISTING - read)
        read += len(body)
        entries.update(_entries(body, repo))
        if url is None:
            return entries
    raise _Unusable(f"the hub at {endpoint} sent a listing of {repo} of more than {MAX_PAGES} pages")


def _page(url: str, repo: str, limits: Limits, most: int) -> Tuple[bytes, Optional[str]]:
    """One page of a listing, at most ``most`` bytes, and the address of the next page (None at
    the last). Whatever the hub does wrong is _Unusable (or, for no such repository, an error)."""
    what = f"the listing of {repo}"
    try:
        with _get(url, limits.timeout) as (response, chunks):
            _check_status(response, repo)
            body = bytearray()
            for chunk in chunks:
                body += chunk
                if len(body) > most:
                    raise _Unusable(f"the hub at {_endpoint()} sent a listing of {repo} over {MAX_LISTING / 2**20:g} MiB")
                if limits.over():
                    raise _Abandoned()
            return bytes(body), _next_page(response, url, repo)
    except (LlamaspecError, _Unusable, _Abandoned):
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the transport (its types differ by version)
        raise _Unusable(_transport_problem(e, what, limits)) from None


@contextmanager
def _get(url: str, timeout: float) -> Iterator[Tuple[Any, Iterator[bytes]]]:
    """A streamed GET through huggingface_hub's session (its proxies, its certificates) with our
    headers and timeout: its response and its body's chunks."""
    from huggingface_hub import get_session
    from huggingface_hub.utils import build_hf_headers
    session, headers = get_session(), build_hf_headers()
    if hasattr(session, "stream"):  # httpx: huggingface_hub 1.0 and later
        with session.stream("GET", url, headers=headers, timeout=timeout) as response:
            yield response, response.iter_bytes(1 << 16)
    else:  # requests: before
        with session.get(url, headers=headers, timeout=timeout, stream=True) as response:
            yield response, response.iter_content(1 << 16)


def _check_status(response: Any, repo: str) -> None:
    """Nothing for a success; else what the hub's error status means (as huggingface_hub reads it:
    401 and 404 for a repository that is not there, or private; a GatedRepo code for a gated one)."""
    status = response.status_code
    if status < 400:
        return
    if response.headers.get("X-Error-Code") == "GatedRepo":
        raise FetchError(f"{repo} is gated on the hub: accept its terms there and set HF_TOKEN")
    if status in (401, 404):
        raise UnknownModelError(f"no repository {repo} on the hub at {_endpoint()} (a private one needs HF_TOKEN)")
    raise _Unusable(f"the hub at {_endpoint()} answered {status} to the listing of {repo}")


def _next_page(response: Any, url: str, repo: str) -> Optional[str]:
    """The next page's address, where there is one; only on the hub's own host, which our
    token may be sent to."""
    link = response.links.get("next", {}).get("url")
    if link is None:
        return None
    target = urljoin(url, link)
    if urlsplit(target)[:2] != urlsplit(url)[:2]:
        raise _Unusable(f"the hub at {_endpoint()} sent the listing of {repo} on to another host")
    return target


def _entries(body: bytes, repo: str) -> Dict[str, Entry]:
    """The files of one page of a listing: a JSON list of objects with ``type``, ``path``, ``size``
    and, for a file in LFS, ``lfs.oid`` (its sha256). _Unusable for anything else."""
    not_one = f"the hub at {_endpoint()} sent a listing of {repo} that is not one"
    try:
        items = json.loads(body)
    except ValueError:
        raise _Unusable(f"{not_one} (not JSON)") from None
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise _Unusable(f"{not_one} (not a list of files)")
    entries: Dict[str, Entry] = {}
    for item in items:
        if item.get("type") != "file":
            continue
        path = item.get("path")
        if not isinstance(path, str):
            raise _Unusable(f"{not_one} (a file without a path)")
        entries[path] = Entry(_size(item.get("size")), _sha256_of(item.get("lfs")))
    return entries


def _size(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _sha256_of(lfs: Any) -> Optional[str]:
    oid = lfs.get("oid") if isinstance(lfs, dict) else None
    return oid.lower() if isinstance(oid, str) and re.fullmatch(r"[0-9a-fA-F]{64}", oid) else None


# --- a file: from the hub, checked, or from the local cache ----------------------------------

def _fetch(repo: str, file: str, entry: Entry, progress: bool, online: bool, limits: Limits) -> Path:
    """The local path of one file of the repository: from the cache with no network where the
    listing was the cache's; else fetched within the deadline, then checked against the listing."""
    if not online:
        return _download(repo, file, progress, limits, online=False)
    started = time.time()
    before = _partials(repo)
    try:
        path = _bounded(lambda: _download(repo, file, progress, limits, online=True), limits,
                        f"sending {repo}/{file}")
    except _Unusable as e:
        raise FetchError(str(e)) from None
    finally:
        if limits.abandoned.is_set():
            _drop_partials(repo, before)
    return _checked(repo, file, path, entry) if _newer(path, started) else path


def _download(repo: str, file: str, progress: bool, limits: Limits, online: bool) -> Path:
    """hf_hub_download with our timeouts, and a progress bar that ends it when given up on. The
    file's metadata is asked for first, once, within the timeout (huggingface_hub retries its own
    request for minutes): where the hub does not give it, the cache's file is used, if it has one.
    One-line errors."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
    endpoint = _endpoint()
    try:
        if online:
            constants.HF_HUB_DOWNLOAD_TIMEOUT = limits.timeout  # read by huggingface_hub at each download
            try:
                get_hf_file_metadata(hf_hub_url(repo, file, endpoint=endpoint), timeout=limits.timeout)
            except Exception:
                cached_path = _in_cache(repo, file)
                if cached_path is None:
                    raise
                return cached_path
        return Path(hf_hub_download(repo, file, local_files_only=not online, endpoint=endpoint,
                                    etag_timeout=limits.timeout, tqdm_class=_bar(progress, limits)))
    except Exception as e:  # noqa: BLE001 - every failure, whatever its type, is one line
        raise _download_error(e, repo, file, limits) from None


def _in_cache(repo: str, file: str) -> Optional[Path]:
    from huggingface_hub import hf_hub_download
    try:
        return Path(hf_hub_download(repo, file, local_files_only=True, endpoint=_endpoint()))
    except Exception:  # noqa: BLE001 - not there (or not readable): the hub's failure is the one to report
        return None


def _download_error(e: BaseException, repo: str, file: str, limits: Limits) -> BaseException:
    """The one-line error of a failed download (an _Abandoned one stays: nobody waits for it)."""
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError
    where, endpoint = f"{repo}/{file}", _endpoint()
    if isinstance(e, (LlamaspecError, _Abandoned)):
        return e
    if isinstance(e, GatedRepoError):
        return FetchError(f"{repo} is gated on the hub: accept its terms there and set HF_TOKEN")
    if isinstance(e, RepositoryNotFoundError):
        return UnknownModelError(f"no repository {repo} on the hub at {endpoint} (a private one needs HF_TOKEN)")
    if isinstance(e, HfHubHTTPError) and getattr(e, "response", None) is not None:
        return FetchError(f"the hub at {endpoint} answered {e.response.status_code} to the download of {where}")
    if isinstance(e, LocalEntryNotFoundError):
        if e.__cause__ is not None:
            return _download_error(e.__cause__, repo, file, limits)
        return FetchError(f"{where} is not in the local cache and the hub cannot be reached")
    if _is_timeout(e) or _is_connect(e):
        return FetchError(_transport_problem(e, f"the download of {where}", limits))
    return FetchError(f"downloading {where} from the hub at {endpoint} failed ({type(e).__name__}: {_first_line(e)})")


def _transport_problem(e: BaseException, what: str, limits: Limits) -> str:
    """What a failed request says: no answer in time, no connection, or what else went wrong."""
    endpoint = _endpoint()
    if _is_timeout(e):
        return f"the hub at {endpoint} did not answer {what} within {limits.timeout:g} s ({TIMEOUT_VAR} raises it)"
    if _is_connect(e):
        return f"the hub at {endpoint} cannot be reached ({type(e).__name__})"
    return f"the hub at {endpoint} failed {what} ({type(e).__name__}: {_first_line(e)})"


def _is_timeout(e: BaseException) -> bool:
    """A timeout, of httpx, requests or the socket (their classes all say so in their names)."""
    return any("Timeout" in c.__name__ for c in type(e).__mro__)


def _is_connect(e: BaseException) -> bool:
    """No connection (refused, no such host), of httpx, requests or the socket."""
    return any(c.__name__ in ("ConnectError", "ConnectionError", "ConnectionRefusedError") for c in type(e).__mro__)


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    line = lines[0] if lines else "no detail"
    return line if len(line) <= 200 else line[:197] + "..."


def _bar(progress: bool, limits: Limits) -> type:
    """The progress bar class huggingface_hub's download reports to, which also ends a download
    given up on (the deadline passed, or the waiting thread gave up): at its next chunk, and at
    its end, before huggingface_hub moves the file into the cache, so that a file nobody checks
    never gets there."""
    from huggingface_hub.utils import tqdm
    base: type = tqdm if progress else _Quiet

    class Bar(base):  # type: ignore[valid-type, misc]
        def update(self, n: float = 1) -> Any:
            if limits.over():
                raise _Abandoned()
            return super().update(n)

        def close(self) -> None:
            super().close()
            if limits.over() and not getattr(self, "_ended", False):
                self._ended = True
                raise _Abandoned()

    return Bar


def _partials(repo: str) -> Set[Path]:
    """The partial downloads (``.incomplete``) in the cache's blobs of the repository."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name
    blobs = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model") / "blobs"
    try:
        return set(blobs.glob("*.incomplete"))
    except OSError:
        return set()


def _drop_partials(repo: str, before: Set[Path]) -> None:
    """Remove the partial downloads a thread given up on began: it may never end them itself
    (the program exits first), and no later run resumes them (huggingface_hub names each anew)."""
    for path in _partials(repo) - before:
        try:
            path.unlink()
        except OSError:
            pass


def _newer(path: Path, started: float) -> bool:
    """Whether the file was written by this fetch (not a file the cache held already, checked
    when it was fetched): a downloaded file keeps the time of its last write."""
    try:
        return path.resolve().stat().st_mtime >= started - 2  # file systems keep times to 2 s at worst
    except OSError:
        return True


def _checked(repo: str, file: str, path: Path, entry: Entry) -> Path:
    """``path``, a file just fetched, where its size and sha256 are the listing's (where it gives
    them); else it is removed (never to be loaded) and FetchError says why. A check cut short
    (Ctrl-C) removes the file too: a file in the cache is one that was checked."""
    where = f"the hub at {_endpoint()} sent {repo}/{file}"
    size = path.stat().st_size
    if entry.size is not None and size != entry.size:
        _discard(path)
        raise FetchError(f"{where} of {size} bytes, where its listing says {entry.size}; it was not kept")
    if entry.sha256 is not None:
        try:
            digest = _sha256(path)
        except BaseException:
            _discard(path)
            raise
        if digest != entry.sha256:
            _discard(path)
            raise FetchError(f"{where} with sha256 {digest[:12]}..., where its listing says {entry.sha256[:12]}...; "
                             f"it was not kept")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _discard(path: Path) -> None:
    """Remove a cached file: its snapshot's link and the blob it points to."""
    blob = path.resolve()
    for p in (path, blob):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def cached(repo: Optional[str] = None) -> List[Tuple[str, Path]]:
    """The GGUF files in the hub's local cache, (file in its repository, path), of ``repo`` or of
    every repository, as ``(repo/file, path)``."""
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound  # type: ignore[attr-defined]
    try:
        info = scan_cache_dir(constants.HF_HUB_CACHE)  # where hf_hub_download puts them
    except (CacheNotFound, OSError, ValueError):  # no cache yet, or one that is not a directory or cannot be read
        return []
    out: Dict[str, Path] = {}
    for r in info.repos:
        if r.repo_type != "model" or (repo is not None and r.repo_id != repo):
            continue
        for revision in sorted(r.revisions, key=lambda v: v.last_modified):  # the newest last
            for f in revision.files:
                if f.file_name.lower().endswith(".gguf"):
                    name = str(f.file_path.relative_to(revision.snapshot_path))
                    out[name if repo is not None else f"{r.repo_id}/{name}"] = f.file_path
    return sorted(out.items())


class _Quiet:  # a tqdm that shows nothing (progress=False)
    def __init__(self, *args: object, **kwargs: object) -> None:
        self.n = 0

    def update(self, n: float = 1) -> None:
        self.n += n

    def __enter__(self) -> "_Quiet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass
