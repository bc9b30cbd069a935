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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import ConfigError, FetchError, ModelError, UnknownModelError

PREFIX = "hf://"
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# a quantization's name in a file's: Q4_K_M, IQ2_XS, Q8_0, F16, BF16...
_QUANT = re.compile(r"(?<![A-Za-z0-9])((?:I?Q\d+(?:_[A-Z0-9]+)*)|BF16|F16|F32)(?![A-Za-z0-9])", re.IGNORECASE)
PROBE_TIMEOUT = 5.0  # seconds the hub has to answer at all before its cache is used
DEFAULT_TAG = "Q4_K_M"  # llama.cpp's choice where a repository has several models and no tag is given


@dataclass(frozen=True)
class HubModel:
    """A model on the hub: its repository and the tag or file name that picks the file."""

    repo: str
    tag: Optional[str] = None
    file: Optional[str] = None

    @staticmethod
    def parse(spec: str) -> "HubModel":
        """``REPO[:QUANT]``, ``REPO/FILE`` or either after ``hf://``; ConfigError otherwise."""
        text = spec[len(PREFIX):] if spec.startswith(PREFIX) else spec
        parts = text.split("/")
        if len(parts) > 2:
            repo, file = "/".join(parts[:2]), "/".join(parts[2:])
            if _REPO.match(repo) and file:
                return HubModel(repo, file=file)
        repo, _, tag = text.partition(":")
        if not _REPO.match(repo) or (":" in text and not tag):
            raise ConfigError(f"a hub model is OWNER/REPO[:QUANT] (as llama.cpp's -hf takes it), got {spec!r}")
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
        model = HubModel(model.repo, file=file)
    return model.spec()


def resolve(spec: str, progress: bool = True) -> Path:
    """The local path of ``spec``'s model (its first part), fetched where it is not in the cache."""
    model = HubModel.parse(spec)
    files, online = _listing(model.repo)
    chosen = choose(model, files)
    paths = [_download(model.repo, f, progress, online) for f in chosen]
    return paths[0]


def choose(model: HubModel, files: Sequence[str]) -> List[str]:
    """The files of ``model`` among a repository's ``files``: one, or every part of a split one,
    the first part first. ModelError (one line) where there is none or it is not clear which."""
    if model.file is not None:
        if model.file not in files:
            raise ModelError(f"{model.repo} has no file {model.file}")
        return _parts(model.file, files)
    ggufs = [f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower()]
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
    """The quantizations the files' names hold, in order, each once."""
    found: Dict[str, None] = {}
    for f in files:
        for m in _QUANT.finditer(Path(f).name):
            found[m.group(1).upper()] = None
    return list(found) or ["(none)"]


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


# --- the hub, or its local cache -------------------------------------------------------------

def _listing(repo: str) -> Tuple[List[str], bool]:
    """The repository's files, and whether the hub answered: from the hub, or, where it cannot
    be reached (offline, no network), from the local cache."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled,
                                        RepositoryNotFoundError)
    try:
        _reachable()
        return HfApi().list_repo_files(repo), True
    except GatedRepoError:
        raise FetchError(f"{repo} is gated on the hub: accept its terms there and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise UnknownModelError(f"no repository {repo} on the hub (a private one needs HF_TOKEN)") from None
    except OfflineModeIsEnabled:
        why = "HF_HUB_OFFLINE is set"
    except HfHubHTTPError as e:
        why = f"the hub answered {e.response.status_code}" if getattr(e, "response", None) is not None else str(e)
    except Exception as e:  # noqa: BLE001 - no network: the cache may still hold it
        why = f"the hub cannot be reached ({type(e).__name__})"
    files = [f for f, _ in cached(repo)]
    if not files:
        raise FetchError(f"{why}, and the local cache holds nothing of {repo}")
    return files, False


def _reachable() -> None:
    """Raise at once where the hub cannot be reached (no network, refused, no name): one request
    without retries, so that a machine offline uses its cache without waiting out the listing's
    retries (about 25 s). Nothing where HF_HUB_OFFLINE is set: the listing refuses at once."""
    from huggingface_hub import constants, get_session
    if not constants.HF_HUB_OFFLINE:
        get_session().head(constants.ENDPOINT, timeout=PROBE_TIMEOUT)


def _download(repo: str, file: str, progress: bool, online: bool) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError
    try:
        return Path(hf_hub_download(repo, file, local_files_only=not online,
                                    tqdm_class=None if progress else _Quiet))
    except (LocalEntryNotFoundError, EntryNotFoundError):
        raise FetchError(f"{repo}/{file} is not in the local cache and the hub cannot be reached") from None
    except HfHubHTTPError as e:
        raise FetchError(f"downloading {repo}/{file} failed: {str(e).splitlines()[0]}") from None
    except OSError as e:
        raise FetchError(f"downloading {repo}/{file} failed: {e.strerror or e}") from None


def cached(repo: Optional[str] = None) -> List[Tuple[str, Path]]:
    """The GGUF files in the hub's local cache, (file in its repository, path), of ``repo`` or of
    every repository, as ``(repo/file, path)``."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound  # type: ignore[attr-defined]
    try:
        info = scan_cache_dir()
    except (CacheNotFound, OSError):  # no cache yet, or one that cannot be read
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

    def update(self, n: int = 1) -> None:
        self.n += n

    def __enter__(self) -> "_Quiet":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def close(self) -> None:
        pass
