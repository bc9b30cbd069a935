"""Lookahead's pure parts: the n-gram pool, the window's batch layout, branch verification."""

from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

from llamaspec import ConfigError, LookaheadConfig
from llamaspec.acceptance import verify_branches
from llamaspec.lookahead import NgramPool, Window, check_fits


# --- the pool ------------------------------------------------------------------------------
def test_pool_seeded_from_text_has_every_ngram_keyed_by_its_first_token():
    pool = NgramPool(3)
    pool.add_text([1, 2, 3, 4, 2, 3, 5])
    assert len(pool) == 5  # (1,2,3) (2,3,4) (3,4,2) (4,2,3) (2,3,5)
    assert sorted(c for c, _ in pool.candidates([], 2, 10)) == [[3, 4], [3, 5]]
    assert pool.candidates([], 9, 10) == []


def test_pool_ranks_longest_context_match_then_most_recent():
    pool = NgramPool(2)
    pool.add([7, 1], before=[5, 6])
    pool.add([7, 2], before=[0, 6])
    pool.add([7, 3], before=[9, 9])
    pool.add([7, 4], before=[8, 8])
    assert pool.candidates([5, 6], 7, 4) == [([1], 2), ([2], 1), ([4], 0), ([3], 0)]
    assert pool.candidates([0, 6], 7, 2) == [([2], 2), ([1], 1)]


def test_pool_refreshes_repeated_ngrams_and_evicts_the_oldest():
    pool = NgramPool(2, per_key=2)
    pool.add([1, 10])
    pool.add([1, 11])
    pool.add([1, 10])  # seen again: now the most recent
    pool.add([1, 12])  # evicts 11, the oldest
    assert [c for c, _ in pool.candidates([], 1, 5)] == [[12], [10]]
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
    window = Window(w, n, list(range(100, 120)))
    rows = window.rows(first_seq=1)
    assert len(rows) == w * (n - 1) - 1
    for col in range(w):
        offsets = [off for _, off, seqs, _ in rows if 1 + col in seqs]
        assert offsets == list(range(1, col + n - 1)), (col, offsets)
    with_logits = [(off, seqs) for _, off, seqs, logits in rows if logits]
    assert len(with_logits) == (w if n > 2 else w - 1)  # N = 2: column 0's guess is the pending row's
    assert all(len(seqs) == 1 for _, seqs in with_logits) or n == 2


def test_window_advance_harvests_column_ngrams_and_keeps_positions():
    w, n = 3, 4
    window = Window(w, n, [0])
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
    (LookaheadConfig(200, 2, 100), 65536, 4096, "sequences; llama.cpp allows at most 256"),
    (LookaheadConfig(15, 5, 15), 4096, 64, "batch holds 64"),
    (LookaheadConfig(15, 5, 15), 128, 512, "more than half the 128-token context"),
])
def test_parameters_that_cannot_fit_are_refused(config, n_ctx, n_batch, fragment):
    with pytest.raises(ConfigError, match=fragment):
        check_fits(config, n_ctx, n_batch)


def test_llamas_own_parameters_fit_the_default_context():
    assert check_fits(LookaheadConfig(15, 5, 15), 4096, 512) == 31


# --- verification of several branches --------------------------------------------------------
def test_verify_branches_greedy_takes_the_longest_agreeing_branch():
    # the target's argmax: row 0 -> 5; the rows after 5 (1 and 4) -> 6; after 5, 6 -> 7; then 8
    branches = [[5, 9, 9], [5, 6, 7], [4, 6, 7]]
    rows = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    target = {0: 5, 1: 6, 2: 0, 4: 6, 5: 7, 6: 8, 7: 0, 8: 0, 9: 0}
    assert verify_branches(target.__getitem__, branches, rows) == (1, 3, 8)
    target[0] = 3  # no branch starts with the target's token
    assert verify_branches(target.__getitem__, branches, rows) == (0, 0, 3)
    assert verify_branches(lambda r: 3, [], []) == (0, 0, 3)


def test_verify_branches_sampled_keeps_the_target_distribution():
    """Two emitted tokens, sampled through branches, are distributed as the target's own p."""
    vocab = 4
    rng = np.random.default_rng(0)
    p0 = np.array([0.5, 0.3, 0.15, 0.05])
    p1 = {x: rng.dirichlet(np.ones(vocab)) for x in range(vocab)}  # p(second | first)
    branches = [[0, 1], [0, 2], [1, 3], [3, 3]]
    rows = [[1, 2], [3, 4], [5, 6], [7, 8]]
    first_of_row = {1: 0, 3: 0, 5: 1, 7: 3}

    def run(seed):
        r = np.random.default_rng(seed)
        dist = {0: p0, **{row: p1[x] for row, x in first_of_row.items()}}

        def choose(row):
            if row not in dist:  # after two tokens: any token, not counted
                return 0
            return int(r.choice(vocab, p=dist[row]))
        b, n, token = verify_branches(choose, branches, rows)
        emitted = branches[b][:n] + [token]
        if n == 0:  # the second token would come from the next plain step: sample it there
            emitted.append(int(r.choice(vocab, p=p1[token])))
        return tuple(emitted[:2])

    n_runs = 6000
    counts = collections.Counter(run(seed) for seed in range(n_runs))
    pairs = list(itertools.product(range(vocab), repeat=2))
    expected = np.array([p0[a] * p1[a][b] for a, b in pairs]) * n_runs
    observed = np.array([counts[pair] for pair in pairs])
    keep = expected > 5
    assert chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum()).pvalue > 1e-3
