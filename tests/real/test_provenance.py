"""Where each token came from, as data: the Python API's results and chunks, generate --json, the
server's replies and streamed chunks (OpenAI's chat and text completions, llama-server's
/completion), a request's own choice of sources (``spec``), and GET /metrics, read with
prometheus_client's parser, growing by exactly what a reply reports (SmolLM2, a prompt whose
answer repeats itself: lookup and lookahead have something to copy)."""

from __future__ import annotations

import json
import urllib.request
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from checks import Server
from conftest import THREADS, chatml, run
from llamaspec.engine.generation import PLAIN
from llamaspec.errors import ConfigError

REPEAT = "Repeat exactly: The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog."
SECRET = "zebracornish"  # in a prompt: never in the metrics


def check_provenance(tokens, sources, n_accept, per_source):
    """One source a token, "plain" for the target's own; the others are the accepted tokens (but an
    accepted end-of-generation token, counted, not in the text)."""
    assert len(sources) == len(tokens)
    counts = Counter(sources)
    assert n_accept - 1 <= sum(n for s, n in counts.items() if s != PLAIN) <= n_accept
    for name, n in counts.items():
        if name != PLAIN:
            assert n <= per_source[name]  # a token two sources proposed counts for both, is one's


def test_results_and_chunks_say_where_each_token_came_from(smol_auto, smol_plain):
    prompt = chatml(REPEAT)
    chunks = list(smol_auto.stream(prompt, max_tokens=48, temperature=0))
    result = chunks[-1].result
    accepted = {name: s.accepted for name, s in result.stats.sources.items()}
    check_provenance(result.tokens, result.sources, result.stats.n_accept, accepted)
    assert result.stats.n_accept > 5 and set(result.sources) - {PLAIN}, result.stats.summary()
    assert [s for c in chunks for s in c.sources] == result.sources
    assert all("".join(c.pieces) == c.text and len(c.pieces) == len(c.tokens) for c in chunks[:-1])
    plain = smol_auto.generate(prompt, max_tokens=48, temperature=0, sources="none")
    assert plain.text == smol_plain.generate(prompt, max_tokens=48, temperature=0).text
    assert set(plain.sources) == {PLAIN} and plain.stats.sources == {} and plain.stats.strategy == "plain"
    assert smol_auto.generate(prompt, max_tokens=4, sources="lookup").stats.strategy == "lookup"
    with pytest.raises(ConfigError, match=r"^spec: 'heads' is not a draft source this model runs"):
        smol_auto.generate(prompt, max_tokens=4, sources="lookup,heads")


def test_a_batcher_s_requests_choose_their_sources_too(smol_auto):
    prompt = chatml(REPEAT)
    with smol_auto.batcher(2) as batcher:
        with pytest.raises(ConfigError, match=r"^spec: 'nosuch' is not a draft source"):
            batcher.sample_stream(prompt, 1, max_tokens=4, sources="nosuch")
        stream = batcher.sample_stream(prompt, 1, max_tokens=24, temperature=0, sources="none")
        for _ in stream:
            pass
        result = stream.results[0]
    assert set(result.sources) == {PLAIN} and len(result.sources) == len(result.tokens)
    assert result.stats.sources == {}


def test_generate_json_gives_the_sources(smol):
    out = run("generate", "-m", smol, "-t", str(THREADS), "-c", "2048", "--temp", "0", "-n", "40", "--json",
              "--color-sources", "-p", chatml(REPEAT))
    assert out.exit_code == 0, out.stderr
    reply = json.loads(out.stdout)
    check_provenance(reply["tokens"], reply["sources"], reply["stats"]["n_accept"],
                     {n: s["accepted"] for n, s in reply["stats"]["sources"].items()})
    plain = run("generate", "-m", smol, "-t", str(THREADS), "-c", "2048", "--temp", "0", "-n", "40",
                "--color-sources", "-p", chatml(REPEAT))
    assert plain.exit_code == 0 and "\x1b[" not in plain.output  # not a terminal: no colours


@pytest.fixture(scope="module")
def server(smol):
    server = Server("-m", smol, "-t", str(THREADS), "-c", "2048")
    yield server
    server.stop()


