"""Draft heads without a model: the tree, the heads file and its errors, the training step's
gradients, the token map, the source's proposals, and exact sampling through the heads' tree."""

from __future__ import annotations

import json
import time
from typing import List, Optional

import numpy as np
import pytest
from scipy.stats import chisquare

from llamaspec.config import SamplingConfig
from llamaspec.engine.verification import walk_sampled
from llamaspec.planning.acceptance_model import AcceptanceModel
from llamaspec.planning.costs import CostCurve, CostModel
from llamaspec.planning.planner import Limits, Planner
from llamaspec.planning.speculator import Speculator, _share
from llamaspec.planning.trie import Trie
from llamaspec.sampling import Distribution
from llamaspec.sources.base import Budget, Candidate, Outcome, Proposal
from llamaspec.draft_heads import FORMAT, Heads, HeadsError, largest, silu
from llamaspec.sources.heads import PLUGIN, PRIORS, Guess, HeadsSource, tree
from llamaspec.training.fit import (DEPTH_1, Adam, chain_step, folded, held_out, split, targets, token_map, TrainConfig,
                                    train)
from llamaspec.training.data import SPREAD, States, best

D, N, V, R = 8, 12, 40, 5


def fake_heads(k=3, seed=0):
    rng = np.random.default_rng(seed)
    tokens = np.sort(rng.choice(V, N, replace=False))
    return Heads(rng.normal(0, 0.3, (R, 2 * D)).astype(np.float32), rng.normal(0, 0.1, R).astype(np.float32),
                 rng.normal(0, 0.3, (D, R)).astype(np.float32),
                 tokens, rng.normal(0, 1, (N, D)).astype(np.float32), k,
                 {"format": FORMAT, "n_vocab": V, "n_embd": D, "sha256": "x", "model": "fake.gguf", "heads": k,
                  "n_tokens": N})


def test_a_pending_token_is_its_row_of_the_map_s_output_matrix_or_zero():
    heads = fake_heads()
    on, off = int(heads.tokens[3]), next(t for t in range(V) if t not in heads.tokens)
    assert np.array_equal(heads.pending(on), heads.out[3]) and not heads.pending(off).any()
    assert np.array_equal(heads.pending(np.array([on, off])), np.stack([heads.out[3], np.zeros(D)]))


def test_the_drafter_computes_the_heads_logits_as_defined():
    """Head k is the block's k-th step, each step reading a token (the pending one, then one
    taken to be guessed): the drafter's products of V^z z and E_N z are those of z itself."""
    heads = fake_heads()
    drafter = heads.drafter()
    h = np.random.default_rng(3).normal(0, 1, D).astype(np.float32)
    on, off = int(heads.tokens[7]), next(t for t in range(V) if t not in heads.tokens)
    for read in ([on, int(heads.tokens[0]), off], [off, off, on], [int(heads.tokens[-1]), V + 5, -1]):
        at, rows = drafter.start(h, drafter.base(h)), []
        for token in read:
            at = drafter.head(at, token)
            rows.append(at.logits)
        assert np.allclose(np.stack(rows), heads.logits(h, read), atol=1e-4)
    z = h + silu(heads.w @ np.concatenate([h, heads.pending(on)]) + heads.b) @ heads.u.T  # head 1 by hand
    assert np.allclose(heads.logits(h, [on])[0], heads.out @ z, atol=1e-5)
    rows = np.random.default_rng(4).normal(0, 1, (5, D)).astype(np.float32)  # B rows at once: as one at a time
    e = heads.pending(heads.tokens[:5])
    assert np.allclose(heads.step(rows, e), np.stack([heads.step(r, x) for r, x in zip(rows, e)]), atol=1e-5)


def test_tree_keeps_the_paths_worth_most_and_their_prefixes():
    guesses = [[(10, 0.9), (11, 0.3)], [(20, 0.8), (21, 0.5)], [(30, 0.2), (31, 0.1)]]
    leaves = tree(guesses, max_nodes=4, max_len=3)
    # nodes by value: (0,)=.9 (0,0)=.72 (0,1)=.45 (1,)=.3 -> leaves (0,0), (0,1), (1,)
    assert leaves == [[0, 0], [0, 1], [1]]
    assert tree(guesses, max_nodes=3, max_len=1) == [[0], [1]]
    assert tree(guesses, max_nodes=1, max_len=3) == [[0]]
    assert tree([], 8, 3) == [] and tree(guesses, 0, 3) == []
    # a deeper head follows its predecessor's best token only: (0, 1) and (1,) are never extended
    assert tree(guesses, max_nodes=7, max_len=3) == [[0, 1], [1], [0, 0, 0], [0, 0, 1]]


