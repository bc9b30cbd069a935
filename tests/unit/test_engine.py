"""One text on the engine, as a LlamaSpec runs it (one lane, its scheduler), on a fake target
(tests/fakes.py): token tries, stops inside a step, the context's edge, max_tokens, statistics,
the KV cache after every step, and exact sampling through the whole verify path. Milliseconds,
no model."""

from __future__ import annotations

import collections
import itertools
import math

import numpy as np
import pytest
from scipy.stats import chisquare

from llamaspec.engine.generation import make_config
from llamaspec.errors import DecodeError
from llamaspec.sources.base import Candidate, Proposal
from llamaspec.config import SamplingConfig
from llamaspec.planning.costs import REFERENCE_CPU, CostCurve, CostModel
from llamaspec.sources.lookup import LookupSource
from llamaspec.planning.gate import Gate
from llamaspec.planning.planner import Limits, Planner
from llamaspec.sampling import Mirostat, logprob_of, shape, transform
from llamaspec.planning.speculator import Speculator

from fakes import EOS, FakeContext, GREEDY, OneText, Oracle, StepLog, V, check_kv, copying_prompt, engine, fake_prompt, greedy_text, logits_of, second_and_third_tokens, with_oracle

# Penalties and logit biases (token 9 banned) that change the fake target's text.
PENALIZED = dict(repeat_penalty=1.6, frequency_penalty=0.4, presence_penalty=0.3, penalty_last_n=6,
                 logit_bias=((2, 1.5), (9, -math.inf)))


def generate(eng, prompt, **options):
    return eng.generate(prompt, **options)


@pytest.mark.parametrize("overlap", [False, True], ids=["", "the next decode queued"])
def test_greedy_output_is_plain_greedy_and_the_cache_holds_the_text_after_every_step(overlap):
    prompt = copying_prompt()
    eng, ctx = engine([LookupSource(), Oracle()], overlap=overlap)
    text = []
    steps = eng.steps(prompt, max_new=40)
    for step in steps:
        text += step.tokens
        check_kv(ctx, eng.tokens, queued=eng.engine.queued)
        assert eng.engine.queued == (overlap and eng.engine.lanes[0].live)
    steps.close()
    check_kv(ctx, eng.tokens)
    assert text == greedy_text(prompt, len(text)) and len(text) >= 40
    assert max(ctx.decodes[1:]) > 1  # candidates were verified in batches


class Learning(LookupSource):
    """Lookup that notes how many decodes its context had queued or done when it learnt each step."""

    def __init__(self, ctx):
        super().__init__()
        self.ctx, self.at = ctx, []

    def learn(self, outcome):
        self.at.append(len(self.ctx.decodes))
        super().learn(outcome)


def test_an_engine_that_overlaps_learns_from_a_plain_step_after_queuing_the_next_and_plans_the_same(monkeypatch):
    """Where the gate leaves the sources out (here every step but each third), what a step
    teaches is learnt once the next decode is queued, or before the sources are asked again:
    the same plans and tokens as learning at once, whatever the acceptance estimates learnt."""
    def ask(gate, plain_cost):  # the gate, made to ask every third step whatever the times
        gate.n = getattr(gate, "n", -1) + 1
        gate.asked = gate.n % 3 == 0
        gate._plain = plain_cost
        return gate.asked
    monkeypatch.setattr(Gate, "ask", ask)

    def run(overlap):
        ctx = FakeContext()
        learning = Learning(ctx)
        eng = OneText([learning, Oracle(k=4, wrong_after=1)], curve=REFERENCE_CPU, ctx=ctx, overlap=overlap)
        steps = list(eng.steps(copying_prompt(), max_new=60))
        return [(s.tokens, s.n_drafted, s.asked) for s in steps], learning.at

    plain, overlapped = run(False), run(True)
    assert overlapped[0] == plain[0] and sum(asked for *_, asked in plain[0][1:]) < len(plain[0]) - 1
    assert plain[1] == list(range(2, len(plain[1]) + 2))  # step k learnt right after its own decode
    assert any(at > k + 2 for k, at in enumerate(overlapped[1]))  # some after the next one's was queued


