"""The acceptance rules on token tries: greedy walks, and sampled walks whose emitted tokens are
distributed exactly as p (chi-square tests that wrong rules fail)."""

import collections
import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

from llamaspec.engine.verification import accept_probability, align, residual, walk_greedy, walk_sampled
from llamaspec.sources.base import Candidate
from llamaspec.sampling import Distribution, sample
from llamaspec.planning.trie import Trie

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


def chain(tokens, q=None):
    """The one-branch trie of a linear draft after pending token 0."""
    cand = Candidate(tuple(tokens), "test", (0,) * len(tokens), None if q is None else tuple(q))
    return Trie.build(0, [cand], [len(tokens)])


# --- greedy --------------------------------------------------------------------------


@pytest.mark.parametrize("target, draft, n", [
    ([1, 2, 3, 4], [1, 2, 3], 3),
    ([1, 2, 3, 4], [9, 2, 3], 0),
    ([1, 2, 3, 4], [1, 9, 3], 1),
    ([1, 2, 3, 4], [1, 2, 9], 2),
    ([5], [], 0),
])
def test_greedy_walk_of_a_linear_draft(target, draft, n):
    trie = chain(draft)
    path, token = walk_greedy(trie.children, lambda v: target[trie.depth[v]])
    assert len(path) == n and [trie.token[v] for v in path] == draft[:n]
    assert token == target[n]  # the correction, or the bonus token after a whole draft


def test_greedy_walk_takes_the_branch_the_target_takes():
    cands = [Candidate((5, 9, 9), "a", (0, 0, 0)), Candidate((5, 6, 7), "b", (0, 0, 0)),
             Candidate((4, 6, 7), "c", (0, 0, 0))]
    trie = Trie.build(0, cands, [3, 3, 3])
    target = {(): 5, (5,): 6, (5, 6): 7, (5, 6, 7): 8}

    def argmax(v):
        return target.get(tuple(trie.token[u] for u in trie.path(v)), 0)
    path, token = walk_greedy(trie.children, argmax)
    assert [trie.token[v] for v in path] == [5, 6, 7] and token == 8
    assert trie.sources(path[0], cands) == ("a", "b")  # the shared first node
    target[()] = 3  # no branch starts with the target's token
    assert walk_greedy(trie.children, argmax) == ([], 3)


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


def test_p_is_asked_only_where_the_walk_goes():
    asked = []
    q = [Distribution.point(1), Distribution.point(2), Distribution.point(3)]
    trie = chain([1, 2, 3], q)

    def p(v):
        asked.append(v)
        return Distribution.point(7) if v == 1 else Distribution.point(trie.depth[v] + 1)
    rng = np.random.default_rng(0)
    path, token = walk_sampled(trie.children, trie.q, p, rng)
    assert (len(path), token) == (1, 7) and asked == [0, 1]  # rejected at node 2, nothing asked past it


# --- sampled walks emit tokens distributed as p ----------------------------------------


def reject_to_p(children, q, p, rng):
    """WRONG: the right acceptance test, but a rejection resamples from p, not the residual."""
    (c,) = children[0].values()
    x = next(iter(children[0]))
    if rng.random() < accept_probability(p(0).prob(x), q[c].prob(x)):
        return [c], sample(p(c), rng)
    return [], sample(p(0), rng)


def accept_always(children, q, p, rng):
    """WRONG: accept every drafted token."""
    (c,) = children[0].values()
    return [c], sample(p(c), rng)


def first_token_counts(p, q, n_vocab, seed, walk=walk_sampled):
    """Counts of the first emitted token over N_DRAWS one-token speculative steps."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(n_vocab, dtype=np.int64)
    bonus = dist(np.ones(n_vocab))
    for _ in range(N_DRAWS):
        x = sample(q, rng)
        trie = chain([x], [q])
        path, token = walk(trie.children, trie.q, lambda v: p if v == 0 else bonus, rng)
        counts[x if path else token] += 1
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
    counts = first_token_counts(p, q, V, seed=1234, walk=wrong)
    assert not looks_like(counts, dense(p, V))


def test_two_token_draft_joint_distribution():
    """The first two emitted tokens of a sampled two-token draft are distributed as p(x1) p(x2 | x1)."""
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
        trie = chain([x1, x2], [q1, q2[x1]])
        rows = {0: p1, 1: p2[x1], 2: bonus}
        path, token = walk_sampled(trie.children, trie.q, rows.__getitem__, rng)
        emitted = [trie.token[v] for v in path] + [token]
        if len(emitted) == 1:  # rejected at once: the next step samples after it
            emitted.append(sample(p2[emitted[0]], rng))
        joint[emitted[0], emitted[1]] += 1
    expected = np.outer(dense(p1, n), np.ones(n)) * np.array([dense(r, n) for r in p2])
    assert looks_like(joint.ravel(), expected.ravel())


def test_sampled_trie_of_a_draft_and_deterministic_candidates_keeps_p():
    """A node with a sampled child (x ~ q) and deterministic siblings: the q test first, then
    a residual sample matched against the siblings. Two emitted tokens ~ p(x1) p(x2 | x1)."""
    vocab = 4
    rng = np.random.default_rng(0)
    p0 = dist([0.5, 0.3, 0.15, 0.05])
    p1 = {x: dist(rng.dirichlet(np.ones(vocab))) for x in range(vocab)}  # p(second | first)
    q0 = dist([0.1, 0.6, 0.2, 0.1])
    bonus = dist(np.ones(vocab))
    det = [Candidate((0, 1), "lookup", (0, 0)), Candidate((0, 2), "lookup", (0, 0)), Candidate((3, 3), "pool", (0, 0))]

    def run(seed):
        r = np.random.default_rng(seed)
        x = sample(q0, r)
        cands = det + [Candidate((x,), "draft", (0,), (q0,))]
        trie = Trie.build(0, cands, [2, 2, 2, 1])

        def p(v):
            if v == 0:
                return p0
            return p1[trie.token[v]] if trie.depth[v] == 1 else bonus
        path, token = walk_sampled(trie.children, trie.q, p, r)
        emitted = [trie.token[v] for v in path] + [token]
        if len(emitted) == 1:
            emitted.append(sample(p1[emitted[0]], r))
        return tuple(emitted[:2])

    n_runs = 8000
    counts = collections.Counter(run(seed) for seed in range(n_runs))
    pairs = list(itertools.product(range(vocab), repeat=2))
    expected = np.array([p0.prob(a) * p1[a].prob(b) for a, b in pairs])
    observed = np.array([counts[pair] for pair in pairs])
    assert looks_like(observed, expected)
