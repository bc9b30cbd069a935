"""llama.cpp-compatible n-gram caches: counting, merging, the file format and drafting. No models."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path
from typing import List, Optional

import pytest

from llamaspec.errors import CacheFormatError, ConfigError, LlamaspecError
from llamaspec.sources.ngram_cache import NgramCache, draft_from_caches

def record(ngram: List[int], continuations: List[int]) -> bytes:
    """One record as common_ngram_cache_save writes it (little-endian int32)."""
    padded = list(ngram) + [-1] * (4 - len(ngram))
    n = len(continuations) // 2
    return struct.pack(f"<4ii{2 * n}i", *padded, n, *continuations)


# --- update ---------------------------------------------------------------------------------

def test_update_counts_every_ngram_and_its_follower() -> None:
    c = NgramCache()
    c.update([1, 2, 3, 1, 2, 4], 1, 2, 6)
    assert c == NgramCache({
        (1,): {2: 2}, (2,): {3: 1, 4: 1}, (3,): {1: 1},
        (1, 2): {3: 1, 4: 1}, (2, 3): {1: 1}, (3, 1): {2: 1},
    })
    assert len(c) == 6
    assert (1, 2) in c and [1, 2] in c and (2, 1) not in c
    assert c.get((1, 2)) == {3: 1, 4: 1}
    assert c.get([9]) is None


def test_update_long_ngrams_need_enough_tokens() -> None:
    c = NgramCache()
    c.update([1, 2, 3, 1, 2, 4], 3, 4, 6)
    assert c == NgramCache({
        (1, 2, 3): {1: 1}, (2, 3, 1): {2: 1}, (3, 1, 2): {4: 1},
        (1, 2, 3, 1): {2: 1}, (2, 3, 1, 2): {4: 1},
    })
    short = NgramCache()
    short.update([1, 2, 3], 4, 4, 3)
    assert len(short) == 0


def test_update_only_counts_the_new_tokens() -> None:
    c = NgramCache()
    c.update([1, 2, 3], 1, 2, 1)  # 1 and 2 are old context: only "3 follows" is counted
    assert c == NgramCache({(2,): {3: 1}, (1, 2): {3: 1}})
    c.update([1, 2, 3], 1, 2, 0)
    assert len(c) == 2


@pytest.mark.parametrize("chunks", [[6], [3, 3], [1, 1, 1, 1, 1, 1], [2, 1, 3], [4, 2]])
def test_incremental_update_equals_one_update(chunks: List[int]) -> None:
    tokens = [1, 2, 3, 1, 2, 4]
    whole = NgramCache()
    whole.update(tokens, 1, 4, len(tokens))
    parts = NgramCache()
    n = 0
    for k in chunks:
        n += k
        parts.update(tokens[:n], 1, 4, k)
    assert parts == whole


def test_incremental_update_on_random_tokens() -> None:
    rng = random.Random(1)
    tokens = [rng.randrange(20) for _ in range(3000)]
    whole = NgramCache()
    whole.update(tokens, 1, 4, len(tokens))
    steps = NgramCache()
    n = 0
    while n < len(tokens):
        k = min(rng.randrange(1, 6), len(tokens) - n)
        n += k
        steps.update(tokens[:n], 1, 4, k)
    assert steps == whole


def test_update_rejects_bad_arguments() -> None:
    c = NgramCache()
    with pytest.raises(ConfigError):
        c.update([1, 2, 3], 0, 2, 3)
    with pytest.raises(ConfigError):
        c.update([1, 2, 3], 1, 5, 3)
    with pytest.raises(ValueError):
        c.update([1, 2, 3], 1, 2, 4)
    with pytest.raises(ValueError):
        c.update([1, -1, 3], 1, 2, 3)


# --- merge ----------------------------------------------------------------------------------

def test_merge_adds_counts_and_copies() -> None:
    a = NgramCache({(1,): {2: 1}})
    b = NgramCache({(1,): {2: 2, 3: 1}, (4, 5): {6: 1}})
    a.merge(b)
    assert a == NgramCache({(1,): {2: 3, 3: 1}, (4, 5): {6: 1}})
    a.update([4, 5, 6], 2, 2, 3)  # must not change b
    assert b.get((4, 5)) == {6: 1}
    assert a.get((4, 5)) == {6: 2}


# --- file format ----------------------------------------------------------------------------

def test_save_writes_llama_cpp_format_exactly(tmp_path: Path) -> None:
    c = NgramCache({(5,): {7: 2}, (5, 7): {9: 1, 3: 4}})
    path = tmp_path / "c.bin"
    c.save(path)
    expected = (struct.pack("<4i", 5, -1, -1, -1) + struct.pack("<i", 1) + struct.pack("<2i", 7, 2)
                + struct.pack("<4i", 5, 7, -1, -1) + struct.pack("<i", 2) + struct.pack("<4i", 9, 1, 3, 4))
    assert path.read_bytes() == expected
    assert len(expected) == (20 + 8) + (20 + 16)
    loaded = NgramCache.load(path)
    assert loaded == c
    assert loaded.path == str(path)
    assert os.listdir(tmp_path) == ["c.bin"]  # no temporary file left behind


def test_round_trip(tmp_path: Path) -> None:
    rng = random.Random(2)
    tokens = [rng.randrange(50) for _ in range(5000)]
    c = NgramCache()
    c.update(tokens, 1, 4, len(tokens))
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    c.save(a)
    loaded = NgramCache.load(a)
    assert loaded == c
    loaded.save(b)
    assert a.read_bytes() == b.read_bytes()
    c.update(tokens + [1, 2], 1, 4, 2)
    c.save(a)  # overwrites
    assert NgramCache.load(a) == c
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]


def test_empty_cache_is_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.bin"
    NgramCache().save(path)
    assert path.read_bytes() == b""
    assert len(NgramCache.load(path)) == 0


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.bin"
    with pytest.raises(CacheFormatError, match="does not exist"):
        NgramCache.load(path)
    assert len(NgramCache.load(path, missing_ok=True)) == 0


def assert_rejected(path: Path, data: bytes, match: str) -> str:
    path.write_bytes(data)
    with pytest.raises(CacheFormatError, match=match) as info:
        NgramCache.load(path)
    message = str(info.value)
    assert isinstance(info.value, LlamaspecError)
    assert str(path) in message and "\n" not in message
    return message


def test_load_rejects_text(tmp_path: Path) -> None:
    assert_rejected(tmp_path / "a.txt", b"Hello, this is not a cache at all.\n", "not a multiple of 4")
    msg = assert_rejected(tmp_path / "b.txt", b"Hello world, this is just a text file.\n\n",
                          "not a valid n-gram cache")
    assert "record 0" in msg


def test_load_rejects_truncated(tmp_path: Path) -> None:
    good = record([5], [7, 2]) + record([5, 7], [9, 1, 3, 4])
    assert_rejected(tmp_path / "t1.bin", good[:-4], r"needs 36 bytes but only 32 remain")
    assert_rejected(tmp_path / "t2.bin", good[:-2], "not a multiple of 4")
    assert_rejected(tmp_path / "t3.bin", good[:28 + 12], "cut short")


def test_load_rejects_gguf(tmp_path: Path) -> None:
    gguf = b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + b"\0" * 40
    assert_rejected(tmp_path / "model.gguf", gguf, "GGUF model file, not an n-gram cache")


@pytest.mark.parametrize("data,match", [
    (record([5, -1, 7], [1, 1]), "has n-gram"),  # -1 inside the n-gram
    (record([-1, 5], [1, 1]), "has n-gram"),
    (record([], [1, 1]), "has n-gram"),  # all padding
    (record([5, 6, 7, 8], []), "0 continuations"),
    (record([5], [-3, 1]), "negative token id or a count <= 0"),
    (record([5], [3, 0]), "negative token id or a count <= 0"),
    (record([5], [3, 1, 4, -2]), "negative token id or a count <= 0"),
    (record([5], [3, 1, 3, 2]), "repeats"),
    (record([5], [3, 1]) + record([5], [4, 1]), "record 1 .* repeats"),
])
def test_load_rejects_bad_records(tmp_path: Path, data: bytes, match: str) -> None:
    assert_rejected(tmp_path / "bad.bin", data, match)


def test_validate_vocab(tmp_path: Path) -> None:
    path = tmp_path / "c.bin"
    NgramCache({(5, 7): {49: 1}}).save(path)
    c = NgramCache.load(path)
    c.validate_vocab(50)
    with pytest.raises(CacheFormatError, match="another vocabulary") as info:
        c.validate_vocab(49)
    assert "49" in str(info.value) and str(path) in str(info.value)
    with pytest.raises(CacheFormatError, match="token id 70 .* 60 tokens"):
        NgramCache({(70, 1): {2: 1}}).validate_vocab(60)  # in the n-gram itself
    NgramCache().validate_vocab(1)


# --- drafting -------------------------------------------------------------------------------

def draft(inp: List[int], n_draft: int = 8, ngram_min: int = 1, ngram_max: int = 4, *,
          context: Optional[NgramCache] = None, dynamic: Optional[NgramCache] = None,
          static: Optional[NgramCache] = None) -> List[int]:
    return draft_from_caches(inp, inp[-1] if inp else 0, n_draft, ngram_min, ngram_max,
                             context or NgramCache(), dynamic or NgramCache(), static or NgramCache())


def test_draft_from_context_follows_the_pattern_up_to_n_draft() -> None:
    inp = [1, 2, 3, 1, 2, 3, 1, 2]
    context = NgramCache()
    context.update(inp, 1, 4, len(inp))
    assert draft(inp, 5, context=context) == [3, 1, 2, 3, 1]
    assert draft(inp, 2, context=context) == [3, 1]
    assert draft(inp, 0, context=context) == []


def test_draft_nothing_matches() -> None:
    assert draft([1, 2, 3]) == []
    context = NgramCache({(9,): {1: 5}})
    assert draft([1, 2, 3], context=context, dynamic=context, static=NgramCache({(2, 9): {1: 5}})) == []
    assert draft([3], context=NgramCache({(3,): {1: 5}})) == []  # fewer than 2 tokens: llama.cpp drafts nothing
    assert draft([]) == []


def test_draft_context_thresholds() -> None:
    # 1-grams (first threshold): at least 2 samples and 66 % for the winner.
    assert draft([5, 7], context=NgramCache({(7,): {8: 1}})) == []
    assert draft([5, 7], context=NgramCache({(7,): {8: 2}})) == [8]
    assert draft([5, 7], context=NgramCache({(7,): {8: 2, 9: 1}})) == [8]  # 200 >= 66*3
    assert draft([5, 7], context=NgramCache({(7,): {8: 2, 9: 2}})) == []  # 200 < 66*4
    assert draft([5, 7], context=NgramCache({(7,): {8: 1, 9: 2}})) == [9]


def test_draft_longest_ngram_first_then_shorter() -> None:
    both = NgramCache({(7,): {9: 5}, (5, 7): {8: 2}})
    assert draft([5, 7], context=both) == [8]
    weak_long = NgramCache({(7,): {9: 5}, (5, 7): {8: 1}})  # 2-gram: 1 sample < 2
    assert draft([5, 7], context=weak_long) == [9]


def test_draft_thresholds_are_indexed_from_ngram_min() -> None:
    # As in llama.cpp, threshold k applies to the k-th size of [ngram_min, ngram_max]:
    # a 3-gram seen once passes as the third size (1 sample needed) but not as the first (2).
    context = NgramCache({(4, 5, 7): {8: 1}})
    assert draft([4, 5, 7], ngram_min=1, ngram_max=3, context=context) == [8]
    assert draft([4, 5, 7], ngram_min=3, ngram_max=3, context=context) == []


def test_draft_dynamic_fallback_is_stricter() -> None:
    assert draft([5, 7], dynamic=NgramCache({(7,): {8: 4}})) == [8]
    assert draft([5, 7], dynamic=NgramCache({(7,): {8: 3}})) == []  # would pass in context
    assert draft([5, 7], context=NgramCache({(7,): {8: 3}})) == [8]
    # context wins over dynamic
    assert draft([5, 7], context=NgramCache({(7,): {8: 2}}), dynamic=NgramCache({(7,): {9: 10}})) == [8]
    # a context miss falls back to dynamic
    assert draft([5, 7], context=NgramCache({(7,): {8: 1}}), dynamic=NgramCache({(7,): {9: 10}})) == [9]


def test_draft_static_validation() -> None:
    context = NgramCache({(7,): {8: 3, 9: 1}})
    assert draft([5, 7], context=context) == [8]
    # The static cache knows only 9 after (5, 7): 9 outweighs 8 (1*100 > 3*1) but holds 25 % of
    # the context samples, under 66 %, so the context drafts nothing; the static cache's own
    # sample (1) is too small to draft from.
    assert draft([5, 7], context=context, static=NgramCache({(5, 7): {9: 1}})) == []
    # A tie in the context is broken by the static cache.
    tie = NgramCache({(5, 7): {8: 1, 9: 1}})
    assert draft([5, 7], ngram_min=1, ngram_max=2, context=tie) == [8]
    assert draft([5, 7], ngram_min=1, ngram_max=2, context=tie, static=NgramCache({(5, 7): {9: 1}})) == [9]


def test_draft_static_fallback() -> None:
    assert draft([5, 7], static=NgramCache({(5, 7): {8: 2}})) == [8]
    assert draft([5, 7], static=NgramCache({(5, 7): {8: 1}})) == []  # fewer than 2 samples
    assert draft([5, 7], static=NgramCache({(5, 7): {8: 1, 9: 1}})) == [8]  # 50 % is enough
    assert draft([5, 7], static=NgramCache({(5, 7): {8: 1, 9: 1, 4: 1}})) == []
    chain = NgramCache({(5, 7): {8: 2}, (7, 8): {1: 3}, (8, 1): {2: 2}})
    assert draft([5, 7], static=chain) == [8, 1, 2]
    assert draft([5, 7], 2, static=chain) == [8, 1]


def test_draft_checks_last() -> None:
    with pytest.raises(ValueError, match="inp\\[-1\\]"):
        draft_from_caches([5, 7], 8, 4, 1, 4, NgramCache(), NgramCache(), NgramCache())
    with pytest.raises(ConfigError):
        draft_from_caches([5, 7], 7, 4, 2, 5, NgramCache(), NgramCache(), NgramCache())