class FailingContext(FakeContext):
    """The fake target, whose decode number ``fail_at`` (from 0) fails as llama_decode can."""

    def __init__(self, fail_at: int, **kw):
        super().__init__(**kw)
        self.fail_at = fail_at

    def decode_rows(self, rows, hidden=False, wait=True):
        if len(self.decodes) == self.fail_at:
            raise DecodeError("llama_decode failed with code 1: no free slot in the KV cache (context full)")
        return super().decode_rows(rows, hidden, wait)


@pytest.mark.parametrize("overlap", [False, True], ids=["", "the next decode queued"])
def test_a_decode_that_fails_ends_the_text_with_its_error_after_the_steps_before_it(overlap):
    """Queued by the step before, the failing decode's error comes when it would have landed:
    the steps before it are the text's either way, and the cache holds just their text."""
    eng = OneText([LookupSource(), Oracle(k=3)], ctx=FailingContext(2), overlap=overlap)
    text = []
    with pytest.raises(DecodeError, match="context full"):
        for step in eng.steps(copying_prompt(), max_new=40):
            text += step.tokens
    assert len(eng.ctx.decodes) == 2 and len(text) > 1 and text == eng.tokens[len(copying_prompt()):]
    assert text == greedy_text(copying_prompt(), len(text))
    check_kv(eng.ctx, eng.tokens)


def test_an_engine_that_overlaps_plans_and_emits_each_step_as_one_that_does_not():
    """Queuing the next decode before a step returns changes no plan and no token: the same
    steps, stops and texts, over a text that stops inside an accepted draft and one whose stop
    string cuts a step; sampled texts the same for the same seeds."""
    def run(overlap, **options):
        eng, ctx = engine([LookupSource(), Oracle(k=3)], overlap=overlap, sharp=options.get("temperature") == 0)
        chunks, result = generate(eng, copying_prompt(), max_tokens=40, **options)
        _, after = generate(eng, eng.tokens + [1, 2], max_tokens=12, **options)  # the next text on the lane
        check_kv(ctx, eng.tokens)
        return [c.tokens for c in chunks], result.tokens, result.stop_reason, after.tokens, ctx.n_queued

    _, full, *_ = run(False, temperature=0)
    stop = "".join(chr(ord("a") + t) for t in full[12:14])
    for options in (dict(temperature=0), dict(temperature=0, stop=[stop]), dict(temperature=0.9, seed=4)):
        plain, overlapped = run(False, **options), run(True, **options)
        assert overlapped[:4] == plain[:4] and plain[4] == 0 < overlapped[4], options
    assert run(True, temperature=0, stop=[stop])[2] == "stop"


def penalized_greedy_text(prompt, n, sampling):
    """What plain greedy decoding of the fake model emits with ``sampling``'s penalties and biases."""
    text = list(prompt)
    for _ in range(n):
        text.append(int(transform(shape(logits_of(text), sampling, text), sampling).ids[0]))
    return text[len(prompt):]


@pytest.mark.parametrize("shaping", [PENALIZED, dict(PENALIZED, typical_p=0.5)], ids=["penalties", "and typical-p"])
def test_greedy_with_penalties_and_biases_is_plain_greedy_with_them(shaping):
    """Every row is shaped by the text along its own path, so a trie whose candidates are the
    unpenalized text (the oracle's) and the prompt's (lookup) is verified into the penalized text
    (with typical-p, greedy takes the best token it keeps)."""
    prompt = copying_prompt()
    sampling = SamplingConfig(temperature=0, **shaping)
    eng, ctx = engine([LookupSource(), Oracle()])
    text, accepted = [], 0
    for step in eng.steps(prompt, sampling, max_new=40):
        text += step.tokens
        accepted += step.n_accepted
        check_kv(ctx, eng.tokens)
    assert text == penalized_greedy_text(prompt, len(text), sampling) and len(text) >= 40
    assert text != greedy_text(prompt, len(text)) and 9 not in text  # the penalties and the ban did change it
    assert accepted > 0


