"""Token lists and the batch rows that put them in the KV cache's sequences: how much of one
list another holds."""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Tuple


class BatchRow(NamedTuple):
    """One row of a llama_decode batch: ``token`` at position ``pos`` of each KV-cache sequence in
    ``seq_ids``, ``logits``: whether the decode outputs the row's logits. In a trie's or a
    window's own rows, ``pos`` counts from the pending token and ``seq_ids`` are local (the
    engine places them)."""

    token: int
    pos: int
    seq_ids: Tuple[int, ...]
    logits: bool


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (list compares, no Python loop)."""
    n = min(len(a), len(b))
    if _head(a, n) == _head(b, n):  # the common case, a text and a longer one it begins, costs one copy
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if list(a[:mid]) == list(b[:mid]):
            lo = mid
        else:
            hi = mid
    return lo


def _head(a: Sequence[int], n: int) -> list:
    """The first ``n`` items of ``a`` as a list (``a`` itself when it is a list of n)."""
    if type(a) is list:
        return a if len(a) == n else a[:n]
    return list(a[:n])


def appended(old: Sequence[int], new: Sequence[int]) -> Optional[int]:
    """How many tokens ``new`` adds to ``old``, or None when it is not an extension of it."""
    n = len(old)
    if len(new) >= n and _head(new, n) == _head(old, n):
        return len(new) - n
    return None
