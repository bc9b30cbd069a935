"""The model list (models.txt) and fetching models into the local cache.

A model is fetched once: its bytes are assembled from the first source in models.txt that
works, checked against the model list's size and sha256, and moved into the cache directory
atomically. Later calls find the verified file and use no network.
"""

from __future__ import annotations

import configparser
import contextlib
import functools
import glob
import hashlib
import html
import os
import re
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import BinaryIO, Dict, Iterator, List, Optional, Tuple, Union

from tqdm import tqdm

from ..errors import ConfigError, FetchError, ModelError, UnknownModelError
from . import hub

DEFAULT_PYPI_INDEX = "https://pypi.org/simple"
_DEFAULTS = "defaults"  # the model list's section naming the default pair
_KEYS = frozenset({"file", "size", "sha256", "license", "notes", "sources"})
_CHUNK = 1 << 20
_TEMP = ".tmp"  # every temporary file of a fetch of FILE is FILE.*.tmp
_TIMEOUT = 60  # seconds without data before a download is given up
_USER_AGENT = "llamaspec-model-fetch"

PathLike = Union[str, Path]


@dataclass(frozen=True)
class ModelEntry:
    """One model of the model list: where its bytes come from and what they must hash to."""

    name: str
    file: str
    size: int
    sha256: str
    sources: Tuple[str, ...]
    notes: str = ""
    license: str = ""


# ---------------------------------------------------------------- model list


def load_model_list(path: Optional[PathLike] = None) -> Dict[str, ModelEntry]:
    """Read the model list.

    With ``path``, only that file. Otherwise the packaged models.txt, then the file named by
    ``$LLAMASPEC_MODELS`` if set (its models are added and override same-named ones).
    Raises ConfigError, with one line naming the file, if a model list is malformed.
    """
    entries: Dict[str, ModelEntry] = {}
    for parser, label in _model_list_files(path):
        for name in parser.sections():
            if name != _DEFAULTS:
                entries[name] = _entry(name, parser[name], label)
    return entries


def default_pair(path: Optional[PathLike] = None) -> Tuple[str, str]:
    """The (target, draft) model names of the model list's ``[defaults]`` section."""
    target = draft = ""
    for parser, _ in _model_list_files(path):
        if parser.has_section(_DEFAULTS):
            target = parser[_DEFAULTS].get("target", target).strip()
            draft = parser[_DEFAULTS].get("draft", draft).strip()
    if not target or not draft:
        raise ConfigError("the model list has no [defaults] section with 'target' and 'draft'")
    known = load_model_list(path)
    for name in (target, draft):
        if name not in known:
            raise ConfigError(f"the model list's default model {name!r} is not in the list")
    return target, draft


def _model_list_files(path: Optional[PathLike]) -> List[Tuple[configparser.ConfigParser, str]]:
    if path is not None:
        return [_parse(_read_text(Path(path)), str(path))]
    files = [_packaged_model_list()]
    user = os.environ.get("LLAMASPEC_MODELS")
    if user:
        files.append(_parse(_read_text(Path(user).expanduser()), user))
    return files


def _packaged_model_list() -> Tuple[configparser.ConfigParser, str]:
    """The wheel's llamaspec/models.txt; in a source checkout or editable install, the repository's."""
    packaged = resources.files("llamaspec").joinpath("models.txt")
    if packaged.is_file():
        return _parse(packaged.read_text(encoding="utf-8"), "llamaspec/models.txt")
    checkout = Path(__file__).resolve().parents[2] / "models.txt"
    return _parse(_read_text(checkout), str(checkout))


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read model list {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"model list {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                          f"{exc.start})") from None


def _parse(text: str, label: str) -> Tuple[configparser.ConfigParser, str]:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text, source=label)
    except configparser.Error as exc:
        raise ConfigError(f"malformed model list {label}: {' '.join(str(exc).split())}") from None
    return parser, label


def _entry(name: str, section: configparser.SectionProxy, label: str) -> ModelEntry:
    def bad(message: str) -> ConfigError:
        return ConfigError(f"model list {label}, [{name}]: {message}")

    unknown = sorted(set(section) - _KEYS)
    if unknown:
        raise bad(f"unknown key {unknown[0]!r}")
    file = section.get("file", "").strip()
    if not file or "/" in file or "\\" in file:
        raise bad("'file' must be a plain file name")
    try:
        size = int(section.get("size", ""))
    except ValueError:
        raise bad("'size' must be a whole number of bytes") from None
    sha256 = section.get("sha256", "").strip().lower()
    if size <= 0 or not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise bad("needs 'size' > 0 and 'sha256' of 64 hex digits")
    sources = tuple(line.strip() for line in section.get("sources", "").splitlines() if line.strip())
    if not sources:
        raise bad("no 'sources'")
    for source in sources:
        try:
            _check_source(source)
        except ConfigError as exc:
            raise bad(str(exc)) from None
    notes, license_ = section.get("notes", "").strip(), section.get("license", "").strip()
    return ModelEntry(name, file, size, sha256, sources, notes, license_)