@pytest.mark.parametrize("shaping", [{}, PENALIZED], ids=["plain", "penalties and biases"])
def test_log_probabilities_are_those_of_the_rows_each_token_was_chosen_at(shaping):
    """Every token's log-probability and the 3 best, from the verify rows (speculation accepted
    drafts), as plain decoding's single rows give them, shaped by penalties and biases too."""
    prompt = copying_prompt()
    eng, _ = engine([LookupSource(), Oracle()])
    chunks, result = generate(eng, prompt, max_tokens=30, temperature=0, logprobs=3, **shaping)
    sampling = make_config(temperature=0, **shaping).sampling
    text = list(prompt)
    for token, got in zip(result.tokens, result.logprobs):
        assert got == logprob_of(shape(logits_of(text), sampling, text), token, 3)
        text.append(token)
    assert len(result.logprobs) == len(result.tokens) == 30 and result.stats.n_accept > 0
    assert [lp for c in chunks for lp in c.logprobs] == result.logprobs
    assert [t for t, _ in result.logprobs[0].top][0] == result.tokens[0]  # greedy: the best token
    _, without = generate(eng, prompt, max_tokens=5, temperature=0)
    assert without.logprobs is None


def test_a_trie_with_a_shared_prefix_is_one_decode_and_keeps_the_right_branch():
    log = StepLog()
    eng, ctx = engine([Oracle(k=5, wrong_after=2), log])
    steps = eng.steps(fake_prompt())
    next(steps)  # the first token, from the prompt's decode
    step = next(steps)
    assert ctx.decodes[-1] == 1 + 5 + 1  # the pending token, 5 right tokens, 1 wrong one after the shared 2
    assert step.n_drafted == 6 and step.n_accepted == 5 and step.path_sources == (("oracle",),) * 5
    out = log.outcomes[-1]
    assert out.verified == (5, 3) and out.emitted == tuple(step.tokens) and out.cost == pytest.approx(1.0)
    check_kv(ctx, eng.tokens)
    steps.close()
    check_kv(ctx, eng.tokens)


def test_stats_add_up():
    eng, ctx = engine([LookupSource(), Oracle(k=4)])
    chunks, result = generate(eng, copying_prompt(), max_tokens=50, temperature=0)
    s = result.stats
    assert s.n_accept <= s.n_drafted and s.n_predict == 50 == len(result.tokens)
    assert s.n_predict == s.n_accept + s.n_target_calls  # nothing stopped inside a step
    assert sum(src.accepted for src in s.sources.values()) >= s.n_accept  # a token two sources proposed counts twice
    assert all(a <= d for a, d in zip(s.accepted_by_pos, s.drafted_by_pos))
    assert [t for c in chunks for t in c.tokens] == result.tokens


def test_max_tokens_clips_a_longer_draft():
    eng, ctx = engine([Oracle(k=10, wrong_after=99)])
    chunks, result = generate(eng, fake_prompt(), max_tokens=5, temperature=0)
    assert len(result.tokens) == 5 and result.stop_reason == "length"
    assert max(ctx.decodes[1:]) <= 4  # the pending token and at most 3 candidate tokens
    check_kv(ctx, eng.tokens)


def test_the_context_edge_stops_with_its_own_reason_and_never_overflows():
    eng, ctx = engine([LookupSource(), Oracle(k=10)], n_ctx=64)
    prompt = fake_prompt(40)
    chunks, result = generate(eng, prompt, max_tokens=-1, temperature=0)
    assert result.stop_reason == "context" and "stopped: the context is full" in result.stats.summary()
    assert len(prompt) + len(result.tokens) == 64 + 1  # the last token is emitted, never evaluated
    check_kv(ctx, eng.tokens)