def test_a_head_s_best_tokens_are_its_largest_logits_largest_first():
    rng = np.random.default_rng(5)
    for n in (1, 4, 9):
        row = rng.normal(0, 3, 9).astype(np.float32)
        kept = row.copy()
        assert list(largest(row, n)) == list(np.argsort(-row)[:n])
        assert np.array_equal(row, kept)  # the logits are the next head's start: left as they were


def test_heads_file_round_trip_and_its_errors(tmp_path):
    heads = fake_heads()
    path = tmp_path / "h.heads.npz"
    heads.save(path)
    back = Heads.read(path)
    assert np.allclose(back.w, heads.w, atol=1e-3) and np.allclose(back.u, heads.u, atol=1e-3)
    assert np.array_equal(back.tokens, heads.tokens)
    assert np.allclose(back.out, heads.out, atol=1e-2)
    assert back.meta == heads.meta and back.k == 3
    cut = tmp_path / "cut.heads.npz"
    cut.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
    for bad, words in ((cut, "cut short"), (tmp_path / "none.npz", "no such heads file")):
        with pytest.raises(HeadsError, match=words) as e:
            Heads.read(bad)
        assert "\n" not in str(e.value)
    other = tmp_path / "other.npz"
    np.savez(other, w=heads.w, b=heads.b, tokens=heads.tokens, out=heads.out,
             meta=np.frombuffer(b'{"format": "something else"}', dtype=np.uint8))
    with pytest.raises(HeadsError, match="other.npz is a something else file, not llamaspec-heads-4; train it again"):
        Heads.read(other)


def test_a_file_of_independent_heads_is_one_line_asking_to_train_again(tmp_path):
    """llamaspec-heads-3 and before kept a block per head, each on h alone: not read."""
    heads = fake_heads()
    old = tmp_path / "old.heads.npz"
    np.savez(old, w=np.stack([heads.w] * 3), b=np.stack([heads.b] * 3), u=np.stack([heads.u] * 3),
             tokens=heads.tokens, out=heads.out.astype(np.float16), calibration=heads.calibration,
             meta=np.frombuffer(json.dumps(dict(heads.meta, format="llamaspec-heads-3")).encode(), dtype=np.uint8))
    with pytest.raises(HeadsError, match="is a llamaspec-heads-3 file, not llamaspec-heads-4; train it again") as e:
        Heads.read(old)
    assert "\n" not in str(e.value)