# ---------------------------------------------------------------- sources


def _check_source(source: str) -> None:
    """Raise ConfigError if ``source`` is not a valid source line."""
    if source.split()[0] == "pypi":
        _wheel_parts(source)
    elif not _is_url(source):
        _local_path(source)


def _is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def _wheel_parts(source: str) -> List[Tuple[str, str, str]]:
    """Expand ``pypi NAME==VERSION MEMBER [VAR=A..B ...]`` to (name, version, member) triples."""
    words = source.split()
    if len(words) < 3:
        raise ConfigError(f"bad source {source!r}: expected 'pypi NAME==VERSION MEMBER [VAR=A..B ...]'")
    parts = []
    for values in _ranges(words[3:], source):
        try:
            requirement, member = words[1].format(**values), words[2].format(**values)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"bad template in {source!r}: {exc!r}") from None
        name, _, version = requirement.partition("==")
        if not name or not version:
            raise ConfigError(f"bad source {source!r}: expected NAME==VERSION, got {requirement!r}")
        parts.append((name, version, member))
    return parts


def _ranges(specs: List[str], source: str) -> List[Dict[str, int]]:
    """``["N=1..3", "M=0..2"]`` -> ``[{N: 1, M: 0}, {N: 2, M: 1}, {N: 3, M: 2}]``."""
    columns: Dict[str, range] = {}
    for spec in specs:
        match = re.fullmatch(r"([A-Za-z_]\w*)=(\d+)\.\.(\d+)", spec)
        if not match or int(match[3]) < int(match[2]):
            raise ConfigError(f"bad range {spec!r} in {source!r}: expected VAR=A..B with A <= B")
        columns[match[1]] = range(int(match[2]), int(match[3]) + 1)
    if len({len(r) for r in columns.values()}) > 1:
        raise ConfigError(f"the ranges in {source!r} differ in length")
    return [dict(zip(columns, values)) for values in zip(*columns.values())] if columns else [{}]


def _local_path(source: str) -> Path:
    if source.startswith("file://"):
        return Path(urllib.request.url2pathname(urllib.parse.urlparse(source).path))
    if source.startswith("file:"):
        return Path(source[len("file:") :]).expanduser()
    path = Path(source).expanduser()
    if not path.is_absolute():
        raise ConfigError(f"unknown source {source!r}: expected 'pypi ...', a URL or an absolute path")
    return path


# ---------------------------------------------------------------- cache


