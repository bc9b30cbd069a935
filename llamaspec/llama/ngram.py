"""llama.cpp's n-gram caches (``common/ngram-cache``) in Python: build, merge, save, load, draft
(the draft source that reads them: ``sources/ngram_cache.py``).

An n-gram cache maps an n-gram (1 to 4 token ids) to how often each token followed it.
``llama-lookup`` drafts from three of them: *context* (the current prompt and generation),
*dynamic* (earlier generations, kept in a file between runs) and *static* (2-grams of a
large corpus, made by ``llama-lookup-create``). Files saved here load in llama.cpp and
the other way round.

File format (no header, no vocabulary, little-endian int32 throughout): a sequence of
records, one per n-gram, in any order::

    int32 ngram[4]      the n-gram's tokens, then -1 (LLAMA_TOKEN_NULL) padding to 4
    int32 n             how many different tokens followed it (n > 0)
    n x (int32 token, int32 count)      count > 0

so a record takes 20 + 8*n bytes. An empty file is an empty cache.
"""

from __future__ import annotations

import os
import secrets
import sys
from array import array
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from ..config import MAX_CACHE_BYTES, check_readable
from ..errors import CacheFormatError, ConfigError

LLAMA_TOKEN_NULL = -1
NGRAM_MIN = 1  # llama.cpp's LLAMA_NGRAM_MIN
NGRAM_MAX = 4  # LLAMA_NGRAM_MAX: the longest n-gram a cache file can hold
NGRAM_STATIC = 2  # LLAMA_NGRAM_STATIC: the n-gram size of static caches

# llama.cpp's drafting thresholds, indexed by n-gram position (see draft_from_caches):
MIN_SAMPLES_LAX = (2, 2, 1, 1)
MIN_PERCENT_LAX = (66, 50, 50, 50)
MIN_SAMPLES_STRICT = (4, 3, 2, 2)
MIN_PERCENT_STRICT = (75, 66, 66, 66)

Ngram = Tuple[int, ...]
Counts = Dict[int, int]
PathLike = Union[str, "os.PathLike[str]"]


def _check_range(ngram_min: int, ngram_max: int) -> None:
    if not 1 <= ngram_min <= ngram_max <= NGRAM_MAX:
        raise ConfigError(f"n-gram sizes must satisfy 1 <= ngram_min <= ngram_max <= {NGRAM_MAX}, "
                          f"got ngram_min={ngram_min}, ngram_max={ngram_max}")


