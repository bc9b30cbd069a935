"""Several sequences in one batch, on the fake target: every lane's KV cache after every step,
samples that stop early, prompts that differ, exact sampling per sample, consensus candidates
on plain token lists, and the planner budgeting rows across sequences. Milliseconds, no model."""

from __future__ import annotations

import collections
from typing import List, Optional

import numpy as np
import pytest
from scipy.stats import chisquare

from llamaspec.sources.base import Budget, Candidate
from llamaspec import DraftConfig, LookaheadConfig
from llamaspec.config import SamplingConfig
from llamaspec.sources.draft_model import DraftModelSource, DraftSequences
from llamaspec.sources.consensus import ConsensusSource, Siblings, candidates, evidence
from llamaspec.planning.costs import CostCurve, CostModel
from llamaspec.errors import ConfigError, LlamaspecWarning
from llamaspec.engine.generation import make_config
from llamaspec.engine.engine import MIN_NEW, Engine
from llamaspec.sequences import common_prefix
from llamaspec.sources.lookahead import LookaheadSource
from llamaspec.sources.lookup import LookupSource
from llamaspec.planning.planner import Limits, Planner
from llamaspec.engine.scheduler import Request, Scheduler
from llamaspec.engine.stats import SourceStats

from checks import run_to_end
from fakes import BlurredContext, FakeContext, FakeModel, V, cheap_draft, copying_prompt, fake_prompt, greedy_text, logits_of


FLAT = CostModel(CostCurve.flat())


def check_lanes(ctx: FakeContext, engine: Engine) -> None:
    """Between steps: each lane's home holds exactly its cached tokens, which are its text but
    the pending token (decoding) or the part of its prompt read so far; scratch sequences are empty.
    With the next step's decode under way (an engine that overlaps): each home holds its cached
    tokens and then only that decode's rows, and scratch sequences may hold its branches (the
    strict check comes when it lands)."""
    for ln in engine.lanes:
        cells = ctx.cells(ln.home)
        assert cells[:len(ln.cached)] == ln.cached and (engine.queued or len(cells) == len(ln.cached))
        if ln.state == "decoding":
            assert ln.cached == ln.tokens[:-1]
        else:
            assert ln.cached == ln.tokens[:len(ln.cached)]
    assert engine.queued or not ctx.used_seqs() & set(engine.scratch), f"stale scratch sequences {ctx.used_seqs()}"


def scheduler(ctx: FakeContext, n_lanes: int, costs: CostModel = FLAT, consensus: bool = True,
              lookup: bool = True, drafts: Optional[DraftSequences] = None, fixed=frozenset(),
              overlap: bool = False) -> Scheduler:
    """``fixed``: sources verified whole every step (the planner's decisions then do not depend on
    measured times); ``overlap``: the engine queues each next decode before a step returns."""
    def sources(text):
        out = []
        if lookup:
            out.append(LookupSource())
        if consensus and text.group is not None:  # several samples of one prompt
            out.append(ConsensusSource(text.group.shared("consensus", lambda: Siblings(text.group.n,
                                                                                       text.group.prompt_len)),
                                       text.sample))
        if drafts is not None:
            out.append(DraftModelSource(drafts, text.lane, DraftConfig(draft_max=6)))
        return out
    return Scheduler(Engine(ctx, n_lanes, overlap=overlap), FakeModel(), sources, Planner(costs, frozenset(fixed)),
                     ctx.n_ctx, ctx.n_ctx)


def alone(prompt, config, sources=(), ctx=None) -> List[int]:
    """The text one lane decodes alone, as a LlamaSpec decodes one text."""
    ctx = ctx if ctx is not None else FakeContext(n_ctx=2048, n_batch=256, sharp=config.sampling.temperature == 0)
    sched = Scheduler(Engine(ctx, 1), FakeModel(), lambda text: list(sources), Planner(FLAT),
                      ctx.n_ctx, ctx.n_ctx, exclusive=True)
    request = Request(prompt, config)
    sched.run(request)
    return request.results[0].tokens


def check_drafts(drafts: DraftSequences, engine: Engine) -> None:
    """Between steps: each lane's draft sequence holds a prefix of its text but the pending token."""
    for ln in engine.lanes:
        seq = drafts.sequence(ln.home)
        assert drafts.ctx.cells(ln.home) == seq.tokens
        if ln.state == "decoding":
            assert seq.tokens == ln.tokens[:len(seq.tokens)] and len(seq.tokens) < len(ln.tokens)


