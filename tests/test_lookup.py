"""Prompt lookup, draft length and replay on plain token lists (no model)."""

from __future__ import annotations

import numpy as np
import pytest

from llamaspec.costs import CostCurve
from llamaspec.draft_length import DraftLength
from llamaspec.drafters import ChainDrafter, LookupDrafter, NoDrafter
from llamaspec.lookup import PromptLookup, TokenIndex, replay
from llamaspec.ngram_cache import NgramCache, NgramCaches

# BASELINE.md's measured cost of verifying n tokens on the 2-core reference machine
CPU = CostCurve(list(np.interp(np.arange(1, 33), [1, 2, 4, 8, 12, 16, 20, 24, 32],
                               [1.00, 1.59, 2.63, 4.54, 5.51, 5.20, 6.98, 7.71, 8.91])), 25.0, 2, "cpu")


def test_token_index_maps_ngrams_to_following_positions():
    idx = TokenIndex(1, 2)
    idx.extend([1, 2, 3])
    idx.extend([1, 2])
    assert idx.ends((1, 2)) == [2, 5]
    assert idx.ends((2,)) == [2, 5]
    assert idx.ends((3, 1)) == [4]
    assert idx.ends((9,)) == []


def test_finds_continuation_of_longest_ngram():
    lookup = PromptLookup(1, 3)
    lookup.sync([5, 6, 7, 8, 9, 1, 6, 7])
    draft, n = lookup.find(3)
    assert (draft, n) == ([8, 9, 1], 2)
    assert lookup.find(1) == ([8], 2)


def test_no_match_is_an_empty_proposal():
    lookup = PromptLookup(2, 4)
    lookup.sync([1, 2, 3, 4])
    assert lookup.find(5) == ([], 0)


@pytest.mark.parametrize("policy, expected", [("recent", [11]), ("longest", [33]), ("frequent", [11])])
def test_match_policies(policy, expected):
    # "9" is followed by 11 twice (after "7 9") and by 22 and 33 once each (after "8 9");
    # the history ends in "8 9", so the occurrences after "8 9" share more context.
    h = [1, 7, 9, 11, 0, 2, 8, 9, 22, 0, 3, 8, 9, 33, 0, 4, 7, 9, 11, 0, 5, 8, 9]
    lookup = PromptLookup(1, 1, policy)
    lookup.sync(h)
    assert lookup.find(1)[0] == expected


def test_longest_policy_prefers_the_more_specific_context():
    # "a b c" is followed by 1 in an old place, "x b c" by 2 more recently; history ends "a b c"
    h = [10, 11, 12, 1, 50, 20, 11, 12, 2, 51, 10, 11, 12]
    longest, recent = PromptLookup(1, 2, "longest"), PromptLookup(1, 2, "recent")
    longest.sync(h)
    recent.sync(h)
    assert longest.find(1)[0] == [1]
    assert recent.find(1)[0] == [2]


def test_references_are_searched_but_not_joined_to_the_history():
    lookup = PromptLookup(2, 2, references=[[40, 41, 42, 43]])
    lookup.sync([1, 2, 40, 41])
    assert lookup.find(2) == ([42, 43], 2)


def test_sync_follows_appends_and_rebuilds_on_rewrite():
    lookup = PromptLookup(1, 2)
    lookup.sync([1, 2, 3])
    lookup.sync([1, 2, 3, 1])
    assert lookup.find(2)[0] == [2, 3]
    lookup.sync([7, 8, 7])
    assert lookup.history.tokens == [7, 8, 7] and lookup.find(1)[0] == [8]


def test_draft_length_follows_the_cost_curve_and_the_evidence():
    flat = DraftLength(CostCurve.flat())
    assert flat.choose(10, 3) == 10  # verification is free: verify everything
    cpu = DraftLength(CPU, priors={})
    assert cpu.choose(10, 3) == 0  # neutral prior 0.5: nothing pays on a CPU
    for _ in range(10):
        cpu.record(4, 15, 13)  # long drafts mostly accepted after 4-token matches
    assert 0.9 < cpu.acceptance(4) < 0.95
    assert cpu.choose(31, 4) == 15  # the cheap 16-token batch
    assert cpu.choose(31, 1) == 0  # other match lengths keep their own evidence
    for _ in range(40):
        cpu.record(4, 15, 0)
    assert cpu.choose(31, 4) == 0


def test_default_priors_trust_long_matches_only():
    d = DraftLength(CPU)
    assert d.choose(31, 4) > 8  # a 4-token match: start copying at once
    assert d.choose(31, 1) == 0  # a 1-token match: wait for evidence


def test_draft_length_evidence_decays_back_towards_the_prior():
    d = DraftLength(CPU, priors={}, decay=0.5)
    d.record(2, 10, 0)
    low = d.acceptance(2)
    for _ in range(10):
        d.record(3, 0, 0)
    assert low < d.acceptance(2) < 0.51


def test_replay_counts_and_cost():
    tokens = [1, 2, 3, 4, 5, 6, 7, 8] * 8
    drafter = LookupDrafter(PromptLookup(2, 4), DraftLength(CostCurve.flat()), 31)
    stats = replay(drafter, tokens, 8, CostCurve.flat().cost)
    assert stats.n_tokens == len(tokens) - 8
    assert stats.n_accept <= stats.n_drafted and stats.n_accept == stats.n_tokens - stats.n_steps
    assert stats.speedup == stats.n_tokens / stats.n_steps > 5  # periodic text: long drafts accepted
    plain = replay(NoDrafter(), tokens, 8, CPU.cost)
    assert plain.speedup == 1.0 and plain.n_drafted == 0


def test_lookup_drafter_learns_from_undrafted_candidates():
    """When it stops drafting, the first candidate token still shows whether drafting would pay."""
    d = LookupDrafter(PromptLookup(1, 4), DraftLength(CPU), 31)
    tokens = list(range(100, 140)) * 4  # pure repetition: every candidate is right
    stats = replay(d, tokens, 40, CPU.cost)
    assert stats.n_drafted > 0 and stats.speedup > 1.5


def test_chain_tries_drafters_in_order():
    lookup = LookupDrafter(PromptLookup(1, 2), DraftLength(CostCurve.flat()), 8)
    chain = ChainDrafter(lookup, NoDrafter())
    assert chain.name == "lookup+plain"
    stats = replay(chain, [1, 2, 3, 1, 2, 3, 1, 2, 3], 3, CostCurve.flat().cost)
    assert stats.n_accept > 0


def test_ngram_caches_follow_draft_and_persist(tmp_path):
    from llamaspec.config import LookupConfig
    path = tmp_path / "dynamic.bin"
    caches = NgramCaches.open(LookupConfig(cache_dynamic=str(path)), n_vocab=100)
    caches.follow([1, 2, 3, 4, 1, 2, 3])
    assert caches.draft([1, 2, 3, 4, 1, 2, 3], 2)  # context cache: 2 3 -> 4
    caches.finish([1, 2, 3, 4, 1, 2, 3])
    saved = NgramCache.load(path)
    assert saved.get((2, 3)) == {4: 1}
    caches.finish([1, 2, 3, 4, 1, 2, 3, 4])  # only the new n-grams are added
    assert NgramCache.load(path).get((2, 3)) == {4: 2}
