import numpy as np
import pytest
from scipy.stats import chisquare

from llamaspec.acceptance import (
    accept_greedy,
    accept_probability,
    align,
    residual,
    verify_greedy,
    verify_sampled,
)
from llamaspec.sampling import Distribution, sample

N_DRAWS = 20000


def dist(probs):
    """A Distribution from dense probabilities over tokens 0..n-1 (zeros left out)."""
    probs = np.asarray(probs, dtype=np.float64)
    ids = np.flatnonzero(probs)
    return Distribution(ids.astype(np.int64), probs[ids] / probs[ids].sum())


def dense(d, n):
    out = np.zeros(n)
    out[d.ids] = d.probs
    return out


# --- greedy --------------------------------------------------------------------------


@pytest.mark.parametrize("target, draft, n", [
    ([1, 2, 3, 4], [1, 2, 3], 3),
    ([1, 2, 3, 4], [9, 2, 3], 0),
    ([1, 2, 3, 4], [1, 9, 3], 1),
    ([1, 2, 3, 4], [1, 2, 9], 2),
    ([5], [], 0),
    ([1, 2], [1, 2], 2),
])
def test_accept_greedy(target, draft, n):
    assert accept_greedy(np.array(target), np.array(draft, dtype=np.int64)) == n


def test_verify_greedy():
    assert verify_greedy(np.array([1, 2, 3, 4]), np.array([1, 2, 3])) == (3, 4)
    assert verify_greedy(np.array([1, 2, 3, 4]), np.array([1, 7, 3])) == (1, 2)
    assert verify_greedy(np.array([5]), np.array([], dtype=np.int64)) == (0, 5)


# --- the pieces ----------------------------------------------------------------------


def test_align():
    p = Distribution(np.array([5, 2]), np.array([0.75, 0.25]))
    q = Distribution(np.array([9, 5]), np.array([0.5, 0.5]))
    ids, p_dense, q_dense = align(p, q)
    assert ids.tolist() == [2, 5, 9]
    assert p_dense.tolist() == [0.25, 0.75, 0.0]
    assert q_dense.tolist() == [0.0, 0.5, 0.5]


def test_accept_probability():
    assert accept_probability(0.2, 0.4) == 0.5
    assert accept_probability(0.6, 0.3) == 1.0
    assert accept_probability(0.0, 0.3) == 0.0


@pytest.mark.parametrize("p, q, r", [
    ([0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]),            # q a point mass
    ([0.6, 0.4, 0.0], [0.2, 0.2, 0.6], [0.4 / 0.6, 0.2 / 0.6, 0.0]),  # q has mass where p has none
    ([0.0, 1.0, 0.0], [0.3, 0.3, 0.4], [0.0, 1.0, 0.0]),            # p a point mass
    ([0.2, 0.3, 0.5], [0.2, 0.3, 0.5], [0.2, 0.3, 0.5]),            # p == q: p itself
])
def test_residual(p, q, r):
    assert np.allclose(residual(np.array(p), np.array(q)), r)


def test_p_rows_are_computed_lazily():
    asked = []

    def p_row(i):
        asked.append(i)
        return Distribution.point(7) if i == 1 else Distribution.point(i)

    rng = np.random.default_rng(0)
    q_rows = [Distribution.point(0), Distribution.point(1), Distribution.point(2)]
    # p_1 is a point mass on 7, so draft[1] == 1 is rejected and 7 is emitted.
    assert verify_sampled(p_row, q_rows, [0, 1, 2], rng) == (1, 7)
    assert asked == [0, 1]
    asked.clear()
    p_rows = [Distribution.point(0), Distribution.point(1), Distribution.point(2), Distribution.point(3)]
    assert verify_sampled(lambda i: asked.append(i) or p_rows[i], q_rows, [0, 1, 2], rng) == (3, 3)
    assert asked == [0, 1, 2, 3]


# --- speculative sampling emits tokens distributed as p --------------------------------


def reject_to_p(p_row, q_rows, draft, rng):
    """WRONG: the right acceptance test, but a rejection resamples from p, not the residual."""
    p, q = p_row(0), q_rows[0]
    if rng.random() < accept_probability(p.prob(draft[0]), q.prob(draft[0])):
        return 1, sample(p_row(1), rng)
    return 0, sample(p, rng)


def accept_always(p_row, q_rows, draft, rng):
    """WRONG: accept every drafted token."""
    return len(draft), sample(p_row(len(draft)), rng)