def run_all(sched: Scheduler, requests: List[Request], ctx: FakeContext) -> None:
    run_to_end(sched, requests, lambda engine: check_lanes(ctx, engine), 10_000)
    assert not sched.engine.queued  # the last text's stop landed what was queued: the strict check held last
    assert (ctx.n_queued > 0) == sched.engine.overlap


@pytest.mark.parametrize("n_lanes, overlap", [(1, False), (3, False), (3, True)])
def test_prompts_that_differ_decode_as_alone_greedy(n_lanes, overlap):
    ctx = FakeContext(n_ctx=1024, n_batch=64, n_seq_max=12)
    sched = scheduler(ctx, n_lanes, overlap=overlap)
    prompts = [copying_prompt(), fake_prompt(30, 1), fake_prompt(90, 2), fake_prompt(5, 3)]  # one longer than a batch
    requests = [Request(p, make_config(max_tokens=20 + 7 * i, temperature=0)) for i, p in enumerate(prompts)]
    run_all(sched, requests, ctx)
    for p, r in zip(prompts, requests):
        (result,) = r.results
        assert result.tokens == greedy_text(p, len(result.tokens)) and result.stop_reason == "length"
        assert len(result.tokens) == r.config.max_tokens
    assert max(ctx.decodes) <= ctx.n_batch
    if n_lanes == 3:  # the lanes shared decodes: fewer decodes than one sequence at a time needs
        alone = FakeContext(n_ctx=1024, n_batch=64, n_seq_max=12)
        run_all(scheduler(alone, 1), [Request(p, make_config(max_tokens=20 + 7 * i, temperature=0))
                                      for i, p in enumerate(prompts)], alone)
        assert len(ctx.decodes) < len(alone.decodes)


class Windows(LookaheadSource):
    """Lookahead that records the target's tokens at its window's rows, step by step."""

    def __init__(self) -> None:
        super().__init__(LookaheadConfig(w=3, n=3, g=2))
        self.rides: List[tuple] = []

    def learn(self, outcome) -> None:
        self.rides.append(outcome.window_tokens)
        super().learn(outcome)


@pytest.mark.parametrize("n_seq_max", [3 + 3 * 4, 3 + 4])  # every lane's window fits / one at a time
def test_lookahead_windows_ride_in_lanes_as_alone(n_seq_max):
    """Each lane's window rows, on scratch sequences of their own, give its lookahead the target's
    tokens a one-sequence engine gives it; a window that finds no free sequences waits a step."""
    prompts = [copying_prompt(), fake_prompt(30, 1), fake_prompt(12, 3)]
    ctx = FakeContext(n_ctx=2048, n_batch=256, n_seq_max=n_seq_max)
    made: List[Windows] = []

    def sources(text):
        made.append(Windows())
        return [made[-1]]
    sched = Scheduler(Engine(ctx, 3), FakeModel(), sources, Planner(FLAT), ctx.n_ctx, ctx.n_ctx)
    requests = [Request(p, make_config(max_tokens=30, temperature=0)) for p in prompts]
    run_all(sched, requests, ctx)
    for p, r, lane in zip(prompts, requests, made):
        assert r.results[0].tokens == greedy_text(p, 30)
        single = Windows()
        alone(p, make_config(max_tokens=30, temperature=0), [single])
        rode = [t for t in lane.rides if t is not None]
        assert rode, "no window rode"
        if n_seq_max > 3 + 4:
            assert lane.rides == single.rides
        else:
            assert len(rode) < len(lane.rides)  # lanes shared the scratch sequences
    assert ctx.used_seqs() <= {0, 1, 2}


def test_samples_equal_single_runs_with_their_seeds():
    """Deterministic candidates keep the target's own draw at each position, so sample i of a
    group is exactly what one plain run with seed + i samples."""
    ctx = FakeContext(n_ctx=1024, n_batch=64, n_seq_max=12, sharp=False)
    sched = scheduler(ctx, 4)
    prompt = copying_prompt()
    config = make_config(max_tokens=40, temperature=0.8, seed=7)
    request = Request(prompt, config, n=4)
    run_all(sched, [request], ctx)
    for i, result in enumerate(request.results):
        tokens = alone(prompt, make_config(max_tokens=40, temperature=0.8, seed=7 + i),
                       ctx=FakeContext(n_ctx=1024, n_batch=64, sharp=False))
        assert result.tokens == tokens, f"sample {i}"
        assert result.stats.seed == 7 + i
    assert len({tuple(r.tokens) for r in request.results}) > 1
    assert ctx.cells(0)[:len(prompt)] == prompt  # the prompt was read once, on the first lane
    assert sum(r.stats.n_prompt_eval for r in request.results) == len(prompt)


