"""Constrained decoding without a model: a grammar over the fake target's letters (tests/fakes.py)
followed through the engine, greedy and sampled, with candidates the grammar forbids; the walk
of a trie whose branches are in different grammar states; the grammar as a draft source, lookup
asked past its forced tokens and the draft model following it (exact when sampled); and, on
Qwen2.5's vocabulary, which texts a JSON schema allows (llama.cpp's conversion's)."""

from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest
from click.testing import CliRunner
from scipy.stats import chisquare

from llamaspec.cli import cli
from llamaspec import DraftConfig
from llamaspec.config import SamplingConfig
from llamaspec.engine.engine import Engine
from llamaspec.engine.generation import make_config
from llamaspec.engine.scheduler import Request, Scheduler
from llamaspec.engine.target import Target, walk
from llamaspec.errors import GrammarError
from llamaspec.constraints import Constraint, Grammar, GrammarVocabulary
from llamaspec.planning.costs import CostCurve
from llamaspec.planning.planner import Planner
from llamaspec.planning.trie import Trie
from llamaspec.sampling import transform
from llamaspec.sources import draft_model, grammar as grammar_source
from llamaspec.sources.base import FORCED, Budget, Candidate
from llamaspec.sources.draft_model import DraftModelSource, DraftSequences
from llamaspec.sources.lookup import LookupSource

from fakes import BlurredContext, EOS, FakeContext, FakeModel, GREEDY, Oracle, StepLog, V, cheap_draft, check_kv, copying_prompt, engine, fake_prompt, logits_of, second_and_third_tokens


# letters a-e and f-j in turn, at least one pair: the state depends on the text so far
ALTERNATING = 'root ::= ([a-e] [f-j])+'
VOCAB = GrammarVocabulary(FakeModel())


def fake_constraint(gbnf: str = ALTERNATING) -> Constraint:
    return VOCAB.constraint(Grammar.gbnf(gbnf))


def allowed_at(i: int) -> np.ndarray:
    """ALTERNATING's tokens at generated position i (EOS too once a pair is complete)."""
    ok = np.zeros(V, dtype=bool)
    ok[0:5] = i % 2 == 0
    ok[5:10] = i % 2 == 1
    ok[EOS] = i % 2 == 0 and i > 0
    return ok


def constrained_greedy(prompt, n):
    """Plain constrained greedy decoding of the fake target: the argmax among allowed tokens."""
    text = list(prompt)
    for i in range(n):
        text.append(int(np.where(allowed_at(i), logits_of(text), -np.inf).argmax()))
    return text[len(prompt):]


def test_the_mask_follows_the_grammar_state():
    c = fake_constraint()
    for i, token in enumerate([0, 7, 4, 5]):
        assert (c.allowed() == allowed_at(i)).all()
        assert c.allows(token) and not c.allows((token + 5) % 10)
        c.advance(token)
    assert c.complete and c.valid([1, 6, 1]) == 3 and c.valid([1, 1]) == 1
    row = np.arange(V, dtype=np.float32)
    assert c.argmax(row) == EOS and np.isinf(c.mask(row)[5:]).sum() == 10  # f..o forbidden, EOS allowed
    row[EOS] = -1
    assert c.argmax(row) == 4
    with pytest.raises(GrammarError, match="cannot follow"):
        c.advance(9)


def test_the_forced_tokens_follow_the_text_and_its_forks():
    """forced() is found once per place in the text: it moves on with the text, and a fork's
    moves leave the text's own forced tokens as they were."""
    c = fake_constraint(FORCING)
    c.advance(0)
    assert c.forced() == [1, 2, 3] and c.forced() == [1, 2, 3]
    ahead = c.fork()
    ahead.advance(1)
    assert ahead.forced() == [2, 3] and c.forced() == [1, 2, 3]
    for x in (1, 2, 3):
        c.advance(x)
    assert c.forced() == []


def test_constrained_greedy_through_the_engine_is_plain_constrained_greedy():
    """Lookup and an oracle of the unconstrained target propose tokens the grammar forbids; they
    are cut before verification, never accepted, and the text is plain constrained greedy."""
    prompt = copying_prompt()
    eng, ctx = engine([LookupSource(), Oracle(k=6)])
    text, constraint = [], fake_constraint()
    for step in eng.steps(prompt, GREEDY, max_new=40, constraint=constraint):
        text += step.tokens
        check_kv(ctx, eng.tokens)
    assert text == constrained_greedy(prompt, len(text)) and len(text) >= 40
    assert text != eng_plain_text(prompt, len(text))  # the grammar changed the text


def eng_plain_text(prompt, n):
    eng, _ = engine([])
    out = []
    for step in eng.steps(prompt, GREEDY, max_new=n):
        out += step.tokens
    return out[:n]