def first_token_counts(p, q, n_vocab, seed, verify=verify_sampled):
    """Counts of the first emitted token over N_DRAWS one-token speculative steps."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(n_vocab, dtype=np.int64)
    bonus = dist(np.ones(n_vocab))
    for _ in range(N_DRAWS):
        x = sample(q, rng)
        n, token = verify([p, bonus].__getitem__, [q], [x], rng)
        counts[x if n == 1 else token] += 1
    return counts


def looks_like(counts, expected_probs):
    """True when counts plausibly come from expected_probs (chi-square p-value > 1e-3)."""
    support = expected_probs > 0
    if counts[~support].any():
        return False
    if support.sum() == 1:
        return True
    return chisquare(counts[support], counts.sum() * expected_probs[support]).pvalue > 1e-3


V = 6
PAIRS = {
    "different": ([0.3, 0.2, 0.15, 0.15, 0.1, 0.1], [0.05, 0.1, 0.4, 0.05, 0.3, 0.1]),
    "q-mass-where-p-has-none": ([0.5, 0.3, 0.2, 0.0, 0.0, 0.0], [0.1, 0.1, 0.1, 0.3, 0.2, 0.2]),
    "q-point-mass-in-p": ([0.3, 0.2, 0.15, 0.15, 0.1, 0.1], [0, 0, 1, 0, 0, 0]),
    "q-point-mass-outside-p": ([0.5, 0.3, 0.2, 0.0, 0.0, 0.0], [0, 0, 0, 0, 1, 0]),
    "q-equals-p": ([0.3, 0.2, 0.15, 0.15, 0.1, 0.1], [0.3, 0.2, 0.15, 0.15, 0.1, 0.1]),
    "p-point-mass": ([0, 0, 0, 1, 0, 0], [0.2, 0.2, 0.2, 0.2, 0.1, 0.1]),
    "disjoint": ([0.6, 0.4, 0, 0, 0, 0], [0, 0, 0.25, 0.25, 0.25, 0.25]),
}


@pytest.mark.parametrize("name", PAIRS)
def test_first_token_is_distributed_as_p(name):
    p, q = (dist(x) for x in PAIRS[name])
    counts = first_token_counts(p, q, V, seed=1234)
    assert looks_like(counts, dense(p, V))


@pytest.mark.parametrize("wrong", [accept_always, reject_to_p])
@pytest.mark.parametrize("name", ["different", "q-mass-where-p-has-none", "q-point-mass-in-p"])
def test_wrong_rules_fail_the_same_check(wrong, name):
    p, q = (dist(x) for x in PAIRS[name])
    counts = first_token_counts(p, q, V, seed=1234, verify=wrong)
    assert not looks_like(counts, dense(p, V))


def test_two_token_draft_joint_distribution():
    """The first two emitted tokens are distributed as p(x1) p(x2 | x1)."""
    n = 4
    p1 = dist([0.1, 0.2, 0.3, 0.4])
    p2 = [dist(r) for r in ([0.7, 0.1, 0.1, 0.1], [0, 0, 0.5, 0.5], [0.25, 0.25, 0.25, 0.25], [0, 1, 0, 0])]
    q1 = dist([0.4, 0.4, 0.1, 0.1])
    q2 = [dist(r) for r in ([0.1, 0.1, 0.1, 0.7], [0.5, 0.5, 0, 0], [0, 0, 0, 1], [0.25, 0.25, 0.25, 0.25])]
    bonus = dist(np.ones(n))
    rng = np.random.default_rng(99)
    joint = np.zeros((n, n), dtype=np.int64)
    for _ in range(N_DRAWS):
        x1 = sample(q1, rng)
        x2 = sample(q2[x1], rng)
        k, token = verify_sampled([p1, p2[x1], bonus].__getitem__, [q1, q2[x1]], [x1, x2], rng)
        emitted = [x1, x2][:k] + [token]
        if len(emitted) == 1:  # rejected at once: the next step drafts one token after it
            t = emitted[0]
            y = sample(q2[t], rng)
            k, token = verify_sampled([p2[t], bonus].__getitem__, [q2[t]], [y], rng)
            emitted.append(y if k == 1 else token)
        joint[emitted[0], emitted[1]] += 1
    expected = np.outer(dense(p1, n), np.ones(n)) * np.array([dense(r, n) for r in p2])
    assert looks_like(joint.ravel(), expected.ravel())