def test_heads_for_another_model_are_refused(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF not really")
    heads = fake_heads()
    with pytest.raises(HeadsError, match="trained for fake.gguf, not model.gguf") as e:
        heads.check_model(model, V, D, tmp_path / "h.heads.npz")
    assert "\n" not in str(e.value)


def chain_inputs(seed, k=2, b=5):
    rng = np.random.default_rng(seed)
    v, c, u = rng.normal(0, 0.3, (R, 2 * D)), rng.normal(0, 0.1, R), rng.normal(0, 0.3, (D, R))
    out, h = rng.normal(0, 1, (N, D)), rng.normal(0, 1, (b, D))
    e = [rng.normal(0, 1, (b, D)) for _ in range(k)]
    mu, sd = rng.normal(0, 0.5, 2 * D), np.exp(rng.normal(0, 0.5, 2 * D))  # the block's input standardised
    return rng, (v, c, u), out, h, e, mu, sd


def test_the_training_step_s_gradients_are_the_loss_s_through_every_step():
    """Two steps of the block, the second reading the first's z: each parameter's gradient is the
    loss's change, and so is the loss the sum of the steps' weighted cross-entropies."""
    rng, params, out, h, e, mu, sd = chain_inputs(3)
    t = [targets(rng.integers(0, N, 5), N) for _ in e]
    t[1][2] = 0.0  # row 2 has nothing to learn at step 2
    loss, *grads = chain_step(*params, out, h, e, t, mu, sd)
    eps = 1e-6
    # (2, D + 3): the token read's row
    for p, g, at in ((0, grads[0], ((0, 0), (3, 5), (2, D + 3))), (1, grads[1], ((4,),)), (2, grads[2], ((7, 2),))):
        for i in at:
            moved = [x.copy() for x in params]
            moved[p][i] += eps
            assert (chain_step(*moved, out, h, e, t, mu, sd)[0] - loss) / eps == pytest.approx(g[i], rel=1e-3, abs=1e-6)
    v, c, u = params
    z, want = h, 0.0
    for j, (e_j, t_j) in enumerate(zip(e, t)):
        z = z + silu(((np.concatenate([z, e_j], 1) - mu) / sd) @ v.T + c) @ u.T
        logp = z @ out.T - np.log(np.exp(z @ out.T).sum(1, keepdims=True))
        want += (DEPTH_1 if j == 0 else 1.0) * -(t_j * logp).sum() / len(h)
    assert loss == pytest.approx(want, rel=1e-9)


def test_the_soft_targets_are_the_target_s_distribution_on_the_map():
    y = np.array([2, 5, 7])
    ids = np.array([[2, 3, -1], [5, -1, -1], [-1, -1, -1]])  # -1: off the map
    p = np.array([[0.5, 0.25, 0.25], [0.6, 0.3, 0.1], [0.7, 0.2, 0.1]], np.float32)
    t = targets(y, N, (ids, p))
    assert t[0, 2] == pytest.approx(2 / 3) and t[0, 3] == pytest.approx(1 / 3)  # renormalised on the map
    assert t[1, 5] == 1.0 and t[2, 7] == 1.0  # all off the map: the target's choice
    rng, params, out, h, e, mu, sd = chain_inputs(4, k=1, b=3)
    loss, dv, _, du = chain_step(*params, out, h, e, [t], mu, sd)
    v2, u2 = params[0].copy(), params[2].copy()
    v2[1, 4] += 1e-6
    u2[3, 1] += 1e-6
    moved_v = chain_step(v2, params[1], params[2], out, h, e, [t], mu, sd)[0]
    moved_u = chain_step(params[0], params[1], u2, out, h, e, [t], mu, sd)[0]
    assert (moved_v - loss) / 1e-6 == pytest.approx(dv[1, 4], rel=1e-3, abs=1e-6)
    assert (moved_u - loss) / 1e-6 == pytest.approx(du[3, 1], rel=1e-3, abs=1e-6)


def test_the_target_s_best_tokens_and_their_probabilities_are_its_softmax_s():
    """best() looks only near each row's best: the same tokens and probabilities as a full sort of
    the softmax, the argmax first (the first of equal bests), and a peaked row filled with its
    best token at probability 0."""
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((40, 5000)) * 2).astype(np.float32)
    logits[:, 7] += np.linspace(0, 30, 40, dtype=np.float32)  # from flat rows to peaked ones
    logits[0, [11, 12]] = logits[0].max() + 1  # a tie: the first is the argmax
    ids, p = best(logits)
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    z /= z.sum(axis=1, keepdims=True)
    order = np.argsort(-z, axis=1, kind="stable")[:, :8]
    near = np.take_along_axis(logits, order, axis=1) >= logits.max(axis=1, keepdims=True) - SPREAD
    assert np.array_equal(ids[:, 0], logits.argmax(axis=1)) and ids[0, 0] == 11 and ids[0, 1] == 12
    assert np.array_equal(ids[near], order[near]) and np.allclose(p[near], np.take_along_axis(z, order, axis=1)[near])
    assert not near.all() and (p[~near] == 0).all() and (ids[~near] == ids[:, :1].repeat(8, axis=1)[~near]).all()


def test_adam_in_place_moves_the_parameters_as_the_textbook_rule():
    rng = np.random.default_rng(3)
    params = [rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal(4).astype(np.float32)]
    ref = [p.astype(np.float64) for p in params]
    m, v = [np.zeros_like(p) for p in ref], [np.zeros_like(p) for p in ref]
    adam = Adam([p.shape for p in params])
    for t in range(1, 6):
        grads = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
        adam.step(params, grads, 0.01)
        for p, g, m_, v_ in zip(ref, grads, m, v):
            m_[:] = 0.9 * m_ + 0.1 * g
            v_[:] = 0.999 * v_ + 0.001 * g * g
            p -= 0.01 * (m_ / (1 - 0.9 ** t)) / (np.sqrt(v_ / (1 - 0.999 ** t)) + 1e-8)
    for p, r in zip(params, ref):
        np.testing.assert_allclose(p, r, rtol=1e-5, atol=1e-6)