def test_a_trie_whose_branches_are_in_different_grammar_states_keeps_them_apart():
    """After "a", the branch "b c" may go on with c only, the branch "d e" with e only. Rows
    where the target's raw favourite is the other branch's letter: each branch's own state
    decides, so the walk goes down b then c (the raw argmax e is forbidden after "a b")."""
    gbnf = 'root ::= "a" ("b" "c"* | "d" "e"*)'
    a, b, c, d, e = 0, 1, 2, 3, 4
    trie = Trie.build(9, [Candidate((a, b, c), "x", (0, 0, 0)), Candidate((a, d, e), "y", (0, 0, 0))], [3, 3])
    rows = np.zeros((len(trie), V), dtype=np.float32)
    node = {tuple(trie.token[u] for u in trie.path(v)): v for v in range(len(trie))}
    rows[node[()], a] = 5
    rows[node[(a,)], b] = 5
    rows[node[(a, b)], e] = 9  # forbidden after a b
    rows[node[(a, b)], c] = 5
    rows[node[(a, b, c)], e] = 9
    rows[node[(a, b, c)], EOS] = 5
    constraint = VOCAB.constraint(Grammar.gbnf(gbnf))
    path, token, _ = walk(trie, rows, Target(GREEDY, constraint), np.random.default_rng(0), lambda depth: 0.5)
    assert [trie.token[v] for v in path] == [a, b, c] and token == EOS
    unconstrained, _, _ = walk(trie, rows, Target(GREEDY), np.random.default_rng(0), lambda depth: 0.5)
    assert [trie.token[v] for v in unconstrained] == [a, b]  # without the grammar: e after a b
    # the other branch: after "a d" only e, though the row favours c
    rows[node[(a,)], d] = 7
    rows[node[(a, d)], c] = 9
    rows[node[(a, d)], e] = 5
    constraint = VOCAB.constraint(Grammar.gbnf(gbnf))
    path, token, _ = walk(trie, rows, Target(GREEDY, constraint), np.random.default_rng(0), lambda depth: 0.5)
    assert [trie.token[v] for v in path] == [a, d, e] and token == e and constraint.valid([e]) == 1


def test_constrained_sampling_through_the_engine_is_exact():
    """The first two tokens after the first are distributed as the constrained target's
    p(x1) p(x2 | x1) (the grammar's mask, then the sampler), with a sampled draft of the
    unconstrained target and lookup candidates verified together."""
    prompt = [3, 5, 7, 3, 5, 8, 3, 5]
    sampling = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    n = 5000
    counts = second_and_third_tokens(lambda seed: prompt, sampling, n, fake_constraint)
    assert_distributed(counts, constrained_pairs(prompt, allowed_at, sampling), n)


def constrained_pairs(prompt, allowed, sampling, between=()):
    """P(x1, x) under the constrained target, x0 summed over: x1 the 2nd token, x the one after
    x0 x1 and the tokens ``between`` (``allowed(i)``: the grammar's tokens at generated position i)."""
    def p(text, i):
        return transform(np.where(allowed(i), logits_of(text, sharp=False), -np.inf), sampling)
    expected = collections.Counter()
    first = p(prompt, 0)
    for x0, p0 in zip(first.ids, first.probs):
        second = p(prompt + [int(x0)], 1)
        for x1, p1 in zip(second.ids, second.probs):
            then = p(prompt + [int(x0), int(x1), *between], 2 + len(between))
            for x, px in zip(then.ids, then.probs):
                expected[(int(x1), int(x))] += p0 * p1 * px
    return expected


def assert_distributed(counts, expected, n):
    """A chi-square test of ``n`` drawn pairs against ``expected``; nothing it rules out drawn."""
    pairs = list(itertools.product(range(V), repeat=2))
    exp = np.array([expected[pq] * n for pq in pairs])
    obs = np.array([counts[pq] for pq in pairs])
    assert obs[exp == 0].sum() == 0  # nothing the grammar forbids
    keep = exp >= 5
    stat = chisquare(np.append(obs[keep], obs[~keep].sum()), np.append(exp[keep], exp[~keep].sum()) * n / exp.sum())
    assert stat.pvalue > 1e-3


