"""The acceptance model: per (source, evidence key) estimates learned from outcomes (no model)."""

import pytest

from llamaspec.planning.acceptance_model import MAX_RATE, AcceptanceModel, UnknownEvidence
from llamaspec.sources.base import Candidate, Outcome


def outcome(cands, emitted):
    return Outcome(tokens=[0, *emitted], candidates=tuple(cands), verified=tuple(len(c.tokens) for c in cands),
                   emitted=tuple(emitted))


def test_priors_then_evidence():
    m = AcceptanceModel(priors={"s": {1: 0.5, 9: 0.3}}, overall={"s": 0.2}, weight=2.0, decay=1.0)
    assert m.rate("s", 1) == 0.5 and m.rate("s", 9) == 0.3 and m.overall("s") == 0.2
    cand = Candidate((7, 8, 9), "s", (1, 1, 1))
    m.learn(outcome([cand], [7, 8, 5]))  # two accepted, the third rejected
    assert m.rate("s", 1) == pytest.approx((2 + 2 * 0.5) / (3 + 2))


def test_every_candidate_learns_verified_or_not_and_stops_at_its_first_miss():
    m = AcceptanceModel(priors={"a": dict.fromkeys(range(1, 5), 0.5), "b": {1: 0.5}}, overall={"a": 0.5, "b": 0.5},
                        weight=1.0, decay=1.0)
    full = Candidate((4, 5), "a", (1, 2))  # both tokens right: a fully accepted branch is no rejection
    other = Candidate((4, 6, 7), "a", (1, 3, 4))  # shares the first token (counted once), then wrong
    unverified = Candidate((9,), "b", (1,))  # never verified: wrong all the same
    m.learn(Outcome(tokens=[0, 4, 5, 3], candidates=(full, other, unverified), verified=(2, 3, 0), emitted=(4, 5, 3)))
    assert m.rate("a", 1) == pytest.approx((1 + 0.5) / 2)  # one observation of token 4, accepted
    assert m.rate("a", 2) == pytest.approx((1 + 0.5) / 2)
    assert m.rate("a", 3) == pytest.approx((0 + 0.5) / 2)  # token 6 was wrong
    assert m.rate("a", 4) == 0.5  # after a miss: no observation
    assert m.rate("b", 1) == pytest.approx(0.25)
    assert m.overall("a") == pytest.approx((2 + 0.5) / 4)


def test_counts_decay_so_recent_steps_weigh_most():
    def after(decay):
        m = AcceptanceModel(priors={"s": {1: 0.5}}, overall={"s": 0.5}, weight=1.0, decay=decay)
        for emitted in [1] * 20 + [2] * 3:  # twenty hits, then three misses
            m.learn(outcome([Candidate((1,), "s", (1,))], [emitted]))
        return m
    assert after(1.0).rate("s", 1) > 0.8 > 0.3 > after(0.5).rate("s", 1)
    m = after(0.5)
    m.forget(0.0)
    assert m.rate("s", 1) == 0.5 and m.evidence("s") == 0.0


def test_no_estimate_is_certain():
    m = AcceptanceModel(priors={"s": {1: 1.0}}, overall={"s": 1.0}, decay=1.0)
    for _ in range(100):
        m.learn(outcome([Candidate((1,), "s", (1,))], [1]))
    assert m.rate("s", 1) == MAX_RATE < 1


def test_a_key_without_a_prior_is_an_error_not_a_guess():
    """A source whose evidence key has no declared prior is a bug: the model says so instead of
    silently taking some default."""
    m = AcceptanceModel(priors={"s": {1: 0.5}}, overall={"s": 0.5})
    with pytest.raises(UnknownEvidence, match="the s source gave evidence 2"):
        m.rate("s", 2)
    with pytest.raises(UnknownEvidence, match="the t source"):
        m.rate("t", 1)
