"""Requests from several threads decoded together through a Batcher (SmolLM2): greedy text as
alone, choices, lane caches reused, a stream closed early, the batcher closed under load, errors."""

from __future__ import annotations

import threading
import time

import pytest

from llamaspec import ConfigError, PromptError
from llamaspec.openai import completions

from conftest import PROMPTS, SMOL
from checks import JSON_PROMPT, assert_as_alone


@pytest.fixture(scope="module")
def smol_batched(module_spec):
    spec = module_spec(SMOL)
    return spec, spec.batcher(4)


def read(stream):
    for _ in stream:
        pass
    return stream.results


def ask_together(batcher, prompts, max_tokens, stagger=0.0):
    """Each prompt's results, asked from a thread of its own, request i ``stagger * i`` seconds in."""
    results = [None] * len(prompts)

    def ask(i):
        time.sleep(stagger * i)
        results[i] = read(batcher.sample_stream(prompts[i], max_tokens=max_tokens, temperature=0))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return results


def test_six_threads_on_four_lanes_answer_as_alone(smol_batched, reference):
    spec, batcher = smol_batched
    prompts = [spec.tokenize(p) for p in PROMPTS] * 2
    alone = [spec.generate(p, max_tokens=40, temperature=0).tokens for p in prompts[:3]] * 2
    results = ask_together(batcher, prompts, 40)
    for i, (p, r, expected) in enumerate(zip(prompts, results, alone)):
        assert r is not None and len(r) == 1 and r[0].stop_reason in ("length", "stop"), i
        assert_as_alone(reference(SMOL), p, r[0].tokens, expected, f"request {i}")
    assert not batcher.scheduler.busy


def test_a_request_reuses_the_lane_that_holds_its_prompt(smol_batched):
    spec, batcher = smol_batched
    first = read(batcher.sample_stream(PROMPTS[2], max_tokens=8, temperature=0))[0]
    follow = spec.tokenize(PROMPTS[2]) + first.tokens
    again = read(batcher.sample_stream(follow, max_tokens=8, temperature=0))[0]
    assert again.stats.n_prompt_eval == 1, again.stats.summary()


def test_choices_and_their_totals(module_spec):
    """Streamed and non-streamed choices compared on plain decoding, whose batches have one shape
    every time (with drafts, the planner's choices follow live timings, and a batch of another size
    rounds differently, which can move a draw at a near-tie)."""
    spec = module_spec(SMOL, spec="none")
    batcher = spec.batcher(4)
    messages = [{"role": "user", "content": "Name a colour."}]

    def streamed(**kw):
        texts, last = ["", "", ""], None
        for chunk in completions.create_chat_completion(spec, messages, n=3, max_tokens=12, temperature=0.9, seed=7,
                                                        stream=True, **kw):
            for choice in chunk["choices"]:
                texts[choice["index"]] += choice["delta"].get("content") or ""
            last = chunk
        return texts, last

    for kw in ({"batcher": batcher}, {}):  # beside other requests; on the LlamaSpec's own context
        reply = completions.create_chat_completion(spec, messages, n=3, max_tokens=12, temperature=0.9, seed=7, **kw)
        assert [c["index"] for c in reply["choices"]] == [0, 1, 2]
        assert 0 < reply["usage"]["completion_tokens"] <= reply["timings"]["predicted_n"]  # + end-of-generation tokens
        assert reply["usage"]["prompt_tokens"] == len(spec.chat_prompt(messages)[0])
        # asked again, streamed: the same samples (seed + i each). (Both read only the prompt's last
        # token from the cache; a prompt read whole, in a batch of another size, rounds differently.)
        texts, last = streamed(**kw)
        assert texts == [c["message"]["content"] for c in reply["choices"]], kw
        assert last["usage"]["completion_tokens"] == reply["usage"]["completion_tokens"]


def test_a_stream_closed_early_leaves_the_batch_at_once(smol_batched):
    spec, batcher = smol_batched
    stream = batcher.sample_stream(PROMPTS[0], max_tokens=1000, temperature=0)
    next(stream)
    next(stream)
    stream.close()
    assert stream.results[0].stop_reason == "interrupted" and stream.done
    deadline = time.monotonic() + 10
    while batcher.scheduler.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not batcher.scheduler.busy
    assert read(batcher.sample_stream(PROMPTS[1], max_tokens=4, temperature=0))[0].stop_reason == "length"