def test_token_map_takes_the_most_frequent_tokens():
    labels = np.array([5] * 50 + [7] * 30 + [9] * 15 + [1] * 5)
    tokens, coverage = token_map(labels, 2, 20)
    assert list(tokens) == [5, 7] and coverage == pytest.approx(0.8)
    tokens, coverage = token_map(labels, 0, 20)  # chosen: at least MIN_TOKENS, capped by the vocabulary
    assert len(tokens) == 20 and coverage == 1.0


def test_training_learns_a_rule_the_heads_can_express():
    """The token after the next one is a fixed function of the hidden state (the output matrix on
    its coordinates permuted), which the untrained head misses: the trained head finds it."""
    rng = np.random.default_rng(0)
    n, d = 3000, 16
    hidden = rng.normal(0, 1, (n, d)).astype(np.float32)
    out = rng.normal(0, 1, (64, d)).astype(np.float32)
    ahead = (hidden[:, rng.permutation(d)] @ out.T).argmax(axis=1)
    labels = np.roll(ahead, 1)  # labels[i + 1]: head 1's token at row i
    states = States(hidden, labels, np.arange(n) // 100, labels[:, None], np.ones((n, 1), np.float32),
                    rng.integers(0, 64, n))
    heads, report = train(states, 64, lambda t: out[t], TrainConfig(heads=1, n_tokens=64, epochs=20, lr=1e-2),
                          {"format": FORMAT})
    assert report.top1[0] > report.base_top1[0] + 0.1, report


def test_blocks_trained_on_standardised_inputs_fold_back_onto_the_raw_ones():
    rng = np.random.default_rng(5)
    k, d = 2, 6
    w, b = rng.normal(0, 1, (k, d, 2 * d)).astype(np.float32), rng.normal(0, 1, (k, d)).astype(np.float32)
    mu = rng.normal(0, 50, 2 * d).astype(np.float32)
    sd = np.exp(rng.normal(0, 3, 2 * d)).astype(np.float32)
    x = (mu + sd * rng.normal(0, 1, (7, 2 * d))).astype(np.float32)
    w_x, b_x = folded(w, b, mu, sd)
    assert w_x.dtype == np.float32 and np.array_equal(w_x, w_x.astype(np.float16).astype(np.float32))  # as kept
    np.testing.assert_allclose(np.einsum("kij,nj->kni", w_x, x) + b_x[:, None, :],
                               np.einsum("kij,nj->kni", w, (x - mu) / sd) + b[:, None, :], atol=2e-2)
    w_x, b_x = folded(np.full((1, 2, 4), 100, np.float32), np.zeros((1, 2), np.float32), np.zeros(4, np.float32),
                      np.full(4, 1e-3, np.float32))  # 1e5: beyond float16's range
    assert np.isfinite(w_x).all() and np.isfinite(b_x).all()