def stopping_early(overlap: bool) -> Request:
    """Four samples of a prompt whose stop strings end them at different steps."""
    ctx = FakeContext(n_ctx=1024, n_batch=64, n_seq_max=12, sharp=False)
    sched = scheduler(ctx, 4, overlap=overlap)
    # "c" is a likely piece: samples stop at different steps, some inside an accepted draft
    request = Request(copying_prompt(), make_config(max_tokens=60, temperature=0.8, seed=3, stop=["cd", "b"]), n=4)
    run_all(sched, [request], ctx)
    for ln in sched.engine.lanes:
        assert ln.state == "idle"
    return request


def test_samples_stop_early_and_the_others_go_on():
    request = stopping_early(overlap=False)
    reasons = collections.Counter(r.stop_reason for r in request.results)
    assert reasons["stop"] >= 1
    chunks = collections.defaultdict(list)
    while not request.events.empty():
        i, chunk = request.events.get()
        chunks[i].append(chunk)
    for i, result in enumerate(request.results):
        assert "b" not in result.text and "cd" not in result.text
        assert [t for c in chunks[i] for t in c.tokens] == result.tokens  # chunks add up to the result
        assert "".join(c.text for c in chunks[i]) == result.text
        assert chunks[i][-1].result is result
        assert result.stats.n_predict >= len(result.tokens)


def test_an_engine_that_overlaps_samples_the_same_texts_while_samples_stop_and_others_go_on():
    """The next decode queued before each step returns: a sample stopped meanwhile has its rows
    dropped when that decode lands, the others go on; each text, stop and reason as without."""
    before, after = stopping_early(overlap=False), stopping_early(overlap=True)
    assert [(r.tokens, r.stop_reason) for r in after.results] == [(r.tokens, r.stop_reason) for r in before.results]


@pytest.mark.parametrize("overlap", [False, True])
def test_cancel_interrupts_a_request_and_leaves_the_cache_consistent(overlap):
    ctx = FakeContext(n_ctx=1024, n_batch=64, n_seq_max=12)
    sched = scheduler(ctx, 2, overlap=overlap)
    slow = Request(fake_prompt(30, 5), make_config(max_tokens=200, temperature=0))
    other = Request(fake_prompt(20, 6), make_config(max_tokens=10, temperature=0))
    sched.submit(slow)
    sched.submit(other)
    for _ in range(5):
        sched.step()
    sched.cancel(slow)
    run_all(sched, [], ctx)
    assert slow.results[0].stop_reason == "interrupted" and 0 < len(slow.results[0].tokens) < 200
    assert other.results[0].tokens == greedy_text(other.prompt, 10)


def test_the_draft_model_drafts_in_every_lane_on_a_sequence_of_its_own():
    """With a draft worth asking (a flat curve, a cheap draft), the planner asks it in every lane:
    each lane drafts on its own sequence of the draft's context (the fake draft is the target
    itself), one draft decode a round for every lane, lanes that share a prompt read it once
    there too, every cache stays exact after every step, and the text is plain greedy decoding's."""
    ctx = FakeContext(n_ctx=2048, n_batch=256, n_seq_max=12)
    drafts = DraftSequences(FakeContext(n_ctx=2048, n_batch=256, n_seq_max=3))
    sched = scheduler(ctx, 3, cheap_draft(), consensus=False, lookup=False, drafts=drafts)
    prompts = [fake_prompt(30, 1), fake_prompt(40, 2), fake_prompt(30, 1)]  # the third shares the first's
    requests = [Request(p, make_config(max_tokens=24, temperature=0)) for p in prompts]
    for r in requests:
        sched.submit(r)
    decodes = []
    for _ in range(1000):
        if not sched.busy:
            break
        sched.step()
        check_lanes(ctx, sched.engine)
        check_drafts(drafts, sched.engine)
        decodes.append(len(drafts.ctx.decodes))
    for p, r in zip(prompts, requests):
        (result,) = r.results
        assert result.tokens == greedy_text(p, 24)
        assert result.stats.sources["draft"].accepted > 0 and result.stats.n_target_calls < 24
    # the lanes draft together: each distinct prompt read once by the draft, with the first
    # tokens, in one decode (31 and 41 rows; the third lane's rows are the first's), then one
    # decode a round, carrying every lane still drafting
    assert [n for n in drafts.ctx.decodes if n >= 30] == [72]
    assert max(np.diff([0] + decodes)) <= 6  # draft_max: rounds per step, whatever the lanes
    assert max(drafts.ctx.decodes[1:]) > 1