def cache_dir(override: Optional[PathLike] = None) -> Path:
    """Where models are kept: ``override``, else ``$LLAMASPEC_CACHE``, else the platform's cache."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get("LLAMASPEC_CACHE")
    if env:
        return Path(env).expanduser()
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        return (Path(local) if local else Path.home() / "AppData" / "Local") / "llamaspec" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "llamaspec"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache") / "llamaspec"


def model_path(
    name: str, cache: Optional[PathLike] = None, model_list: Optional[Dict[str, ModelEntry]] = None
) -> Optional[Path]:
    """The verified cached file of model ``name``, or None if it is not fetched. No network."""
    entry = _lookup(name, model_list)
    path = cache_dir(cache) / entry.file
    return path if _is_verified(path, entry) else None


def file_name(spec: str, model_list: Optional[Dict[str, ModelEntry]] = None) -> Optional[str]:
    """The file name a model argument names, where that is known without fetching anything: an
    existing file's, a listed model's; None for anything else."""
    if hub.is_hub(spec):
        return None
    path = Path(spec).expanduser()
    if path.is_file():
        return path.name
    known = load_model_list() if model_list is None else model_list
    return known[spec].file if spec in known else None


def _lookup(name: str, model_list: Optional[Dict[str, ModelEntry]]) -> ModelEntry:
    known = load_model_list() if model_list is None else model_list
    if name not in known:
        raise _unknown(name, known)
    return known[name]


def _unknown(name: str, known: Dict[str, ModelEntry]) -> UnknownModelError:
    return UnknownModelError(f"unknown model {name!r}; known models: {', '.join(sorted(known)) or 'none'}")


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp(path: Path, entry: ModelEntry) -> str:
    return f"{entry.sha256} {entry.size} {path.stat().st_mtime_ns}"


def _is_verified(path: Path, entry: ModelEntry) -> bool:
    """Size and sha256 match; the hash is skipped when the sidecar vouches for this size and mtime."""
    if not path.is_file() or path.stat().st_size != entry.size:
        return False
    try:
        if _sidecar(path).read_text().strip() == _stamp(path, entry):
            return True
    except OSError:
        pass
    if _sha256_file(path) != entry.sha256:
        return False
    _write_sidecar(path, entry)
    return True


def sha256(path: Path) -> str:
    """A file's sha256: its sidecar's where that vouches for the file's size and mtime (a fetched
    model, verified once), else computed (once per process for a file left as it is)."""
    st = path.stat()
    try:
        digest, size, mtime = _sidecar(path).read_text().split()
        if int(size) == st.st_size and int(mtime) == st.st_mtime_ns:
            return digest
    except (OSError, ValueError):
        pass
    return _sha256_cached(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    return _sha256_file(Path(path))


def _write_sidecar(path: Path, entry: ModelEntry) -> None:
    try:
        _sidecar(path).write_text(_stamp(path, entry) + "\n")
    except OSError:
        pass  # a read-only cache still works; it is just re-hashed next time


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------- fetching


def fetch(
    name: str,
    cache: Optional[PathLike] = None,
    progress: bool = True,
    model_list: Optional[Dict[str, ModelEntry]] = None,
) -> Path:
    """Return the verified cached file of model ``name``, downloading it first if needed.

    Sources are tried in the list's order. Raises UnknownModelError for a name not in the
    model list and FetchError, naming the last reason, if no source gives the right bytes.
    """
    entry = _lookup(name, model_list)
    directory = cache_dir(cache)
    final = directory / entry.file
    if _is_verified(final, entry):
        return final
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FetchError(f"cannot create the cache directory {directory}: {exc.strerror or exc}; point "
                         f"LLAMASPEC_CACHE or --cache-dir at a writable directory") from None
    with _locked(directory / f"{entry.file}.lock"):  # a second fetch of this model waits, then reuses
        if _is_verified(final, entry):
            return final
        for stale in directory.glob(f"{glob.escape(entry.file)}.*{_TEMP}"):  # an earlier fetch was killed
            stale.unlink(missing_ok=True)
        return _fetch_locked(name, entry, final, progress)


def _fetch_locked(name: str, entry: ModelEntry, final: Path, progress: bool) -> Path:
    index = os.environ.get("LLAMASPEC_PYPI_INDEX") or DEFAULT_PYPI_INDEX
    reason = "no sources"
    bar_options = dict(unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr)
    with tqdm(total=entry.size, desc=name, disable=not progress, **bar_options) as bar:
        for source in entry.sources:
            bar.reset(total=entry.size)
            try:
                _fetch_source(entry, source, final, index, bar)
                return final
            except (FetchError, OSError, zipfile.BadZipFile, zlib.error, EOFError) as exc:
                reason = " ".join(str(exc).split()) or type(exc).__name__
    raise FetchError(f"could not fetch model {name}: {reason}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) while inside: other processes
    wait. The operating system releases it when the holder dies, even by kill -9. FetchError when
    it cannot be created (a read-only cache)."""
    try:
        lock = open(path, "a+b")
    except OSError as exc:
        raise FetchError(f"cannot write to the model cache {path.parent}: {exc.strerror or exc}; point "
                         f"LLAMASPEC_CACHE or --cache-dir at a writable directory") from None
    with lock as f:
        if sys.platform == "win32":  # pragma: no cover
            import msvcrt
            while True:
                try:
                    msvcrt.locking(f.fileno(), msvcrt.LK_LOCK, 1)
                    break
                except OSError:
                    continue
        else:
            import fcntl
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield


def _fetch_source(entry: ModelEntry, source: str, final: Path, index: str, bar: tqdm) -> None:
    """Assemble ``source`` into a temporary ``.partial`` file, verify it, move it to ``final``."""
    fd, name = tempfile.mkstemp(dir=final.parent, prefix=final.name + ".", suffix=".partial" + _TEMP)
    partial = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            sink = _Sink(out, entry.size, bar)
            _write_source(source, sink, index, final.parent, final.name + ".")
            out.flush()
            os.fsync(out.fileno())
        if sink.written != entry.size:
            raise FetchError(f"got {sink.written} bytes, expected {entry.size}")
        if sink.digest.hexdigest() != entry.sha256:
            raise FetchError(f"the assembled file has sha256 {sink.digest.hexdigest()}, expected {entry.sha256}")
        os.chmod(partial, 0o644)
        _sidecar(final).unlink(missing_ok=True)
        os.replace(partial, final)
        _write_sidecar(final, entry)
    finally:
        partial.unlink(missing_ok=True)