def test_training_stops_at_its_deadline_and_still_measures_the_heads():
    """A deadline already past trains no step (the heads as untrained, measured on the held-out
    rows all the same); one never reached trains every epoch."""
    rng = np.random.default_rng(2)
    n, d = 1000, 8
    hidden = rng.normal(0, 1, (n, d)).astype(np.float32)
    labels = rng.integers(0, 16, n)
    states = States(hidden, labels, np.arange(n) // 100, labels[:, None], np.ones((n, 1), np.float32), labels)
    out = rng.normal(0, 1, (16, d)).astype(np.float32)
    config = TrainConfig(heads=2, n_tokens=16, epochs=2)
    late, report = train(states, 16, lambda t: out[t], config, {"format": FORMAT}, deadline=time.perf_counter())
    assert report.out_of_time and not report.interrupted and report.steps == 0 and not late.u.any()
    assert report.held_out_rows > 0 and report.top1 == report.base_top1
    _, full = train(states, 16, lambda t: out[t], config, {"format": FORMAT})
    rows, _ = states.ahead(1, split(states, config.held_out, config.seed)[0])  # head 1 has the most rows
    assert not full.out_of_time and full.steps == int(np.ceil(2 * len(rows) / config.batch)), full


def test_training_learns_from_the_pending_token():
    """The token after the pending one is a function of the pending token alone (nothing in the
    hidden state tells it): the heads learn it from the pending token's row of E_N, and cannot
    where the text's pending tokens are not given."""
    rng = np.random.default_rng(1)
    n, d, v = 3000, 16, 64
    hidden = rng.normal(0, 1, (n, d)).astype(np.float32)
    pending = rng.integers(0, v, n)
    out = rng.normal(0, 1, (v, d)).astype(np.float32)
    after = (out[pending] @ rng.normal(0, 1, (d, d)) @ out.T).argmax(axis=1)  # the token after the pending one
    labels = np.roll(after, 1)
    config = TrainConfig(heads=1, n_tokens=v, epochs=20, lr=1e-2)
    states = States(hidden, labels, np.arange(n) // 100, labels[:, None], np.ones((n, 1), np.float32), pending)
    _, report = train(states, v, lambda t: out[t], config, {"format": FORMAT})
    states.next = np.full(n, -1)
    _, blind = train(states, v, lambda t: out[t], config, {"format": FORMAT})
    assert report.base_top1[0] < 0.1 and report.top1[0] > 0.3 and blind.top1[0] < 0.15, (report, blind)


def test_the_calibration_says_how_often_a_head_was_right_and_the_source_goes_by_it():
    heads = fake_heads(k=1)
    rng = np.random.default_rng(2)
    n = 400
    hidden = rng.normal(0, 1, (n, D)).astype(np.float32)
    never = np.full(n, V + 1)  # a token off the map: the head is never right
    states = States(hidden, never, np.zeros(n, np.int64), never[:, None], np.ones((n, 1), np.float32),
                    rng.integers(0, V, n))
    top1, top5, wrong = held_out(heads, states, np.arange(n), weight=5.0)
    assert top1 == [0.0] and top5 == [0.0]
    seen = np.flatnonzero(wrong[0] < np.arange(11) / 10)
    assert len(seen) >= 2 and (wrong[0, seen] < 0.5 * np.arange(11)[seen] / 10).all()  # shrunk towards 0
    heads.calibration = np.zeros((1, 11))
    source = HeadsSource(heads.drafter(), max_nodes=8)
    source.learn(Outcome(tokens=[1, 2, 3], candidates=(), verified=(), emitted=(3,), hidden=hidden[0]))
    proposal = source.propose([1, 2, 3], budget(), SamplingConfig(), np.random.default_rng(0))
    assert proposal.candidates and all(e == Guess(1, 0) for c in proposal.candidates for e in c.evidence)


def budget(max_len=3, candidates=4):
    return Budget(max_len=max_len, max_candidates=candidates)


def test_the_source_proposes_after_the_hidden_state_of_its_text_only():
    heads = fake_heads()
    source = HeadsSource(heads.drafter(), max_nodes=8)
    rng = np.random.default_rng(0)
    assert source.propose([1, 2, 3], budget(), SamplingConfig(), rng).candidates == ()  # nothing learned yet
    h = np.random.default_rng(1).normal(0, 1, D).astype(np.float32)
    source.learn(Outcome(tokens=[1, 2, 3], candidates=(), verified=(), emitted=(3,), hidden=h))
    assert source.propose([1, 2, 3, 4], budget(), SamplingConfig(), rng).candidates == ()  # another text
    proposal = source.propose([1, 2, 3], budget(), SamplingConfig(), rng)
    assert 1 <= len(proposal.candidates) <= 4
    for c in proposal.candidates:
        assert all(isinstance(e, Guess) and e in PRIORS for e in c.evidence)
        assert all(t in source.heads.tokens for t in c.tokens) and len(c.tokens) <= 3
    best = [3]  # the heads' best path: each head reads the best token before it
    for k in range(3):
        best.append(int(heads.tokens[heads.logits(h, best)[k].argmax()]))
    assert any(list(c.tokens) == best[1:1 + len(c.tokens)] for c in proposal.candidates)
    for c in proposal.candidates:  # every other token is a sibling of that path's
        assert list(c.tokens[:-1]) == best[1:len(c.tokens)]
    assert all(len(c.tokens) <= 1 for c in source.propose([1, 2, 3], budget(max_len=1), SamplingConfig(),
                                                           rng).candidates)
    assert set(PRIORS) == set(PLUGIN.priors)


class Counting:
    """A drafter that counts the heads it computes."""

    def __init__(self, drafter):
        self.drafter, self.computed = drafter, []

    def __getattr__(self, name):
        return getattr(self.drafter, name)

    def head(self, at, token):
        self.computed.append(sum(1 for c in self.computed if c != "base") + 1)  # head k: the step's k-th
        return self.drafter.head(at, token)


class CountingBase(Counting):
    """A drafter that counts its E_N h products too."""

    def base(self, h):
        self.computed.append("base")
        return self.drafter.base(h)


@pytest.mark.parametrize("scale, spared", [(1.0, True), (1.003, True), (1.5, False)])
def test_the_source_takes_e_n_h_from_the_target_s_logits_where_they_are_that(scale, spared):
    """The target's logits on the map are E_N h (llama.cpp's from the quantized matrix, a little
    apart): the heads then spare that product every step but the first (where it is checked);
    a model whose logits are not (here scaled) gets it computed every step. The proposals are
    those of the hidden state alone either way."""
    heads = CountingBase(fake_heads().drafter())
    source = HeadsSource(heads, max_nodes=8)  # type: ignore[arg-type]
    alone = HeadsSource(fake_heads().drafter(), max_nodes=8)
    rng = np.random.default_rng(1)
    for step in range(3):
        h = rng.normal(0, 1, D).astype(np.float32)
        logits = rng.normal(0, 1, V).astype(np.float32)
        logits[heads.tokens] = scale * (heads.out @ h)
        tokens = [1, 2, 3 + step]
        source.learn(Outcome(tokens=tokens, candidates=(), verified=(), emitted=(3,), hidden=h, logits=logits))
        alone.learn(Outcome(tokens=tokens, candidates=(), verified=(), emitted=(3,), hidden=h))
        heads.computed.clear()
        got, want = (s.propose(tokens, budget(), SamplingConfig(), np.random.default_rng(0)).candidates
                     for s in (source, alone))
        assert got and [c.tokens for c in got] == [c.tokens for c in want]
        assert ("base" in heads.computed) == (not spared) and heads.computed.count(1) == 1
    assert source.logits_are_base is spared


def test_a_deeper_head_is_computed_only_where_its_tokens_could_be_worth_a_row():
    """A head's products are spared once the best path so far is estimated under the budget's
    stop_below (a token deeper is estimated lower still): its priors here are 0.1 a decile of
    the head's probability."""
    heads = Counting(fake_heads().drafter())
    source = HeadsSource(heads, max_nodes=8)  # type: ignore[arg-type]
    h = np.random.default_rng(1).normal(0, 1, D).astype(np.float32)
    source.learn(Outcome(tokens=[1, 2, 3], candidates=(), verified=(), emitted=(3,), hidden=h))

    def ask(stop_below):
        heads.computed.clear()
        proposal = source.propose([1, 2, 3], Budget(3, 4, stop_below=stop_below), SamplingConfig(),
                                  np.random.default_rng(0))
        return heads.computed[:], proposal.candidates
    computed, everything = ask(0.0)
    assert computed == [1, 2, 3] and max(len(c.tokens) for c in everything) == 3
    best = [max(PRIORS[e] for c in everything for e in c.evidence[i:i + 1]) for i in range(3)]
    computed, candidates = ask(best[0] - 1e-6)  # head 2's tokens could still be worth a row
    assert computed == [1, 2] and max(len(c.tokens) for c in candidates) <= 2
    computed, candidates = ask(best[0] + 1e-6)
    assert computed == [1] and candidates and all(len(c.tokens) == 1 for c in candidates)
    assert ask(1.5) == ([], ())  # no token is estimated worth a row: nothing computed


def test_the_speculator_tells_a_source_with_a_gate_of_its_own_what_a_row_must_be_worth():
    budgets = {}

    class Seen(Slow):
        def propose(self, tokens, budget, sampling, rng):
            budgets[self.name] = budget
            return Proposal()

    class Other(Seen):
        name, own_gate = "lookup", False
    curve = CostCurve(relative=[float(n) for n in range(1, 33)], ms_per_token=1.0, threads=1, backend="test")
    sp = Speculator([Seen(0.0, True), Other(0.0, True)], AcceptanceModel(), Planner(CostModel(curve)))
    sp.propose([0, 1], Limits(max_depth=4, max_rows=8, room=100), SamplingConfig(), np.random.default_rng(0))
    assert budgets["heads"].stop_below == pytest.approx(1.0) and budgets["lookup"].stop_below == 0.0


def test_sampling_through_the_heads_tree_keeps_the_target_s_distribution():
    """The heads' candidates are deterministic: the walk draws each token from p and follows a
    child that holds it, so the first two tokens are distributed as p(x1) p(x2 | x1)."""
    source = HeadsSource(fake_heads(k=2, seed=4).drafter(), max_nodes=8)
    h = np.random.default_rng(2).normal(0, 1, D).astype(np.float32)
    source.learn(Outcome(tokens=[0], candidates=(), verified=(), emitted=(0,), hidden=h))
    proposal = source.propose([0], budget(max_len=2), SamplingConfig(temperature=1.0), np.random.default_rng(0))
    trie = Trie.build(0, proposal.candidates, [len(c.tokens) for c in proposal.candidates])
    assert len(trie) > 2
    vocab = sorted({t for c in proposal.candidates for t in c.tokens} | {V, V + 1})
    rng = np.random.default_rng(5)

    def dist(probs):
        return Distribution(np.array(vocab, dtype=np.int64), np.asarray(probs, dtype=np.float64))
    p1 = dist(rng.dirichlet(np.ones(len(vocab))))
    p2 = {x: dist(rng.dirichlet(np.ones(len(vocab)))) for x in vocab}

    def row(v):
        return p1 if v == 0 else p2[trie.token[v]] if trie.depth[v] == 1 else p1

    def draw(d, r):
        return int(d.ids[min(np.searchsorted(np.cumsum(d.probs), r.random()), len(d.ids) - 1)])
    counts = {}
    draws = np.random.default_rng(6)
    for _ in range(20000):
        path, token = walk_sampled(trie.children, trie.q, row, draws)
        emitted = [trie.token[v] for v in path] + [token]
        if len(emitted) == 1:  # the next step draws the second token after it
            emitted.append(draw(p2[emitted[0]], draws))
        counts[emitted[0], emitted[1]] = counts.get((emitted[0], emitted[1]), 0) + 1
    keys = [(a, b) for a in vocab for b in vocab]
    observed = np.array([counts.get(k, 0) for k in keys])
    expected = np.array([p1.prob(a) * p2[a].prob(b) for a, b in keys]) * observed.sum()
    assert chisquare(observed, expected).pvalue > 1e-3
    wrong = observed.copy()  # the check can fail: the best candidate's tokens always taken
    assert chisquare(np.roll(wrong, 1), expected).pvalue < 1e-3


class Slow(HeadsSource):
    """A source with a gate of its own whose proposing takes ``ms`` and whose candidate is
    accepted or not."""

    name = "heads"

    def __init__(self, ms: float, right: bool) -> None:
        self.ms, self.right, self.max_len = ms, right, 1

    def propose(self, tokens, budget, sampling, rng):
        import time
        end = time.perf_counter() + self.ms / 1000
        while time.perf_counter() < end:
            pass
        token = len(tokens) if self.right else len(tokens) + 1  # the next token is the length
        return Proposal((Candidate((token,), "heads", (Guess(1, 9),)),))

    def learn(self, outcome):
        pass


def asked_share(source: Slow, steps: int = 120, curve: Optional[List[float]] = None) -> float:
    """How often the speculator asks ``source`` over ``steps`` steps of a text whose next token is
    its length, on a timed curve where a decode of n rows costs ``curve[n - 1]`` single ones of
    1 ms (default: n)."""
    curve = CostCurve(relative=curve or [float(n) for n in range(1, 33)], ms_per_token=1.0, threads=1,
                      backend="test")
    sp = Speculator([source], AcceptanceModel(), Planner(CostModel(curve)))
    tokens, rng, asked = [0], np.random.default_rng(0), 0
    for _ in range(steps):
        plan = sp.plan(tokens, Limits(max_depth=4, max_rows=8, room=100), SamplingConfig(temperature=0), rng)
        asked += any(c.source == "heads" for c in plan.candidates)
        verified = bool(plan.lengths) and plan.lengths[0] > 0
        emitted = (len(tokens), len(tokens) + 1) if verified and source.right else (len(tokens),)
        tokens = tokens + list(emitted)
        path = tuple(("heads",) for _ in emitted[:-1])
        sp.learn(Outcome(tokens=tokens, candidates=plan.candidates, verified=plan.lengths, emitted=emitted,
                         path_sources=path, cost=plan.choice.cost, estimated=plan.choice.estimated))
    return asked / steps


def test_a_source_with_a_gate_of_its_own_is_asked_while_it_repays_its_time():
    assert asked_share(Slow(3.0, right=False)) < 0.3  # 3 decodes of time a step for nothing
    cheap = [1.0 + 0.1 * n for n in range(32)]  # a second row costs a tenth of a decode
    assert asked_share(Slow(0.2, right=True), curve=cheap) > 0.9  # a token a step for a fifth of a decode


def test_a_source_with_a_gate_of_its_own_is_not_kept_asking_by_guesses_never_verified():
    """Its candidate holds the next token every step, but where a second row costs 1.99 decodes
    the planner never verifies it: a draft heads' tree foresees the text most steps and that
    does not repay its time."""
    curve = [1.0, 1.99] + [2.0 * n for n in range(2, 32)]
    assert asked_share(Slow(1.0, right=True), curve=curve) < 0.3


def test_a_source_with_a_gate_of_its_own_pays_for_its_share_of_the_rows_verified():
    """A step verified one token of the heads and one of lookup, both rejected, for 1.7 decodes
    over a plain step's: the heads' gate learns half of that as a loss, as the speculator's own
    gate learns the whole step's. Rows and tokens another source proposed too are not theirs."""
    curve = CostCurve(relative=[1.0, 1.85, 2.7] + [3.0] * 29, ms_per_token=1.0, threads=1, backend="test")
    sp = Speculator([Slow(0.0, right=False)], AcceptanceModel(), Planner(CostModel(curve)))
    tokens = [0, 1, 2]
    sp.propose(tokens, Limits(max_depth=4, max_rows=8, room=100), SamplingConfig(temperature=0), np.random.default_rng(0))
    gate = sp.own_gates["heads"]
    before = gate.gain
    wrong = (Candidate((7,), "heads", (Guess(1, 9),)), Candidate((8,), "lookup", (0,)))
    sp.learn(Outcome(tokens=tokens + [3], candidates=wrong, verified=(1, 1), emitted=(3,), cost=2.7))
    assert gate.gain == pytest.approx(gate.DECAY * before + (1 - gate.DECAY) * -(2.7 - 1.0) / 2)
    shared = (Candidate((7, 9), "heads", (Guess(1, 9), Guess(2, 9))), Candidate((7,), "lookup", (0,)))
    assert _share(Outcome(tokens=tokens, candidates=shared, verified=(2, 1), emitted=(3,)), "heads") == 0.5
    assert _share(Outcome(tokens=tokens, candidates=shared, verified=(2, 1), emitted=(3,)), "lookup") == 0.0
    # a token lookup proposed too, accepted: the heads brought nothing the step would have lacked
    before = gate.gain
    sp.propose(tokens, Limits(max_depth=4, max_rows=8, room=100), SamplingConfig(temperature=0), np.random.default_rng(0))
    both = (Candidate((3,), "heads", (Guess(1, 9),)), Candidate((3,), "lookup", (0,)))
    sp.learn(Outcome(tokens=tokens + [3, 4], candidates=both, verified=(1, 1), emitted=(3, 4), cost=1.85,
                     path_sources=(("heads", "lookup"),)))
    assert gate.gain == pytest.approx(gate.DECAY * before)


def test_the_bench_runs_the_heads_cached_in_the_cache_it_is_given(tmp_path):
    from llamaspec.measure.settings import BenchSettings, check_strategies, default_strategies
    from llamaspec.errors import ConfigError
    model = tmp_path / "some-model.gguf"
    model.write_bytes(b"GGUF")
    settings = BenchSettings(str(model))
    with pytest.raises(ConfigError, match="needs a heads file"):
        check_strategies(["heads"], settings, tmp_path)
    assert "heads" not in default_strategies(settings, tmp_path)
    cached = tmp_path / "heads" / "some-model.gguf.heads.npz"
    cached.parent.mkdir()
    fake_heads().save(cached)
    check_strategies(["heads"], settings, tmp_path)
    assert "heads" in default_strategies(settings, tmp_path)


def test_the_default_mix_answers_none_of_the_bench_s_prompts():
    """The benches measure the heads on text they were not trained on: no default prompt is a bench
    prompt, nor shares half its words with one."""
    from llamaspec.measure.suite import load_suite
    from llamaspec.training.data import default_texts
    asked = [p.text for p in default_texts() if p.kind == "answer"]
    assert len(asked) == len(set(asked)) > 100

    def words(text: str) -> set:
        return set(text.lower().replace(".", " ").replace(",", " ").split())
    for item in load_suite():
        assert item.user not in asked
        for a in asked:
            shared = words(item.user) & words(a)
            assert len(shared) < 0.5 * len(words(item.user) | words(a)), (item.name, a)


def test_the_heads_time_script_times_each_block():
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "heads_time.py"
    done = subprocess.run([sys.executable, str(script), "--d", "16", "--n", "32", "--ranks", "4,2", "--vocab", "100"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("3 heads, d 16, N 32") and len(lines) == 5
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        "r = 4", "r = 4, E_N h from the logits", "r = 2", "r = 2, E_N h from the logits"]
    assert all(float(line.rsplit(":", 1)[1]) > 0 for line in lines[1:])