def test_context_share_ends_samples_with_reason_context():
    ctx = FakeContext(n_ctx=256, n_batch=64, n_seq_max=12)
    sched = scheduler(ctx, 4)
    prompt = fake_prompt(40, 9)
    request = Request(prompt, make_config(max_tokens=-1, temperature=0.8, seed=1), n=4)
    run_all(sched, [request], ctx)
    assert all(r.stop_reason == "context" for r in request.results)
    assert all(len(r.tokens) == (256 - 40) // 4 + 1 for r in request.results)


def test_bad_requests_are_one_line_errors():
    with pytest.raises(ConfigError, match="temperature 0"):
        Request([1, 2], make_config(temperature=0), n=2)
    with pytest.raises(ConfigError, match=">= 1"):
        Request([1, 2], make_config(), n=0)
    with pytest.raises(ConfigError, match="at most 2"):
        scheduler(FakeContext(), 2).submit(Request([1, 2], make_config(), n=3))


@pytest.mark.parametrize("position, draft", [(0, False), (3, False), (3, True)])
def test_each_sample_is_distributed_as_the_target(position, draft):
    """Chi-square per sample index: the token at ``position`` over many seeded groups, against
    the fake target's exact marginal there (summed over every path up to it); with ``draft``,
    a draft model (a blurred copy of the target) drafts in every lane, verified whole every step
    (so that no decision depends on a measured time: every run draws the same samples)."""
    prompt = copying_prompt()[:12]
    cfg = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    # exact marginal distribution at ``position`` (V**position paths; position 3 is 15**3 rows)
    from llamaspec.sampling import transform
    marginal = np.zeros(V)
    frontier = [(list(prompt), 1.0)]
    for depth in range(position + 1):
        nxt = []
        for text, w in frontier:
            d = transform(logits_of(text, sharp=False), cfg)
            probs = dict(zip(d.ids.tolist(), d.probs.tolist()))
            for t, p in probs.items():
                if depth == position:
                    marginal[t] += w * p
                elif w * p > 1e-4:
                    nxt.append((text + [t], w * p))
        frontier = nxt
    marginal /= marginal.sum()
    counts = np.zeros((3, V))
    ctx = FakeContext(n_ctx=4096, n_batch=64, n_seq_max=12, sharp=False)
    drafts = DraftSequences(BlurredContext(n_ctx=4096, n_batch=64, n_seq_max=3, sharp=False)) if draft else None
    sched = scheduler(ctx, 3, cheap_draft() if draft else FLAT, drafts=drafts, fixed={"draft"} if draft else ())
    drafted = [0, 0, 0]
    for seed in range(700):
        request = Request(prompt, make_config(max_tokens=position + 1, temperature=1.0, top_k=0, top_p=1.0,
                                              min_p=0.0, seed=seed * 10), n=3)
        sched.run(request)
        for i, r in enumerate(request.results):
            counts[i, r.tokens[position]] += 1
            drafted[i] += r.stats.sources.get("draft", SourceStats()).drafted
    assert not draft or min(drafted) > 100, drafted  # the draft model drafted in every lane
    keep = marginal * 700 >= 5
    for i in range(3):
        observed = np.append(counts[i, keep], counts[i, ~keep].sum())
        expected = np.append(marginal[keep], marginal[~keep].sum()) * 700
        if expected[-1] == 0:
            observed, expected = observed[:-1], expected[:-1]
        assert chisquare(observed, expected).pvalue > 1e-3, f"sample {i}"


# --- consensus candidates on plain token lists ------------------------------------------------

def test_consensus_proposes_what_siblings_wrote_after_the_same_tokens():
    prompt = [9, 9, 9]
    board = Siblings(3, len(prompt))
    board.update(0, prompt + [1, 2, 3, 4, 5, 6])
    board.update(1, prompt + [1, 2, 3, 4, 7, 8])
    board.update(2, prompt + [1, 2])  # the sample proposing
    found = board.continuations(2, prompt + [1, 2], 4)
    assert sorted(found) == [((3, 4, 5, 6), 5), ((3, 4, 7, 8), 5)]  # the shared prompt counts in the agreement
    cands = candidates(found, 4)
    assert {c.tokens for c in cands} == {(3, 4, 5, 6), (3, 4, 7, 8)}
    for c in cands:  # two siblings agree on 3 4, then one each
        assert c.evidence[:2] == (evidence(2, 5), evidence(2, 6)) and c.evidence[2:] == (evidence(1, 7), evidence(1, 8))
        assert c.source == "consensus"


def test_consensus_ignores_the_shared_prompt_and_itself():
    prompt = [1, 2, 3, 4, 5]
    board = Siblings(2, len(prompt))
    board.update(0, prompt + [6])
    board.update(1, prompt + [7])
    assert board.continuations(0, prompt + [6], 4) == []  # only the prompt holds "... 5"; nothing after 6
    board.update(1, prompt + [7, 6, 8, 9])
    assert board.continuations(0, prompt + [6], 4) == [((8, 9), 1)]
    source = ConsensusSource(board, 0)
    (cand,) = source.propose(prompt + [6], Budget(1), SamplingConfig(), np.random.default_rng(0)).candidates
    assert cand.tokens == (8,)


def test_consensus_prefers_the_longer_agreement_and_drops_prefixes():
    found = [((5, 6), 1), ((5, 6, 7), 4), ((8,), 2)]
    cands = candidates(found, 4)
    assert [c.tokens for c in cands] == [(5, 6, 7), (8,)]
    assert candidates(found, 1)[0].tokens == (5, 6, 7)


# --- the planner budgets rows across sequences --------------------------------------------------

def test_rows_cost_what_they_add_to_the_other_sequences_rows():
    # one row costs 1, two 1.1 (the second nearly free), three 2.0
    costs = CostModel(CostCurve([1.0, 1.1, 2.0, 3.0] + [4.0 + i for i in range(28)], 0.0, 1, "cpu"))
    planner = Planner(costs)
    cand = Candidate((4,), "lookup", (1,))
    alone = planner.choose([cand], [[0.5]], None, Limits(max_depth=4, max_rows=8, room=100))
    assert alone.lengths == (1,)
    shared = planner.choose([cand], [[0.5]], None, Limits(max_depth=4, max_rows=8, room=100, base_rows=1))
    assert shared.lengths == (0,)  # after another sequence's row, a draft row costs 0.9 for 0.5 tokens
    assert shared.cost == pytest.approx(1.1 - 1.0)


def test_convex_curve_drafts_less_with_more_sequences():
    # a row costs more the more rows the batch already has
    planner = Planner(CostModel(CostCurve([1 + 0.3 * (n - 1) + 0.03 * (n - 1) ** 2 for n in range(1, 33)], 0.0, 1, "cpu")))
    cand = Candidate(tuple(range(1, 9)), "lookup", (4,) * 8)
    rates = [[0.8] * 8]
    depths = [sum(planner.choose([cand], rates, None, Limits(8, 32, 100, base_rows=b)).lengths) for b in (0, 3, 7, 12)]
    assert depths[0] > depths[-1] and depths == sorted(depths, reverse=True)


def test_lanes_teach_the_planner_the_batch_s_tokens_per_unit_of_its_whole_decode():
    """Each lane's row is priced by what it adds to the others' (0.2 here), but the planner's
    exchange rate (Planner.rate) learns tokens per unit of the whole decode: three plain lanes
    emit 3 tokens a step for a decode of 3 rows (1.4), not for three marginal rows (0.6)."""
    curve = CostCurve([1.0 + 0.2 * (n - 1) for n in range(1, 33)], 0.0, 1, "cpu")
    ctx = FakeContext(n_ctx=2048, n_batch=256, sharp=True)
    sched = scheduler(ctx, 3, costs=CostModel(curve), consensus=False, lookup=False)
    requests = [Request(fake_prompt(20, k), make_config(max_tokens=400, temperature=0)) for k in range(3)]
    for r in requests:
        sched.submit(r)
    for _ in range(120):  # the prompts read, then plain steps of three rows
        sched.step()
    assert sched.planner.rate == pytest.approx(3 / 1.4, rel=0.02)


def test_a_source_failing_at_the_end_of_its_text_costs_the_text_nothing():
    class Broken(LookupSource):
        def finish(self, tokens):
            raise RuntimeError("disk full")

    config = make_config(max_tokens=12, temperature=0)
    with pytest.warns(LlamaspecWarning, match="lookup draft source failed at the end of the text: RuntimeError: disk full"):
        text = alone(fake_prompt(20, 4), config, sources=[Broken()])
    assert text == alone(fake_prompt(20, 4), config)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_prompt_another_lane_holds_is_shared_not_read_again(overlap):
    """Lane 0 decodes after prompt P; a request for P and more goes to lane 1, whose home takes
    lane 0's cells of P (nothing read again) and reads only the rest; both texts are as alone,
    and every home holds exactly its text at every step, after lane 0's text ends too."""
    ctx = FakeContext(n_ctx=2048, n_batch=256, sharp=True)
    sched = scheduler(ctx, 2, consensus=False, overlap=overlap)
    config = make_config(max_tokens=30, temperature=0)
    shared = fake_prompt(60, 7)
    first = Request(shared, config)
    sched.submit(first)
    for _ in range(3):
        sched.step()
        check_lanes(ctx, sched.engine)
    longer = shared + fake_prompt(5, 8)
    second = Request(longer, config)
    run_all(sched, [second], ctx)
    while sched.busy:
        sched.step()
        check_lanes(ctx, sched.engine)
    assert second.results[0].stats.n_prompt_eval == len(longer) - len(shared)
    assert first.results[0].tokens == alone(shared, config, [LookupSource()])
    assert second.results[0].tokens == alone(longer, config, [LookupSource()])


def test_a_text_a_lane_left_is_saved_for_a_later_prompt_and_evicted_for_room():
    """One lane, one saved text: P's text is saved when Q takes the lane, and P continued reads
    only what it adds; its saved cells are what they were; a saved text gives its cells back when
    the lanes need them."""
    ctx = FakeContext(n_ctx=2048, n_batch=256, sharp=True)
    engine = Engine(ctx, 1, n_saved=1)
    sched = Scheduler(engine, FakeModel(), lambda text: [LookupSource()], Planner(FLAT), ctx.n_ctx, ctx.n_ctx)
    config = make_config(max_tokens=20, temperature=0)
    p, q = fake_prompt(60, 7), fake_prompt(50, 9)
    first = Request(p, config)
    run_all(sched, [first], ctx)
    run_all(sched, [Request(q, config)], ctx)
    (seq, text), = engine.saved
    assert text == p + first.results[0].tokens[:-1] and ctx.cells(seq) == text
    again = Request(p + first.results[0].tokens + fake_prompt(4, 10), config)
    run_all(sched, [again], ctx)
    assert again.results[0].stats.n_prompt_eval == 1 + 4  # the saved text lacks its pending token
    assert again.results[0].tokens == alone(again.prompt, config, [LookupSource()])
    engine._room(ctx.n_ctx)  # no room left beside the lanes: the saved text goes
    assert not engine.saved and not ctx.cells(seq)


def test_a_saved_text_is_replaced_by_one_that_goes_on_from_it_and_a_near_copy_is_not_saved():
    """Two saved texts: a text that goes on from a saved one takes that one's sequence (the
    other stays), and a text that only a short tail parts from a saved one is not saved at all
    (two lanes' answers to one prompt parting a few tokens before their end)."""
    ctx = FakeContext(n_ctx=4096, n_batch=256, sharp=True)
    engine = Engine(ctx, 1, n_saved=2)
    sched = Scheduler(engine, FakeModel(), lambda text: [LookupSource()], Planner(FLAT), ctx.n_ctx, ctx.n_ctx)

    def ask(prompt, max_tokens=20):
        request = Request(prompt, make_config(max_tokens=max_tokens, temperature=0))
        run_all(sched, [request], ctx)
        return prompt + request.results[0].tokens[:-1]  # what the lane's home holds after it
    a = ask(fake_prompt(60, 7))
    b = ask(fake_prompt(50, 9))  # a saved
    longer = ask(a + fake_prompt(40, 11))  # b saved; a's cells taken, not read again
    c = ask(fake_prompt(45, 12))  # longer saved, in a's place: b stays
    assert sorted(map(len, (t for _, t in engine.saved))) == sorted([len(b), len(longer)])
    assert any(t == b for _, t in engine.saved) and any(t == longer for _, t in engine.saved)
    for seq, text in engine.saved:
        assert ctx.cells(seq) == text
    near = ask(longer[:-2] + fake_prompt(1, 13), 3)  # c saved, in b's place; near parts from longer late
    assert len(near) - common_prefix(near, longer) < MIN_NEW
    assert sorted(t for _, t in engine.saved) == sorted([c, longer])
    ask(fake_prompt(45, 14))  # near is not worth a sequence of its own: nothing evicted for it
    assert sorted(t for _, t in engine.saved) == sorted([c, longer])