class _Sink:
    """The model file being written: counts and hashes its bytes and drives the progress bar."""

    def __init__(self, out: BinaryIO, limit: int, bar: tqdm) -> None:
        self.out, self.limit, self.bar = out, limit, bar
        self.digest = hashlib.sha256()
        self.written = 0

    def copy(self, stream: BinaryIO, show: bool = True) -> None:
        """Append all of ``stream``; advance the bar unless ``show`` is False."""
        for chunk in iter(lambda: stream.read(_CHUNK), b""):
            self.written += len(chunk)
            if self.written > self.limit:
                raise FetchError(f"the source gives more than the expected {self.limit} bytes")
            self.out.write(chunk)
            self.digest.update(chunk)
            if show:
                self.bar.update(len(chunk))

    def advance(self, n: int) -> None:
        """Show ``n`` bytes downloaded that will be written later (never past the total)."""
        self.bar.update(max(0, min(n, self.limit - self.bar.n)))

    def sync(self) -> None:
        """Make the bar show exactly the bytes written."""
        self.bar.n = self.written
        self.bar.refresh()


def _write_source(source: str, sink: _Sink, index: str, directory: Path, prefix: str) -> None:
    """Write the bytes of ``source`` to ``sink``; downloads go to temporary files named ``prefix``...``_TEMP``."""
    if source.split()[0] == "pypi":
        for name, version, member in _wheel_parts(source):
            _write_wheel_member(name, version, member, index, sink, directory, prefix)
    elif _is_url(source):
        with _open_url(source) as response:
            sink.copy(response)
    else:
        with open(_local_path(source), "rb") as f:
            sink.copy(f)


def _write_wheel_member(name: str, version: str, member: str, index: str, sink: _Sink, directory: Path,
                        prefix: str) -> None:
    wheel = _download_wheel(name, version, index, sink, directory, prefix)
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                stream = archive.open(member)
            except KeyError:
                raise FetchError(f"wheel {name}=={version} has no member {member}") from None
            with stream:
                sink.copy(stream, show=False)
    except zipfile.BadZipFile as exc:
        raise FetchError(f"wheel {name}=={version} is damaged: {exc}") from None
    finally:
        wheel.unlink(missing_ok=True)
    sink.sync()


def _download_wheel(name: str, version: str, index: str, sink: _Sink, directory: Path, prefix: str) -> Path:
    """Download the wheel to a temporary file in ``directory``, checked against the index's sha256."""
    url, expected = _find_wheel(index, name, version)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=".whl" + _TEMP)
    path = Path(tmp)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, _open_url(url) as response:
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                out.write(chunk)
                digest.update(chunk)
                sink.advance(len(chunk))
        if expected and digest.hexdigest() != expected:
            raise FetchError(f"wheel {name}=={version} has sha256 {digest.hexdigest()}, the index says {expected}")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def _find_wheel(index: str, name: str, version: str) -> Tuple[str, str]:
    """(URL, sha256 or "") of a wheel of ``name==version`` listed on a PEP 503 simple index."""
    page = f"{index.rstrip('/')}/{_normalize(name)}/"
    with _open_url(page) as response:
        text = response.read().decode("utf-8", "replace")
    for href in re.findall(r"<a\s[^>]*?href=\"([^\"]*)\"", text, re.IGNORECASE):
        url, _, fragment = urllib.parse.urljoin(page, html.unescape(href)).partition("#")
        filename = urllib.parse.unquote(urllib.parse.urlparse(url).path.rsplit("/", 1)[-1])
        words = filename[: -len(".whl")].split("-") if filename.endswith(".whl") else []
        if len(words) >= 5 and _normalize(words[0]) == _normalize(name) and words[1] == version:
            return url, fragment[len("sha256=") :].lower() if fragment.startswith("sha256=") else ""
    raise FetchError(f"no wheel of {name}=={version} on {page}")


def _normalize(name: str) -> str:
    """PEP 503 project-name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _open_url(url: str) -> BinaryIO:
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    try:
        return urllib.request.urlopen(request, timeout=_TIMEOUT)
    except urllib.error.HTTPError as exc:
        raise FetchError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise FetchError(f"{url}: {getattr(exc, 'reason', exc)}") from None


# ---------------------------------------------------------------- names and paths


def resolve_model(
    spec: str,
    cache: Optional[PathLike] = None,
    progress: bool = True,
    model_list: Optional[Dict[str, ModelEntry]] = None,
) -> Path:
    """Turn a model argument into a file: an existing path as is, a listed name fetched, a
    Hugging Face hub model (``hf://OWNER/REPO[:QUANT]``, see hub.py) fetched into the hub's cache.

    Raises ModelError for a path that does not exist and UnknownModelError, listing the
    known names, for anything else.
    """
    if hub.is_hub(spec):
        return hub.resolve(spec, progress)
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    known = load_model_list() if model_list is None else model_list
    if spec in known:
        return fetch(spec, cache=cache, progress=progress, model_list=known)
    separators = {"/", os.sep, os.altsep or "/"}
    if any(s in spec for s in separators) or spec.lower().endswith(".gguf"):
        raise ModelError(f"model file not found: {spec}")
    raise _unknown(spec, known)