class EosContext(FakeContext):
    """The fake target, ending its text at position ``eos_at``."""

    def __init__(self, eos_at: int, **kw):
        super().__init__(**kw)
        self.eos_at = eos_at

    def _decode(self, rows):
        super()._decode(rows)
        with_logits = [r for r in rows if r[3]]
        for i, (token, pos, seqs, _) in enumerate(with_logits):
            if pos + 1 == self.eos_at:
                self._out[i] = -30.0
                self._out[i, EOS] = 30.0


def eos_engine(eos_at, sources, overlap=False):
    eng = OneText(sources, ctx=EosContext(eos_at), overlap=overlap)
    return eng, eng.ctx


class EosOracle(Oracle):
    """Knows the text ends at ``eos_at`` and proposes past it."""

    def __init__(self, eos_at):
        super().__init__(k=8, wrong_after=99)
        self.eos_at = eos_at

    def propose(self, tokens, budget, sampling, rng):
        right = list(greedy_text(tokens, 8))
        if len(tokens) <= self.eos_at < len(tokens) + 8:
            right[self.eos_at - len(tokens)] = EOS
        return Proposal((Candidate(tuple(right[:budget.max_len]), self.name, (1,) * min(8, budget.max_len)),))


@pytest.mark.parametrize("overlap", [False, True], ids=["", "the next decode queued"])
def test_an_end_of_generation_inside_an_accepted_draft(overlap):
    prompt = fake_prompt(30)
    eos_at = len(prompt) + 4  # the fifth generated token
    eng, ctx = eos_engine(eos_at, [EosOracle(eos_at)], overlap)
    chunks, result = generate(eng, prompt, max_tokens=50, temperature=0)
    assert result.stop_reason == "stop" and len(result.tokens) == 4 and EOS not in result.tokens
    assert [t for c in chunks for t in c.tokens] == result.tokens  # no end-of-generation token in a chunk
    s = result.stats
    assert s.n_predict == 5  # the end-of-generation token counts as emitted
    assert s.n_accept <= 5 - 1 and s.accepted_by_pos[0] <= 1 and sum(s.accepted_by_pos) == s.n_accept
    assert eng.tokens[-1] == EOS and eng.tokens[:-1] == prompt + result.tokens  # EOS pending, the rest cut
    check_kv(ctx, eng.tokens)


def test_no_candidate_goes_on_past_an_end_of_generation_token():
    """Nothing after an end-of-generation token is ever emitted: the speculator cuts candidates
    there, so the planner never pays rows for them."""
    prompt = fake_prompt(30)
    eos_at = len(prompt) + 3
    ends = Speculator([EosOracle(eos_at)], with_oracle(),
                      Planner(CostModel(CostCurve.flat())), frozenset({EOS}))
    plan = ends.plan(prompt, Limits(max_depth=16, max_rows=64, room=64), GREEDY, np.random.default_rng(0))
    assert plan.candidates[0].tokens == tuple(greedy_text(prompt, 3)) + (EOS,)
    assert len(plan.trie) == 1 + 4 and plan.lengths == (4,)


def test_a_stop_string_held_back_still_yields_its_tokens():
    prompt = copying_prompt()
    eng, _ = engine([Oracle(k=3)])
    _, full = generate(eng, prompt, max_tokens=30, temperature=0)
    stop = full.text[10:14]  # four characters in the middle
    eng, ctx = engine([Oracle(k=3)])
    chunks, result = generate(eng, prompt, max_tokens=30, temperature=0, stop=[stop])
    assert result.stop_reason == "stop" and result.text == full.text[:full.text.index(stop)]
    assert "".join(c.text for c in chunks) == result.text
    assert [t for c in chunks for t in c.tokens] == result.tokens
    assert any(c.tokens and not c.text for c in chunks[:-1])  # a step whose text was held back
    check_kv(ctx, eng.tokens)