def test_errors_come_before_decoding(smol_batched):
    spec, batcher = smol_batched
    with pytest.raises(ConfigError, match="at most 4"):
        batcher.sample_stream(JSON_PROMPT, n=5, temperature=0.8)
    with pytest.raises(ConfigError, match="temperature 0"):
        batcher.sample_stream(JSON_PROMPT, n=2, temperature=0)
    with pytest.raises(PromptError, match="context holds 2048 per sequence"):
        batcher.sample_stream("word " * 3000)
    with pytest.raises(ConfigError, match="between 1 and"):
        spec.batcher(0)


def test_closing_the_batcher_ends_its_requests(make_spec):
    spec = make_spec(SMOL)
    batcher = spec.batcher(2)
    streams = [batcher.sample_stream(p, max_tokens=1000, temperature=0) for p in PROMPTS]  # the third waits
    next(streams[0])
    batcher.close()
    for s in streams:
        results = read(s)
        assert len(results) == 1 and results[0].stop_reason == "interrupted"
    with pytest.raises(Exception, match="closed"):
        batcher.sample_stream(PROMPTS[0])
    spec.close()  # closes its batchers again: nothing left to do


def test_requests_arriving_at_different_times_answer_as_alone(smol_batched, reference):
    """Prompts of different lengths join while others decode, each at its own time: every lane's
    text is what it gives alone (or leaves it at a near-tie)."""
    spec, batcher = smol_batched
    long_prompt = spec.tokenize(PROMPTS[2] + " Then explain each correction." * 40)
    prompts = [spec.tokenize(PROMPTS[0]), long_prompt, spec.tokenize(PROMPTS[1]), spec.tokenize(PROMPTS[2])]
    alone = [spec.generate(p, max_tokens=30, temperature=0).tokens for p in prompts]
    results = ask_together(batcher, prompts, 30, stagger=0.15)  # each joins a batch already decoding
    for i, (p, r, expected) in enumerate(zip(prompts, results, alone)):
        assert r is not None and r[0].stop_reason in ("length", "stop"), i
        assert_as_alone(reference(SMOL), p, r[0].tokens, expected, f"request {i}")


def test_a_long_prompt_joining_does_not_stall_the_lanes_decoding(smol_batched):
    """While a long prompt is read a chunk a step, a lane already decoding gets a token every
    step: most of its chunks arrive before the long prompt's first token, not after."""
    spec, batcher = smol_batched
    long_prompt = spec.tokenize("word " * 1500)
    seen = []  # (which request, when its chunk was read)
    decoding = batcher.sample_stream(PROMPTS[0], max_tokens=200, temperature=0)
    next(decoding)  # its prompt read: decoding from now on

    def follow(name, stream):
        for chunk in stream:
            if chunk[1].tokens:
                seen.append((name, time.monotonic()))

    readers = [threading.Thread(target=follow, args=("decoding", decoding))]
    readers[0].start()
    reading = batcher.sample_stream(long_prompt, max_tokens=2, temperature=0)
    readers.append(threading.Thread(target=follow, args=("reading", reading)))
    readers[1].start()
    for t in readers:
        t.join(300)
    first_token = min(t for name, t in seen if name == "reading")
    before = sum(1 for name, t in seen if name == "decoding" and t < first_token)
    steps = len(long_prompt) // 64  # its chunks: the other lane decodes beside each one
    assert before >= steps // 2, f"{before} tokens of the decoding lane while {len(long_prompt)} prompt tokens were read"


def test_each_lane_keeps_its_conversation_prefix(smol_batched):
    """Two conversations take turns on the lanes: each next turn goes to the lane holding its
    history and reads only its new tokens, whatever the other conversation read meanwhile."""
    spec, batcher = smol_batched
    histories = [spec.tokenize(PROMPTS[0]), spec.tokenize(PROMPTS[1])]
    for turn in range(3):
        for k in range(2):
            result = read(batcher.sample_stream(histories[k], max_tokens=6, temperature=0))[0]
            if turn:
                assert result.stats.n_prompt_eval <= 1 + 3, (turn, k, result.stats.summary())
            histories[k] = histories[k] + result.tokens + spec.tokenize(" Go on.", add_special=False)