def test_the_grammar_source_proposes_what_the_grammar_forces_and_it_is_verified_in_one_step():
    constraint = fake_constraint('root ::= "bcdef" [a-e]+')
    source = grammar_source.GrammarSource(constraint)
    proposal = source.propose([1], Budget(16), GREEDY, np.random.default_rng(0))
    (cand,) = proposal.candidates
    assert cand.tokens[:4] == (1, 2, 3, 4) and cand.source == "grammar"
    assert set(cand.evidence) <= set(grammar_source.PLUGIN.priors)
    assert not source.propose([1], Budget(0), GREEDY, np.random.default_rng(0)).candidates
    eng, ctx = engine([grammar_source.GrammarSource(constraint)], curve=CostCurve.flat())
    steps = [s.tokens for s in eng.steps([7, 8, 9], GREEDY, max_new=12, constraint=constraint)]
    assert steps[0] == [1]  # the prompt's row: the grammar allows b alone
    assert steps[1][:4] == [2, 3, 4, 5]  # c d e f forced, verified in one decode
    assert ctx.decodes[1] >= 5


def grammar_greedy(prompt, n, gbnf):
    """Plain constrained greedy decoding of the fake target under ``gbnf``."""
    constraint, text = fake_constraint(gbnf), list(prompt)
    for _ in range(n):
        text.append(int(constraint.mask(logits_of(text)).argmax()))
        constraint.advance(text[-1])
    return text[len(prompt):]


def test_lookup_goes_on_past_the_tokens_the_grammar_forces():
    """The grammar forces three tokens of the prompt after the text's first two; lookup is asked
    after them (text + the forced tokens), so its candidate starts with them (evidence FORCED) and
    goes on with what followed them in the prompt, which the fake target writes too: one step
    accepts the forced tokens and more. The text is plain constrained greedy decoding's."""
    prompt = copying_prompt()
    lead = prompt[20:23]
    gbnf = 'root ::= [a-o] [a-o] "%s" [a-o]*' % "".join(chr(ord("a") + t) for t in lead)
    constraint, log = fake_constraint(gbnf), StepLog()
    eng, ctx = engine([LookupSource(), grammar_source.GrammarSource(constraint), log])
    text = []
    for step in eng.steps(prompt, GREEDY, max_new=20, constraint=constraint):
        text += step.tokens
        check_kv(ctx, eng.tokens)
    assert text[:20] == grammar_greedy(prompt, 20, gbnf)
    led = [(o, c) for o in log.outcomes for c in o.candidates if c.source == "lookup" and c.evidence[0] == FORCED]
    assert led, "lookup was never asked past the forced tokens"
    outcome, cand = led[0]
    n_lead = cand.evidence.count(FORCED)
    accepted = next((i for i, (x, y) in enumerate(zip(outcome.emitted, cand.tokens)) if x != y),
                    min(len(outcome.emitted), len(cand.tokens)))
    assert accepted > n_lead  # the forced tokens and lookup's tokens after them were the target's


# "a" (the pending token in the draft tests), then "b c d" forced, then letters a-e and f-j in turn
FORCING = 'root ::= "abcd" ([a-e] [f-j])+'
SAMPLED = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


def masked_greedy(text, n, constraint):
    """The fake model's greedy choice among what ``constraint`` allows, ``n`` tokens on (moving it)."""
    text, out = list(text), []
    for _ in range(n):
        out.append(int(constraint.mask(logits_of(text + out)).argmax()))
        constraint.advance(out[-1])
    return out


def draft_of(constraint=None, sharp=True) -> DraftModelSource:
    drafts = DraftSequences(FakeContext(n_ctx=256, n_batch=64, n_seq_max=1, sharp=sharp))
    return DraftModelSource(drafts, 0, DraftConfig(draft_max=8), constraint)


def test_the_draft_model_takes_what_the_grammar_forces_and_drafts_only_what_it_allows():
    """The draft reads the forced "b c d" in the decode of the text's catch-up and drafts on after
    them, the argmax of what the grammar allows; the text's own grammar state does not move."""
    constraint = fake_constraint(FORCING)
    constraint.advance(0)
    text = fake_prompt(20, 1) + [0]  # "a" pending
    source = draft_of(constraint)
    (cand,) = source.propose(text, Budget(8), GREEDY, np.random.default_rng(0)).candidates
    assert cand.tokens[:3] == (1, 2, 3) and cand.evidence[:3] == (FORCED,) * 3
    after = constraint.fork()
    for x in (1, 2, 3):
        after.advance(x)
    assert list(cand.tokens[3:]) == masked_greedy(text + [1, 2, 3], 5, after)
    assert set(cand.evidence) <= set(draft_model.PLUGIN.priors)
    assert source.drafts.ctx.decodes == [len(text) + 3] + [1] * 4  # catch-up, pending and forced in one
    assert constraint.forced() == [1, 2, 3] and constraint.valid(cand.tokens) == 8
    (free,) = draft_of().propose(text, Budget(8), GREEDY, np.random.default_rng(0)).candidates
    assert constraint.valid(free.tokens) < 3  # without the grammar, the draft drafts what it forbids
    # sampled: a point mass on each forced token, then q over the allowed tokens only
    (cand,) = draft_of(constraint, sharp=False).propose(text, Budget(8), SAMPLED, np.random.default_rng(0)).candidates
    assert [q.ids.tolist() for q in cand.q[:3]] == [[1], [2], [3]] and len(cand.tokens) == 8
    check = constraint.fork()
    for x, q in zip(cand.tokens, cand.q):
        assert check.allowed()[q.ids[q.probs > 0]].all() and abs(q.probs.sum() - 1) < 1e-9
        check.advance(x)