def scrape(server) -> dict:
    with urllib.request.urlopen(server.url + "/metrics", timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    assert SECRET not in text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, sample.labels.get("source"))] = sample.value
    return values


def test_replies_streamed_or_not_carry_the_sources(server):
    client = server.client()
    ask = [{"role": "user", "content": REPEAT}]
    reply = client.chat.completions.create(model="x", messages=ask, max_tokens=40, temperature=0)
    sources = reply.choices[0].model_extra["sources"]
    extra = reply.model_extra
    check_provenance(range(reply.usage.completion_tokens), sources, extra["timings"]["draft_n_accepted"],
                     {n: s["accepted"] for n, s in extra["draft_sources"].items()})
    assert set(sources) - {PLAIN}
    streamed, text = [], ""
    for chunk in client.chat.completions.create(model="x", messages=ask, max_tokens=40, temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].model_extra.get("sources"):
            extra = chunk.choices[0].model_extra
            assert "".join(extra["pieces"]) == chunk.choices[0].delta.content
            streamed += extra["sources"]
        text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
    assert text == reply.choices[0].message.content and len(streamed) == reply.usage.completion_tokens
    done = client.completions.create(model="x", prompt=chatml(REPEAT), max_tokens=24, temperature=0)
    assert len(done.choices[0].model_extra["sources"]) == done.usage.completion_tokens
    status, native = server.request("POST", "/completion", {"prompt": chatml(REPEAT), "n_predict": 24,
                                                           "temperature": 0, "spec": "lookup"})
    assert status == 200 and len(native["sources"]) == native["tokens_predicted"]
    assert set(native["sources"]) <= {PLAIN, "lookup"} and set(native["draft_sources"]) == {"lookup"}
    status, message = server.request("POST", "/v1/messages", {"messages": ask, "max_tokens": 24, "temperature": 0})
    assert status == 200 and len(message["sources"]) == message["usage"]["output_tokens"]


def test_a_request_chooses_its_sources_and_an_unknown_one_is_a_400(server):
    client = server.client()
    ask = [{"role": "user", "content": REPEAT}]
    plain = client.chat.completions.create(model="x", messages=ask, max_tokens=24, temperature=0,
                                           extra_body={"spec": "none"})
    assert set(plain.choices[0].model_extra["sources"]) == {PLAIN} and plain.model_extra["draft_sources"] == {}
    status, body = server.request("POST", "/v1/chat/completions",
                                  {"messages": ask, "spec": "lookup,nosuch", "stream": True})
    assert status == 400 and body["error"]["param"] == "spec"
    assert "'nosuch' is not a draft source" in body["error"]["message"] and "\n" not in body["error"]["message"]


def test_metrics_grow_by_exactly_what_a_reply_reports(server):
    client = server.client()
    before = scrape(server)
    reply = client.chat.completions.create(model="x", messages=[{"role": "user", "content": f"{REPEAT} {SECRET}"}],
                                           max_tokens=40, temperature=0)
    after = scrape(server)

    def grew(name, source=None):
        return after.get((name, source), 0) - before.get((name, source), 0)
    timings, extra = reply.model_extra["timings"], reply.model_extra
    assert grew("llamaspec:requests_total") == 1 and grew("llamaspec:generations_total") == 1
    assert grew("llamacpp:prompt_tokens_total") == timings["prompt_n"]
    assert grew("llamacpp:tokens_predicted_total") == timings["predicted_n"]
    assert grew("llamacpp:tokens_predicted_seconds_total") == pytest.approx(timings["predicted_ms"] / 1000)
    assert grew("llamaspec:draft_tokens_accepted_total") == timings["draft_n_accepted"]
    assert extra["draft_sources"] and any(s["accepted"] for s in extra["draft_sources"].values())
    for name, s in extra["draft_sources"].items():
        assert grew("llamaspec:source_tokens_verified_total", name) == s["drafted"]
        assert grew("llamaspec:source_tokens_accepted_total", name) == s["accepted"]
        assert grew("llamaspec:source_steps_total", name) == s["steps"]
    for name, n in Counter(reply.choices[0].model_extra["sources"]).items():
        assert grew("llamaspec:tokens_generated_by_source_total", name) == n
    assert after[("llamacpp:requests_processing", None)] == 0 and after[("llamacpp:requests_deferred", None)] == 0
