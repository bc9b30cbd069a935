"""The verify loop on real models: KV invariant, stops, multi-turn reuse, sampling, memory."""

from __future__ import annotations

import collections

import numpy as np
import psutil
import pytest
from scipy.stats import chisquare

from llamaspec import PromptError, SamplingConfig, Stats, VocabMismatchError
from llamaspec.sampling import transform

from conftest import PROMPTS, QWEN, QWEN_DRAFT, SMOL, chatml


def assert_kv_invariant(spec):
    """Every cache holds exactly the accepted tokens but the pending last one."""
    engine = spec.engine
    n_past = len(engine.tokens) - 1
    for ctx in engine.contexts():
        assert ctx.pos_max(0) == n_past - 1
        assert ctx.tokens == engine.tokens[:n_past]


@pytest.mark.parametrize("fixture", ["smol_plain", "smol_self", "qwen_pair"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_kv_invariant_after_every_step(request, fixture, temperature):
    spec = request.getfixturevalue(fixture)
    stats = Stats()
    spec.engine.prefill(spec.tokenize(PROMPTS[1]), stats)
    assert_kv_invariant(spec)
    sampling = SamplingConfig(temperature=temperature, seed=1)
    steps = 0
    n = 24 if fixture == "qwen_pair" else 48
    for new, from_draft in spec.engine.steps(sampling, np.random.default_rng(1), n, stats):
        assert 1 <= len(new) and from_draft == len(new) - 1
        assert_kv_invariant(spec)
        steps += 1
    assert stats.n_target_calls == steps
    assert stats.n_predict == n and stats.n_accept <= stats.n_drafted
    if fixture != "smol_plain":
        assert stats.n_drafted > 0


def test_abandoned_stream_leaves_caches_consistent(smol_self):
    before = smol_self.generate(PROMPTS[0], max_tokens=16, temperature=0).tokens
    chunks = smol_self.stream(PROMPTS[0], max_tokens=64, temperature=0)
    for _, _ in zip(range(3), chunks):
        pass
    chunks.close()
    assert_kv_invariant(smol_self)
    assert len(smol_self.engine.tokens) > len(smol_self.tokenize(PROMPTS[0]))
    # the caches now hold part of a reply; the next generation must not be disturbed by it
    assert smol_self.generate(PROMPTS[0], max_tokens=16, temperature=0).tokens == before


def test_max_tokens(smol_self):
    result = smol_self.generate(PROMPTS[0], max_tokens=7, temperature=0)
    assert len(result.tokens) == 7 and result.stop_reason == "length"
    assert result.stats.n_predict == 7


def test_end_of_generation(smol_self):
    result = smol_self.generate(chatml("Say hello."), max_tokens=200, temperature=0)
    assert result.stop_reason == "stop" and len(result.tokens) < 200
    assert "<|im_end|>" not in result.text and result.text.strip()
    assert_kv_invariant(smol_self)


def test_stop_string_cuts_text_and_streams_no_partial_stop(smol_self):
    full = smol_self.generate(PROMPTS[0], max_tokens=64, temperature=0)
    words = full.text.split(" ")
    stop = " ".join(words[4:6])  # a stop string in the middle of the output
    start = full.text.index(stop)
    chunks = list(smol_self.stream(PROMPTS[0], max_tokens=64, temperature=0, stop=[stop]))
    result = chunks[-1].result
    assert result.stop_reason == "stop"
    assert result.text == full.text[:start]
    assert "".join(c.text for c in chunks) == result.text
    assert_kv_invariant(smol_self)


def test_full_context_stops_with_length(make_spec):
    spec = make_spec(SMOL, SMOL, n_ctx=64, draft_max=4, draft_p_min=0.0)
    prompt = spec.tokenize("1, 2, 3, 4, 5, 6, 7, 8, 9, 10,")
    result = spec.generate(prompt, max_tokens=-1, temperature=0)
    assert result.stop_reason == "length"
    n_ctx = spec.ctx.n_ctx  # llama.cpp rounds the size up (to 256 here)
    assert n_ctx < 300
    assert len(prompt) + len(result.tokens) == n_ctx + 1  # the last token is emitted, never evaluated
    assert_kv_invariant(spec)


def test_prompt_errors(make_spec, smol_self):
    spec = make_spec(SMOL, n_ctx=32)
    with pytest.raises(PromptError, match=f"context holds {spec.ctx.n_ctx}"):
        spec.generate("word " * 400)
    with pytest.raises(PromptError, match="empty"):
        smol_self.generate("")


def test_second_chat_turn_evaluates_only_new_tokens(qwen_pair):
    qwen_pair.reset()
    messages = [{"role": "user", "content": "Name three prime numbers."}]
    first = qwen_pair.chat(messages, max_tokens=32, temperature=0)
    assert first.stats.n_prompt_eval == first.stats.n_prompt - 1  # all but the pending token
    messages += [{"role": "assistant", "content": first.text},
                 {"role": "user", "content": "And three more?"}]
    second = qwen_pair.chat(messages, max_tokens=16, temperature=0)
    new_turn = qwen_pair.tokenize("<|im_end|>\n<|im_start|>user\nAnd three more?<|im_end|>\n"
                                  "<|im_start|>assistant\n", add_special=False)
    assert second.stats.n_prompt_eval <= len(new_turn) + 1
    assert second.stats.n_prompt > first.stats.n_prompt
    assert_kv_invariant(qwen_pair)


def test_vocab_mismatch_names_first_differing_token(make_spec):
    with pytest.raises(VocabMismatchError, match=r"first differing token \d+"):
        make_spec(QWEN, SMOL)


def first_token_counts(draw, n):
    return collections.Counter(draw(seed) for seed in range(n))


def chi2_against(p_ids, p_probs, counts, n):
    """Chi-square p-value of observed first tokens against the exact distribution (rare ones pooled)."""
    expected = p_probs * n
    big = expected >= 5
    obs = [counts.get(int(t), 0) for t in p_ids[big]]
    exp = list(expected[big])
    rest_obs = n - sum(obs)
    if (~big).any():
        obs.append(rest_obs)
        exp.append(expected[~big].sum())
    else:
        assert rest_obs == 0
    return chisquare(obs, exp).pvalue


def test_speculative_sampling_matches_target_distribution(make_spec, qwen_plain):
    """First-token frequencies of speculative and of plain sampling both match the target's exact p."""
    spec = make_spec(QWEN, QWEN_DRAFT, draft_max=2, draft_p_min=0.0)
    prompt = spec.tokenize(chatml("Name one animal. Answer with one word."))
    options = dict(temperature=1.5, top_k=6, top_p=1.0, min_p=0.0)
    # the exact target distribution of the first token
    plain_engine = qwen_plain.engine
    plain_engine.prefill(prompt, Stats())
    qwen_plain.ctx.eval(prompt[-1:], logits="last")
    p = transform(qwen_plain.ctx.logits_ith(-1), SamplingConfig(**options))
    qwen_plain.ctx.truncate(len(prompt) - 1)
    n = 240
    rejected = 0

    def speculative(seed):
        nonlocal rejected
        r = spec.generate(prompt, max_tokens=2, seed=seed, **options)
        rejected += r.stats.n_accept < r.stats.n_drafted
        assert r.stats.n_drafted >= 1
        return r.tokens[0]

    spec_counts = first_token_counts(speculative, n)
    plain_counts = first_token_counts(
        lambda seed: qwen_plain.generate(prompt, max_tokens=1, seed=seed, **options).tokens[0], n)
    assert rejected > 10, "the draft must disagree with the target for this test to mean anything"
    assert chi2_against(p.ids, p.probs, spec_counts, n) > 1e-3
    assert chi2_against(p.ids, p.probs, plain_counts, n) > 1e-3


def test_fifty_generations_do_not_leak(smol_self):
    process = psutil.Process()

    def run(times):
        for i in range(times):
            smol_self.generate(PROMPTS[0], max_tokens=8, temperature=0.7, seed=i)

    run(10)
    before = process.memory_info().rss
    run(50)
    growth = process.memory_info().rss - before
    assert growth < 16 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over 50 generations"


def test_failed_decode_raises_our_error(smol_plain):
    from llamaspec import DecodeError
    ctx = smol_plain.ctx
    n = len(ctx.tokens)
    with pytest.raises(DecodeError, match="llama_decode failed"):
        ctx.eval([smol_plain.model.n_vocab + 10])  # a token id outside the vocabulary
    assert len(ctx.tokens) == n and ctx.pos_max(0) == n - 1
