"""Lookahead's pure parts: the n-gram pool, the window's batch layout, the source (no model)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from llamaspec import ConfigError, LookaheadConfig, SamplingConfig
from llamaspec.sources.base import Budget, Outcome, length_bucket
from llamaspec.sources.lookahead import LookaheadSource, NgramPool, Pooled, JacobiWindow, check_fits
from llamaspec.planning.planner import MAX_LEAVES


# --- the pool ------------------------------------------------------------------------------
def test_pool_seeded_from_text_has_every_ngram_keyed_by_its_first_token():
    pool = NgramPool(3)
    pool.add_text([1, 2, 3, 4, 2, 3, 5])
    assert len(pool) == 5  # (1,2,3) (2,3,4) (3,4,2) (4,2,3) (2,3,5)
    assert sorted(c for c, _, _ in pool.candidates([], 2, 10)) == [[3, 4], [3, 5]]
    assert pool.candidates([], 9, 10) == []


def test_pool_ranks_longest_context_match_then_most_recent():
    pool = NgramPool(2)
    pool.add([7, 1], before=[5, 6])
    pool.add([7, 2], before=[0, 6])
    pool.add([7, 3], before=[9, 9])
    pool.add([7, 4], before=[8, 8])
    assert pool.candidates([5, 6], 7, 4) == [([1], 2, False), ([2], 1, False), ([4], 0, False), ([3], 0, False)]
    assert pool.candidates([0, 6], 7, 2) == [([2], 2, False), ([1], 1, False)]


def test_pool_refreshes_repeated_ngrams_and_evicts_the_oldest():
    pool = NgramPool(2, per_key=2)
    pool.add([1, 10])
    pool.add([1, 11])
    pool.add([1, 10])  # seen again: now the most recent
    pool.add([1, 12])  # evicts 11, the oldest
    assert [c for c, _, _ in pool.candidates([], 1, 5)] == [[12], [10]]
    assert len(pool) == 2


def test_pool_add_text_from_an_offset_adds_only_new_ngrams():
    text = [1, 2, 3, 4, 5, 6]
    whole, parts = NgramPool(3), NgramPool(3)
    whole.add_text(text)
    parts.add_text(text[:4])
    parts.add_text(text, start=4)
    assert len(parts) == len(whole) == 4
    for key in text:
        assert parts.candidates(text, key, 9) == whole.candidates(text, key, 9)


def test_pool_rejects_wrong_sizes():
    with pytest.raises(ConfigError):
        NgramPool(1)
    with pytest.raises(ValueError):
        NgramPool(3).add([1, 2])


# --- the window ----------------------------------------------------------------------------
@pytest.mark.parametrize("w,n", [(1, 2), (4, 2), (4, 4), (15, 5), (3, 7)])
def test_window_rows_are_a_valid_batch(w, n):
    """Each column's sequence sees, in order, positions 1, 2, ... with no gap (llama.cpp's batch
    rule); level 0 of column i is shared by the columns right of it; logits on the last level."""
    window = JacobiWindow(w, n, list(range(100, 120)))
    rows = window.rows()
    assert len(rows) == w * (n - 1) - 1
    for col in range(w):
        offsets = [off for _, off, seqs, _ in rows if col in seqs]
        assert offsets == list(range(1, col + n - 1)), (col, offsets)
    with_logits = [(off, seqs) for _, off, seqs, logits in rows if logits]
    assert len(with_logits) == (w if n > 2 else w - 1)  # N = 2: column 0's guess is the pending row's
    assert all(len(seqs) == 1 for _, seqs in with_logits) or n == 2


def test_window_advance_harvests_column_ngrams_and_keeps_positions():
    w, n = 3, 4
    window = JacobiWindow(w, n, [0])
    window.levels = np.array([[0, 11, 12], [20, 21, 22], [30, 31, 32]])
    grams = window.advance([7, 8, 9], np.array([40, 41, 42]), moves=1)
    # column i: level 0..2 of column i (column 0's level 0 is the pending token 9) + its new guess
    assert [g for g, _ in grams] == [[9, 20, 30, 40], [11, 21, 31, 41], [12, 22, 32, 42]]
    # the tokens before each n-gram: the text, then level 0 of the columns to its left
    assert [b for _, b in grams] == [[7, 8], [7, 8, 9], [8, 9, 11]]
    assert window.levels.tolist() == [[20, 21, 22], [30, 31, 32], [40, 41, 42]]
    window.advance([1, 2], np.array([50, 51, 52]), moves=2)  # one accepted draft token: one more move
    assert window.levels.tolist() == [[40, 41, 42], [50, 51, 52], [30, 31, 32]]  # refilled from level 0


# --- refused parameters ---------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,fragment", [
    (dict(n=1), "N must be >= 2"),
    (dict(w=-1), "W must be >= 0"),
    (dict(g=-2), "G must be >= 0"),
    (dict(w=0, g=0), "needs a window"),
])
def test_config_refuses_bad_values(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        LookaheadConfig(**kwargs)


@pytest.mark.parametrize("config,n_ctx,n_batch,fragment", [
    (LookaheadConfig(200, 2, 100), 65536, 4096, "sequences (W + G + 1 at least); llama.cpp allows at most 256"),
    (LookaheadConfig(15, 5, 15), 4096, 64, "batch holds 64"),
    (LookaheadConfig(15, 5, 15), 128, 512, "more than half the 128-token context"),
])
def test_parameters_that_cannot_fit_are_refused(config, n_ctx, n_batch, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        check_fits(config, n_ctx, n_batch, MAX_LEAVES, whole=True)


def test_llamas_own_parameters_fit_the_default_context_and_a_planned_window_fits_any():
    assert check_fits(LookaheadConfig(15, 5, 15), 4096, 512, MAX_LEAVES, whole=True) == 31
    assert check_fits(LookaheadConfig(), 32, 512, MAX_LEAVES) == 1 + 8 + 4  # the planner sizes each step to what fits


# --- the source ---------------------------------------------------------------------------
def test_source_proposes_pool_ngrams_of_the_pending_token_and_the_window_as_a_rider():
    source = LookaheadSource(LookaheadConfig(w=3, n=4, g=2))
    text = [1, 2, 3, 4, 9, 9, 1, 2]
    proposal = source.propose(text, Budget(max_len=8), SamplingConfig(temperature=0), None)
    assert [c.tokens for c in proposal.candidates] == [(3, 4, 9)]  # after "1 2": the pool's n-gram
    assert proposal.candidates[0].evidence[0] == Pooled(length_bucket(2))  # "1" before it matches too
    assert proposal.window is not None and proposal.window.n_seqs == 3 and len(proposal.window.rows) == 3 * 3 - 1


def test_window_ngrams_enter_the_pool_marked_as_the_window_s():
    source = LookaheadSource(LookaheadConfig(w=2, n=3, g=4))
    text = [5, 6, 7, 8]
    source.propose(text, Budget(max_len=8), SamplingConfig(temperature=0), None)
    source.window.levels = np.array([[8, 30], [40, 41]])
    out = Outcome(tokens=text + [50], candidates=(), verified=(), emitted=(50,), window_tokens=(60, 61))
    source.learn(out)
    grams = source.pool.candidates([], 8, 9)  # column 0: pending 8, level 1 guess 40, new guess 60
    assert ([40, 60], 0, True) in grams


def test_source_after_a_cut_adds_only_the_new_text():
    source = LookaheadSource(LookaheadConfig())
    added = []
    original = source.pool.add_text
    source.pool.add_text = lambda tokens, start=0: (added.append(start), original(tokens, start))
    budget = Budget(max_len=8)
    source.propose(list(range(50)), budget, SamplingConfig(temperature=0), None)
    source.propose(list(range(40)) + [7, 7], budget, SamplingConfig(temperature=0), None)  # cut at 40, then 2 new
    assert added == [0, 40]  # not the whole text again