def test_a_cut_text_is_followed_not_relearned():
    """After a stop cuts the text inside a step and the next prompt extends what is left, lookup
    indexes only the new tokens (its index follows the cut) and the acceptance model keeps its
    evidence."""
    prompt = copying_prompt()
    _, plain = generate(engine([])[0], prompt, max_tokens=20, temperature=0)
    lookup = LookupSource()
    eng, ctx = engine([lookup])
    _, first = generate(eng, prompt, max_tokens=20, temperature=0, stop=[plain.text[8:10]])
    assert first.stop_reason == "stop"
    evidence = eng.scheduler.model.evidence("lookup")
    indexed = []
    extend = lookup.lookup.history.extend
    lookup.lookup.history.extend = lambda new: (indexed.append(len(new)), extend(new))
    generate(eng, eng.tokens + [1, 2], max_tokens=3, temperature=0)
    assert indexed and sum(indexed) <= 20 < len(eng.tokens) - 40  # the new tokens, not the whole text again
    assert lookup.lookup.history.tokens == eng.tokens[:len(lookup.lookup.history.tokens)]
    assert eng.scheduler.model.evidence("lookup") > 0.5 * evidence > 0  # not thrown away


def test_the_planner_on_a_steep_curve_mostly_decodes_plainly_on_text_it_cannot_predict():
    eng, ctx = engine([LookupSource()], curve=REFERENCE_CPU)
    _, result = generate(eng, fake_prompt(60, seed=3), max_tokens=40, temperature=0)
    assert result.stats.n_drafted <= 10


@pytest.mark.parametrize("shaping", [{}, PENALIZED, dict(typical_p=0.6)], ids=["plain", "penalties and biases",
                                                                           "typical-p"])
def test_sampling_through_the_engine_is_exact(shaping):
    """The first two tokens after the prompt's first are distributed as p(x1) p(x2 | x1), with a
    sampled draft and deterministic lookup candidates verified together in one trie; with
    penalties and logit biases, p is the row shaped by the text along its own path."""
    prompt = [3, 5, 7, 3, 5, 8, 3, 5]  # lookup proposes 7 and 8 after "3 5"
    sampling = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, **shaping)
    n = 6000
    counts = second_and_third_tokens(lambda seed: prompt + [int(seed % 2)], sampling, n)

    def p(text):
        return transform(shape(logits_of(text, sharp=False), sampling, text), sampling)

    # the first token comes from the prompt's row; the next two from one or two verify steps
    expected = collections.Counter()
    for last in (0, 1):
        base = prompt + [last]
        p_first = p(base)
        for x0, p0 in zip(p_first.ids, p_first.probs):
            p1 = p(base + [int(x0)])
            for x1, q1 in zip(p1.ids, p1.probs):
                p2 = p(base + [int(x0), int(x1)])
                for x2, q2 in zip(p2.ids, p2.probs):
                    expected[(int(x1), int(x2))] += 0.5 * p0 * q1 * q2
    pairs = list(itertools.product(range(V), repeat=2))
    exp = np.array([expected[pq] * n for pq in pairs])
    obs = np.array([counts[pq] for pq in pairs])
    keep = exp >= 5
    rest_obs, rest_exp = obs[~keep].sum(), exp[~keep].sum()
    stat = chisquare(np.append(obs[keep], rest_obs), np.append(exp[keep], rest_exp) * n / exp.sum())
    assert stat.pvalue > 1e-3