class NgramCache:
    """n-gram (tuple of 1..4 token ids) -> {following token: count}.

    ``NgramCache({(5, 7): {9: 2}})`` builds one by hand (the mapping is copied).
    """

    def __init__(self, entries: Optional[Mapping[Ngram, Mapping[int, int]]] = None) -> None:
        self._data: Dict[Ngram, Counts] = {}
        self.path: Optional[str] = None  # the file it was loaded from, for messages
        for ngram, counts in (entries or {}).items():
            key = tuple(int(t) for t in ngram)
            part = {int(t): int(c) for t, c in counts.items()}
            if not 1 <= len(key) <= NGRAM_MAX or min(key) < 0:
                raise ValueError(f"an n-gram is 1..{NGRAM_MAX} token ids >= 0, got {ngram!r}")
            if not part or min(part) < 0 or min(part.values()) <= 0:
                raise ValueError(f"counts of {ngram!r} must be non-empty, tokens >= 0, counts > 0")
            self._data[key] = part

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, ngram: object) -> bool:
        try:
            return tuple(int(t) for t in ngram) in self._data  # type: ignore[attr-defined]
        except TypeError:
            return False

    def __iter__(self) -> Iterator[Ngram]:
        return iter(self._data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NgramCache):
            return NotImplemented
        return self._data == other._data

    def __repr__(self) -> str:
        return f"NgramCache({len(self)} n-grams)"

    def get(self, ngram: Sequence[int]) -> Optional[Counts]:
        """A copy of the counts of the tokens that followed ``ngram``, or None if never seen."""
        part = self._data.get(tuple(int(t) for t in ngram))
        return None if part is None else dict(part)

    def update(self, tokens: Sequence[int], ngram_min: int, ngram_max: int, n_new: int) -> None:
        """Count the n-grams ending at each of the last ``n_new`` tokens of ``tokens``.

        Like ``common_ngram_cache_update``: for every n in [ngram_min, ngram_max] and every
        new position i (i >= n), ``tokens[i-n:i]`` is an n-gram followed by ``tokens[i]``.
        ``tokens`` may only grow between calls (pass how many were appended as ``n_new``);
        anything else needs a new cache. Only the last ``n_new + ngram_max`` tokens are read,
        so calling this after every generation step is cheap.
        """
        _check_range(ngram_min, ngram_max)
        n = len(tokens)
        if not 0 <= n_new <= n:
            raise ValueError(f"n_new must be in [0, len(tokens)={n}], got {n_new}")
        first_new = n - n_new
        lo = max(0, first_new - ngram_max)
        window: List[int] = [int(t) for t in tokens[lo:]]
        if n_new and min(window[first_new - lo:]) < 0:
            raise ValueError("token ids must be >= 0")
        end = len(window)
        data = self._data
        for size in range(ngram_min, ngram_max + 1):
            start = max(first_new, size) - lo  # window index of the first token to predict
            if start >= end:
                continue
            ngrams = zip(*(window[start - size + j:end - size + j] for j in range(size)))
            for ngram, token in zip(ngrams, window[start:]):
                part = data.get(ngram)
                if part is None:
                    data[ngram] = {token: 1}
                elif token in part:
                    part[token] += 1
                else:
                    part[token] = 1

    def merge(self, other: NgramCache) -> None:
        """Add ``other``'s counts to this cache (``common_ngram_cache_merge``)."""
        data = self._data
        for ngram, counts in other._data.items():
            part = data.get(ngram)
            if part is None:
                data[ngram] = dict(counts)
            else:
                for token, count in counts.items():
                    part[token] = part.get(token, 0) + count

    def validate_vocab(self, n_vocab: int) -> None:
        """Raise CacheFormatError if a token id (in an n-gram or a continuation) is >= ``n_vocab``.

        llama.cpp does not store the vocabulary in a cache file, so an out-of-range id is the
        only evidence available that a cache was made with another tokenizer. A cache made for
        a different vocabulary of the same or larger size passes unnoticed.
        """
        if not self._data:
            return
        top = max(max(max(ngram) for ngram in self._data), max(max(p) for p in self._data.values()))
        if top >= n_vocab:
            where = f"n-gram cache {self.path}" if self.path else "the n-gram cache"
            raise CacheFormatError(f"{where} contains token id {top} but the model's vocabulary has "
                                   f"{n_vocab} tokens: it was made for another vocabulary")

    def save(self, path: PathLike) -> None:
        """Write the cache in llama.cpp's format, atomically (a temporary file, then os.replace)."""
        path = os.fspath(path)
        flat: List[int] = []
        add = flat.extend
        pads = [(LLAMA_TOKEN_NULL,) * (NGRAM_MAX - n) for n in range(NGRAM_MAX + 1)]
        for ngram, counts in self._data.items():
            add(ngram)
            add(pads[len(ngram)])
            flat.append(len(counts))
            for pair in counts.items():
                add(pair)
        values = array("i", flat)
        del flat
        if values.itemsize != 4:  # pragma: no cover - C int is 32-bit on every supported platform
            raise RuntimeError("array('i') is not 32-bit on this platform")
        if sys.byteorder == "big":  # pragma: no cover
            values.byteswap()
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                values.tofile(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    @classmethod
    def load(cls, path: PathLike, *, missing_ok: bool = False) -> NgramCache:
        """Read a cache saved by llama.cpp (``common_ngram_cache_save``) or by :meth:`save`.

        A missing or unreadable file raises CacheFormatError (with the OSError as its cause),
        unless ``missing_ok`` and the file does not exist: then the cache is empty, as
        ``llama-lookup`` does for its dynamic cache. Anything that is not a well-formed cache
        raises CacheFormatError: a GGUF file, a size that is not a whole number of records,
        an n-gram that is not 1..4 ids >= 0 padded with -1, a record with no continuations,
        a negative token or a count <= 0, and a repeated n-gram or continuation (llama.cpp
        never writes those; its loader would keep the first and silently drop the rest).
        """
        path = os.fspath(path)
        try:
            if os.path.exists(path):  # a missing file: the error below
                try:
                    check_readable(path, MAX_CACHE_BYTES, "n-gram cache")
                except ConfigError as exc:
                    raise CacheFormatError(str(exc)) from None
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError as exc:
            if missing_ok:
                return cls()
            raise CacheFormatError(f"n-gram cache {path} does not exist") from exc
        except OSError as exc:
            raise CacheFormatError(f"cannot read n-gram cache {path}: {exc.strerror or exc}") from exc

        def bad(what: str) -> CacheFormatError:
            return CacheFormatError(f"{path} is not a valid n-gram cache: {what}")

        if raw.startswith(b"GGUF"):
            raise CacheFormatError(f"{path} is a GGUF model file, not an n-gram cache")
        if len(raw) % 4:
            raise bad(f"its size ({len(raw)} bytes) is not a multiple of 4")
        arr = array("i")
        arr.frombytes(raw)
        if sys.byteorder == "big":  # pragma: no cover
            arr.byteswap()
        v = arr.tolist()
        cache = cls()
        cache.path = path
        data = cache._data
        pos, n, record = 0, len(v), 0
        while pos < n:
            head = v[pos:pos + NGRAM_MAX + 1]  # the n-gram, padded, then its number of continuations
            if len(head) <= NGRAM_MAX:
                raise bad(f"record {record} (byte {4 * pos}) is cut short; "
                          "the file is truncated or not a cache")
            size = NGRAM_MAX - head.count(LLAMA_TOKEN_NULL)  # padding is trailing, checked below
            ngram = tuple(head[:size])
            if size <= 0 or min(ngram) < 0:
                raise bad(f"record {record} (byte {4 * pos}) has n-gram {head[:NGRAM_MAX]}, "
                          "expected 1..4 token ids >= 0 padded with -1")
            n_tokens = head[NGRAM_MAX]
            if n_tokens <= 0:
                raise bad(f"record {record} (byte {4 * pos}) has {n_tokens} continuations, expected > 0")
            end = pos + NGRAM_MAX + 1 + 2 * n_tokens
            if end > n:
                raise bad(f"record {record} (byte {4 * pos}) needs {4 * (end - pos)} bytes but only "
                          f"{4 * (n - pos)} remain; the file is truncated or not a cache")
            if n_tokens == 1:
                token, count = v[end - 2], v[end - 1]
                part = {token: count}
                ok = token >= 0 and count > 0
            else:
                tokens, counts = v[end - 2 * n_tokens:end:2], v[end - 2 * n_tokens + 1:end:2]
                part = dict(zip(tokens, counts))
                ok = min(tokens) >= 0 and min(counts) > 0
            if not ok:
                raise bad(f"record {record} (byte {4 * pos}) has a negative token id or a count <= 0")
            if len(part) != n_tokens or ngram in data:
                raise bad(f"record {record} (byte {4 * pos}) repeats an n-gram or a continuation token")
            data[ngram] = part
            pos, record = end, record + 1
        return cache


def _pick_primary(data: Dict[Ngram, Counts], ngrams: List[Optional[Ngram]], static_counts: Counts,
                  min_samples: Tuple[int, ...], min_percent: Tuple[int, ...]) -> Optional[int]:
    """One token from a context or dynamic cache, longest n-gram first, weighted by the static cache."""
    for i in range(len(ngrams) - 1, -1, -1):
        ngram = ngrams[i]
        part = None if ngram is None else data.get(ngram)
        if part is None:
            continue
        best, best_count, best_weight, total = -1, 0, 0, 0
        for token, count in part.items():
            weight = 100 * static_counts[token] if token in static_counts else 1
            if count * weight > best_count * best_weight:
                best, best_count, best_weight = token, count, weight
            total += count
        if total >= min_samples[i] and 100 * best_count >= min_percent[i] * total:
            return best
    return None


def _pick_static(data: Dict[Ngram, Counts], ngram: Ngram) -> Optional[int]:
    """The static cache's most frequent continuation, if it is common and dominant enough."""
    part = data.get(ngram)
    if not part:
        return None
    best, best_count, total = -1, 0, 0
    for token, count in part.items():
        if count > best_count:
            best, best_count = token, count
        total += count
    i = NGRAM_STATIC - 1
    if total < MIN_SAMPLES_LAX[i] or 100 * best_count < MIN_PERCENT_LAX[i] * total:
        return None
    return best


def draft_from_caches(inp: Sequence[int], last: int, n_draft: int, ngram_min: int, ngram_max: int,
                      context: NgramCache, dynamic: NgramCache, static: NgramCache) -> List[int]:
    """Up to ``n_draft`` tokens to follow ``inp``, by llama.cpp's rule (``common_ngram_cache_draft``).

    ``inp`` is every token so far *including* the last sampled one, and ``last`` is that
    token again (llama.cpp seeds its draft with it and asserts ``draft[0] == inp.back()``);
    a ``last`` different from ``inp[-1]`` raises ValueError. The n-gram keys are the last
    tokens of ``inp`` followed by the tokens drafted so far; ``last`` adds nothing else.
    Returns the drafted tokens only. Nothing is drafted when ``len(inp) < 2``.

    The rule, a heuristic of llama.cpp's, drafts one token at a time:

    1. The last 2 tokens select the static cache's counts for this position (possibly none).
    2. Context cache: for each n-gram size from ``ngram_max`` down to ``ngram_min``, take the
       continuations of the last n tokens. Each continuation scores its count times
       ``100 * its static count``, or times 1 if the static cache never saw it after these
       2 tokens, so a continuation the corpus agrees with wins over a more frequent one it
       does not know. The winner (first seen on a tie) is drafted if the n-gram was seen at
       least ``MIN_SAMPLES_LAX[k]`` times and the winner's own count is at least
       ``MIN_PERCENT_LAX[k]`` percent of them, where k is the size's position in
       [ngram_min, ngram_max] (k = n - ngram_min, as llama.cpp indexes the thresholds);
       otherwise the next shorter n-gram is tried.
    3. Otherwise the dynamic cache, the same way with the stricter ``*_STRICT`` thresholds.
    4. Otherwise the static cache alone: its most frequent continuation of the last 2
       tokens, if those 2 were seen at least 2 times and it has at least 50 percent.
    5. If none of these yields a token, drafting stops; else the token is appended and the
       next position is drafted the same way, until ``n_draft`` tokens.

    An n-gram longer than ``inp`` plus the draft is skipped (llama.cpp reads out of bounds).
    """
    _check_range(ngram_min, ngram_max)
    if len(inp) and int(inp[-1]) != int(last):
        raise ValueError(f"last ({last}) must be inp[-1] ({inp[-1]}): inp includes the last sampled token")
    if len(inp) < NGRAM_STATIC:
        return []
    n_inp = len(inp)
    seq: List[int] = [int(t) for t in inp[-max(ngram_max, NGRAM_STATIC):]]
    drafted: List[int] = []
    while len(drafted) < n_draft:
        static_counts = static._data.get(tuple(seq[-NGRAM_STATIC:])) or {}
        available = n_inp + len(drafted)
        ngrams: List[Optional[Ngram]] = [tuple(seq[-size:]) if size <= available else None
                                         for size in range(ngram_min, ngram_max + 1)]
        token = _pick_primary(context._data, ngrams, static_counts, MIN_SAMPLES_LAX, MIN_PERCENT_LAX)
        if token is None:
            token = _pick_primary(dynamic._data, ngrams, static_counts, MIN_SAMPLES_STRICT, MIN_PERCENT_STRICT)
        if token is None:
            token = _pick_static(static._data, tuple(seq[-NGRAM_STATIC:]))
        if token is None:
            break
        drafted.append(token)
        seq.append(token)
    return drafted