# letters in turn, "c" forced third: the draft drafts the 2nd token, takes the 3rd, drafts the 4th
FORCED_THIRD = 'root ::= [a-e] [f-j] "c" ([f-j] [a-e])+'


def allowed_forced_third(i: int) -> np.ndarray:
    ok = np.zeros(V, dtype=bool)
    if i == 2:
        ok[2] = True
    else:
        ok[0:5] = i % 2 == 0
        ok[5:10] = i % 2 == 1
    ok[EOS] = i >= 5 and i % 2 == 1
    return ok


def test_constrained_sampling_with_the_draft_model_following_the_grammar_is_exact():
    """The draft model (the fake target blurred) under the grammar, asked every step: the 2nd and
    4th tokens are distributed as the constrained target's p(x1 | x0) p(x3 | x0 x1 c), summed over x0."""
    prompt = [3, 5, 7, 3, 5, 8, 3, 5]
    n = 4000
    ctx = FakeContext(n_ctx=4096, n_batch=64, n_seq_max=4, sharp=False)
    drafts = DraftSequences(BlurredContext(n_ctx=4096, n_batch=64, n_seq_max=1, sharp=False))
    sched = Scheduler(Engine(ctx, 1), FakeModel(), lambda text: [DraftModelSource(drafts, text.lane, DraftConfig(
        draft_max=4), text.constraint)], Planner(cheap_draft()), ctx.n_ctx, ctx.n_ctx, exclusive=True, grammars=VOCAB)
    counts, drafted = collections.Counter(), 0
    for seed in range(n):
        request = Request(prompt, make_config(max_tokens=4, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                              seed=seed, grammar=FORCED_THIRD))
        sched.run(request)
        (result,) = request.results
        assert result.tokens[2] == 2
        counts[(result.tokens[1], result.tokens[3])] += 1
        drafted += result.stats.sources["draft"].drafted
    assert drafted > n  # the draft drafted (and took "c") in most texts
    assert_distributed(counts, constrained_pairs(prompt, allowed_forced_third, SAMPLED, between=[2]), n)


def test_a_grammar_that_does_not_parse_is_one_line():
    for bad, fragment in [('root ::= foo', "Rule 'foo' not found"), ('x ::= "a"', "No 'root' rule"),
                          ('', "empty")]:
        with pytest.raises(GrammarError, match=fragment) as e:
            Grammar.gbnf(bad).check()
        assert "\n" not in str(e.value)
    for bad, fragment in [('{"type": "objec"}', "unknown type 'objec'"), ('[1]', "is an object"),
                          ('{"type": "string", "format": "bogus"}', "Unknown format: bogus"),
                          ('{"$ref": "#/$defs/x"}', "points to nothing"), ('{bad', "is not JSON"),
                          ('{"type": "object", "properties": {"a": {}}, "required": ["b"]}', "requires 'b'")]:
        with pytest.raises(GrammarError, match=fragment) as e:
            Grammar.json_schema(bad).check()
        assert "\n" not in str(e.value) and "start:" not in str(e.value)
    with pytest.raises(GrammarError, match="LlamaGrammar"):
        Grammar.of(42)


def test_the_cli_checks_a_schema_before_loading_a_model(tmp_path):
    runner = CliRunner()
    for args, fragment in [(["-j", '{"type": "objec"}'], "unknown type 'objec'"),
                           (["--grammar", "root ::= foo"], "Rule 'foo' not found"),
                           (["--grammar-file", str(tmp_path / "none.gbnf")], "none.gbnf"),
                           (["-j", "{}", "--json-mode"], "not --json-schema and --json-mode")]:
        result = runner.invoke(cli, ["generate", "-m", str(tmp_path / "no-such-model.gguf"), "-p", "hi", *args])
        assert result.exit_code != 0 and fragment in result.output, result.output
        assert "no-such-model" not in result.output  # failed before loading


# --- JSON schemas on Qwen2.5's vocabulary --------------------------------------------------------

# (schema, text, allowed): whitespace only where llama.cpp's conversion puts its space rule