@pytest.mark.parametrize("version, tau, eta", [(1, 2.5, 1.0), (2, 1.5, 0.5)])
def test_mirostat_sampling_through_the_engine_is_exact(version, tau, eta):
    """With mirostat the distribution at a position depends on the surprise of every token drawn
    before it (mu): the first two tokens after the first are distributed as plain mirostat
    sampling gives them, mu carried down each verified path, with a sampled draft and lookup
    candidates verified together."""
    prompt = [3, 5, 7, 3, 5, 8, 3, 5]
    sampling = SamplingConfig(temperature=1.0, mirostat=version, mirostat_tau=tau, mirostat_eta=eta)
    n = 6000
    counts = second_and_third_tokens(lambda seed: prompt, sampling, n)

    def tree(text, state, weight, depth):  # (x1, x2) -> probability, each branch with its own mu
        dist = state.distribution(logits_of(text, sharp=False))
        for x, px in zip(dist.ids.tolist(), dist.probs):
            after = Mirostat(sampling, state.mu)
            after.advance(dist, x)
            if depth == 2:
                expected[tuple(text[len(prompt) + 1:] + [x])] += weight * px
            else:
                tree(text + [x], after, weight * px, depth + 1)
    expected = collections.Counter()
    tree(list(prompt), Mirostat.start(sampling), 1.0, 0)
    sizes = {len(Mirostat(sampling, mu).distribution(logits_of(prompt, sharp=False)).ids) for mu in (1.0, 3.0, 6.0)}
    assert len(sizes) == 3  # mu decides what is kept: a text's surprise so far changes the next distribution
    pairs = list(itertools.product(range(V), repeat=2))
    exp = np.array([expected[pq] * n for pq in pairs])
    obs = np.array([counts[pq] for pq in pairs])
    assert obs[exp == 0].sum() == 0  # nothing mirostat cut off
    keep = exp >= 5
    rest = [] if exp[~keep].sum() == 0 else [exp[~keep].sum()]
    stat = chisquare(np.append(obs[keep], [obs[~keep].sum()] * len(rest)), np.append(exp[keep], rest) * n / exp.sum())
    assert stat.pvalue > 1e-3 and keep.sum() > 8


def test_a_logits_processor_and_a_stopping_criterion_are_asked_as_plain_decoding_asks_them():
    """llama-cpp-python's callbacks see, once per emitted token and in the text's order, the text
    before it (and its row: to process, or raw for the criterion), whatever was verified: the
    text is the processed target's, and it stops before the token the criterion names. (Within
    a step the processor reads the step's rows before the criterion is asked of its tokens, so a
    step that stops may have processed a row or two past the stop.)"""
    prompt = copying_prompt()

    def run(sources):
        seen = []

        def processor(input_ids, scores):
            seen.append(("p", tuple(input_ids.tolist())))
            scores = scores.copy()
            scores[4] += 9.0  # a token the raw target seldom takes
            return scores

        def criterion(input_ids, logits):
            seen.append(("s", tuple(input_ids.tolist())))
            return len(input_ids) - len(prompt) == 30  # stop before the 31st token
        _, result = generate(engine(sources)[0], prompt, max_tokens=60, temperature=0, logits_processor=[processor],
                             stopping_criteria=criterion)
        return result, seen
    plain, seen = run([])
    spec, spec_seen = run([LookupSource(), Oracle(k=6)])
    spec_processed, spec_asked = ([x for kind, x in spec_seen if kind == c] for c in "ps")
    text = list(prompt)
    for _ in range(30):
        row = logits_of(text).copy()
        row[4] += 9.0
        text.append(int(row.argmax()))
    assert spec.tokens == plain.tokens == text[len(prompt):] and spec.stop_reason == plain.stop_reason == "stop"
    assert 4 in plain.tokens and plain.tokens != greedy_text(prompt, 30)  # the processor changed the text
    processed, asked = ([x for kind, x in seen if kind == c] for c in "ps")
    assert processed == asked and len(asked) == 31
    assert spec_processed[:31] == processed and spec_asked == asked  # each in the text's order
    assert spec.stats.n_accept > 0


def test_a_seed_gives_plain_sampling_s_text_whatever_deterministic_candidates_were_verified():
    """Each position's token is drawn with that position's own number (sample-and-match), so
    lookup and the oracle's candidates change how many decodes it takes, never the text."""
    prompt = copying_prompt()
    options = dict(max_tokens=40, temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    _, plain = generate(engine([], sharp=False)[0], prompt, **options)
    eng, ctx = engine([LookupSource(), Oracle(k=6)], sharp=False)
    _, first = generate(eng, prompt, **options)
    _, again = generate(eng, prompt, **options)  # the sources learned in between
    assert first.tokens == plain.tokens == again.tokens and first.stats.seed == 7 and ", seed 7" in first.stats.summary()
    assert first.stats.n_accept > 0
