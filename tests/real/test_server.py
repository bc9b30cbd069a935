"""llamaspec serve as a real process on 127.0.0.1, asked by the real openai client (SmolLM2):
the same text as llamaspec generate, streams, usage and timings, concurrent clients, a full
queue, a client gone mid-stream, every bad input with its status and body, an API key, memory."""

from __future__ import annotations

import json
import signal
import socket
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import psutil
import pytest
from openai import APIStatusError

from conftest import QWEN_DRAFT, SMOL, THREADS, assert_one_line_error, near_tie, run
from checks import Server, WEATHER


PROMPTS = ["Once upon a time", "def fibonacci(n):", "The capital of France", "import numpy as np",
           "Dear customer,", "# A list of fruits\n", "SELECT name FROM", "Roses are red,"]


@pytest.fixture(scope="module")
def plain_server(smol):
    """Plain decoding: the tests comparing texts need no near-tie allowance."""
    server = Server("-m", smol, "-t", str(THREADS), "-c", "2048", "--spec", "none")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server(smol):
    """What a user starts: every draft source (lookup and lookahead with one model), a short queue."""
    server = Server("-m", smol, "-t", str(THREADS), "-c", "2048", "--queue", "2")
    yield server
    server.stop()


def generate(smol, *args) -> dict:
    out = run("generate", "-m", smol, "-t", str(THREADS), "-c", "2048", "--spec", "none", "--temp", "0",
              "--json", *args)
    assert out.exit_code == 0, out.stderr
    return json.loads(out.stdout)


def test_chat_and_completions_give_llamaspec_generate_s_text_streamed_or_not(plain_server, smol):
    client = plain_server.client()
    question = "Name three colours."
    expected = generate(smol, "--chat", "-p", question, "-n", "40")
    reply = client.chat.completions.create(model="x", messages=[{"role": "user", "content": question}],
                                           max_tokens=40, temperature=0)
    assert reply.choices[0].message.content == expected["text"]
    assert reply.choices[0].finish_reason == ("length" if expected["stop_reason"] == "length" else "stop")
    assert reply.usage.completion_tokens == len(expected["tokens"])
    assert reply.usage.prompt_tokens == expected["stats"]["n_prompt"]
    timings = reply.model_extra["timings"]
    assert timings["predicted_n"] == expected["stats"]["n_predict"] and timings["predicted_per_second"] > 0
    assert set(timings) == {"cache_n", "prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
                            "predicted_per_second", "draft_n", "draft_n_accepted", "llama_ms"}
    assert 0 < timings["llama_ms"] <= timings["predicted_ms"]
    pieces, usage = [], None
    for chunk in client.chat.completions.create(model="x", messages=[{"role": "user", "content": question}],
                                                max_tokens=40, temperature=0, stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        if chunk.usage:
            usage = chunk.usage
    assert "".join(pieces) == expected["text"] and usage.completion_tokens == len(expected["tokens"])

    prompt = "def fibonacci(n):"
    expected = generate(smol, "-p", prompt, "-n", "40")
    done = client.completions.create(model="x", prompt=prompt, max_tokens=40, temperature=0)
    assert done.choices[0].text == expected["text"] and done.usage.completion_tokens == len(expected["tokens"])
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="x", prompt=prompt, max_tokens=40, temperature=0, stream=True) if c.choices)
    assert streamed == expected["text"]


def test_stop_strings_are_never_sent_not_even_in_part(plain_server):
    client = plain_server.client()
    full = client.completions.create(model="x", prompt="Roses are red,", max_tokens=40, temperature=0).choices[0].text
    stop = full[12:18]
    pieces = [c.choices[0].text for c in client.completions.create(
        model="x", prompt="Roses are red,", max_tokens=40, temperature=0, stop=[stop], stream=True) if c.choices]
    assert "".join(pieces) == full[:full.index(stop)]
    assert not any(stop[:k] in piece and piece.endswith(stop[:k]) for piece in pieces[-1:] for k in range(2, 4))


def test_eight_clients_at_once_each_get_their_answer_alone(plain_server):
    client = plain_server.client()

    def ask(prompt):
        return client.completions.create(model="x", prompt=prompt, max_tokens=24, temperature=0).choices[0].text
    alone = [ask(p) for p in PROMPTS]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, PROMPTS))
    assert together == alone


@pytest.fixture(scope="module")
def parallel_server(smol):
    """Four requests decoded together, drafting from text (what `serve --parallel 4` runs)."""
    server = Server("-m", smol, "-t", str(THREADS), "-c", "2048", "--parallel", "4")
    yield server
    server.stop()


def assert_text_as_alone(ref, prompt: str, text: str, n: int) -> None:
    """``text`` is plain greedy decoding's, or leaves it first at a token whose top-1/top-2 logit
    gap is below the model's near-tie (a batch of other rows rounds differently). Only the text is known: where
    it departs at token k, its own token there may have been a longer one that begins with token
    k-1's text (' Output' where plain chose ' ', then '\n'), so the departure is at k-1 or k."""
    tokens, gaps = ref.greedy(ref.model.tokenize(prompt, add_special=True, parse_special=True), n)
    for k in range(len(tokens)):
        if not text.startswith(ref.model.detokenize(tokens[:k + 1])):
            gap = min(gaps[max(k - 1, 0):k + 1])
            assert gap < ref.near_tie, f"{prompt!r}: token {k} leaves plain greedy (gap {gap:.3f}): {text!r}"
            return
    assert text == ref.model.detokenize(tokens), prompt


def test_eight_clients_on_four_parallel_sequences_answer_as_alone(parallel_server, reference):
    client = parallel_server.client()

    def ask(prompt):
        return client.completions.create(model="x", prompt=prompt, max_tokens=24, temperature=0).choices[0].text
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, PROMPTS))
    for prompt, text in zip(PROMPTS, together):
        assert_text_as_alone(reference(SMOL), prompt, text, 24)


def test_a_long_request_does_not_hold_back_short_ones(parallel_server):
    """A request joins the batch at once and leaves it when done: short answers asked while a
    long one streams come back before it ends."""
    client = parallel_server.client()
    ended = {}

    def long_one(_):
        stream = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Write a long story "
                                                "about a dragon."}], max_tokens=300, temperature=0, stream=True)
        n = sum(1 for _ in stream)
        ended["long"] = time.monotonic()
        return n

    def short(prompt):
        text = client.completions.create(model="x", prompt=prompt, max_tokens=8, temperature=0).choices[0].text
        return time.monotonic(), text

    with ThreadPoolExecutor(4) as pool:
        long_future = pool.submit(long_one, 0)
        time.sleep(1.0)  # the long one is decoding
        shorts = list(pool.map(short, PROMPTS[:3]))
        assert long_future.result() > 100
    assert all(t < ended["long"] for t, _ in shorts), (shorts, ended)
    assert all(text for _, text in shorts)


def test_n_choices(parallel_server, plain_server):
    """n choices are n samples (seed + i each), streamed or not, from either kind of server. Streamed
    and non-streamed are compared on the plain server, whose batches have the same shape every time
    (the planner's choices follow live timings, and a batch of another size rounds differently, which
    can move a draw at a near-tie)."""
    messages = [{"role": "user", "content": "Name a colour."}]
    for srv in (parallel_server, plain_server):
        client = srv.client()
        # asked twice: the second reads the prompt from the cache, as the streamed one will (a
        # prompt read whole, in a batch of another size, rounds differently)
        for _ in range(2):
            reply = client.chat.completions.create(model="x", messages=messages, n=3, max_tokens=12,
                                                   temperature=0.9, seed=7)
        assert [c.index for c in reply.choices] == [0, 1, 2] and all(c.message.content for c in reply.choices)
        assert reply.usage.completion_tokens > 0
        texts = ["", "", ""]
        for chunk in client.chat.completions.create(model="x", messages=messages, n=3, max_tokens=12,
                                                    temperature=0.9, seed=7, stream=True):
            for choice in chunk.choices:
                texts[choice.index] += choice.delta.content or ""
        assert all(texts)
        if srv is plain_server:
            assert texts == [c.message.content for c in reply.choices]
        done = client.completions.create(model="x", prompt="Roses are red,", n=2, max_tokens=8, temperature=1.0)
        assert [c.index for c in done.choices] == [0, 1]
    status, answer = parallel_server.request("POST", "/v1/completions", {"prompt": "hi", "n": 5, "temperature": 1})
    assert status == 400 and "at most 4 sequences together (--parallel)" in answer["error"]["message"]


def test_parallel_with_a_draft_model_drafts_for_every_request(smol, reference):
    """`serve --parallel 2 -md`: the draft model drafts for both requests decoded together, each
    on its own sequence (verified whole every step here, so that it runs on a CPU), and each
    answer is plain greedy decoding's."""
    server = Server("-m", smol, "-md", smol, "-t", str(THREADS), "-c", "1024", "--parallel", "2",
                    "--spec", "draft", "--spec-fixed", "draft", "--draft-max", "4")
    try:
        client = server.client()

        def ask(prompt):
            return client.completions.create(model="x", prompt=prompt, max_tokens=24, temperature=0)
        with ThreadPoolExecutor(2) as pool:
            replies = list(pool.map(ask, PROMPTS[:2]))
    finally:
        server.stop()
    for prompt, reply in zip(PROMPTS, replies):
        assert reply.model_extra["timings"]["draft_n"] > 0
        assert_text_as_alone(reference(SMOL), prompt, reply.choices[0].text, 24)


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
                                           "city": {"type": "string", "maxLength": 30}},
          "required": ["name", "age", "city"]}
ADA = [{"role": "user", "content": "Ada Lovelace, 36, lives in London. Give her record as JSON."}]


def test_structured_output_through_the_openai_client(server, parallel_server, smol):
    """response_format json_schema (as OpenAI's client sends it) and llama-server's json_schema
    field: the reply validates, streamed or not, one choice or n, on either kind of server; greedy,
    it is `llamaspec generate --chat -j`'s text (every source on both sides)."""
    expected = run("generate", "-m", smol, "-t", str(THREADS), "-c", "2048", "--temp", "0", "--json", "--chat",
                   "-p", ADA[0]["content"], "-j", json.dumps(PERSON), "-n", "120")
    assert expected.exit_code == 0, expected.stderr
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for srv in (server, parallel_server):
        client = srv.client()
        reply = client.chat.completions.create(model="x", messages=ADA, response_format=fmt, max_tokens=120,
                                               temperature=0)
        text = reply.choices[0].message.content
        jsonschema.validate(json.loads(text), PERSON)
        if srv is server:
            assert text == json.loads(expected.stdout)["text"]
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="x", messages=ADA, response_format=fmt, max_tokens=120, temperature=0, stream=True) if c.choices)
        jsonschema.validate(json.loads(streamed), PERSON)
        several = client.chat.completions.create(model="x", messages=ADA, n=3, max_tokens=120, temperature=0.9,
                                                 seed=3, extra_body={"json_schema": PERSON})
        for choice in several.choices:
            jsonschema.validate(json.loads(choice.message.content), PERSON)
        done = client.completions.create(model="x", prompt="Colours: ", max_tokens=8, temperature=0,
                                         extra_body={"grammar": 'root ::= "red" | "green" | "blue"'})
        assert done.choices[0].text in ("red", "green", "blue") and done.choices[0].finish_reason == "stop"


def test_a_server_started_with_a_schema_constrains_requests_that_ask_for_no_format(smol, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    server = Server("-m", smol, "-t", str(THREADS), "-c", "2048", "--json-schema", str(schema))
    try:
        client = server.client()
        reply = client.chat.completions.create(model="x", messages=ADA, max_tokens=120, temperature=0)
        jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)
        hello = [{"role": "user", "content": "Say hello."}]
        free = client.chat.completions.create(model="x", messages=hello, max_tokens=8, temperature=0,
                                              response_format={"type": "text"})
        held = client.chat.completions.create(model="x", messages=hello, max_tokens=8, temperature=0)
        assert not free.choices[0].message.content.startswith("{") and held.choices[0].message.content.startswith("{")
    finally:
        server.stop()


def test_a_full_queue_answers_503_at_once(server):
    client = server.client()

    def ask(_):
        t0 = time.monotonic()
        try:
            client.completions.create(model="x", prompt="Count to five hundred:", max_tokens=150, temperature=0)
            return 200, time.monotonic() - t0
        except APIStatusError as e:
            assert e.response.json()["error"]["type"] == "server_busy"
            return e.status_code, time.monotonic() - t0
    with ThreadPoolExecutor(6) as pool:  # one runs, two wait, three are turned away
        results = list(pool.map(ask, range(6)))
    busy = [t for code, t in results if code == 503]
    assert sorted(code for code, _ in results).count(200) >= 3 and len(busy) >= 1
    assert max(busy) < 2.0  # at once, not after waiting


def assert_same_or_near_tie(a, b) -> None:
    """Two greedy answers of a speculating server to one prompt: the same text, or the first token
    they differ at a near-tie of the first's (a verify batch is not one row at a time)."""
    if a.text == b.text:
        return
    ta, tb = a.logprobs.tokens, b.logprobs.tokens
    k = next(i for i, (x, y) in enumerate(zip(ta + [None], tb + [None])) if x != y)
    top = a.logprobs.top_logprobs[k]
    assert tb[k] in top and top[ta[k]] - top[tb[k]] < near_tie(SMOL), (k, ta[k], tb[k], top)


def test_a_client_gone_mid_stream_stops_its_generation_and_the_next_request_is_right(server):
    client = server.client()

    def fibonacci():
        return client.completions.create(model="x", prompt="def fibonacci(n):", max_tokens=24, temperature=0,
                                         logprobs=2).choices[0]
    expected = fibonacci()
    body = json.dumps({"prompt": "Write a long story about a dragon.", "max_tokens": 2000, "temperature": 0,
                       "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        seen = b""
        while b"data: " not in seen:  # streaming
            data = s.recv(4096)
            assert data, seen
            seen += data
    t0 = time.monotonic()  # the socket is closed: the generation must end now, not after 2000 tokens
    again = fibonacci()
    assert time.monotonic() - t0 < 10
    assert_same_or_near_tie(expected, again)
    assert server.get("/health") == (200, {"status": "ok"})


BAD = [
    ("/v1/chat/completions", b"{not json", "not valid JSON"),
    ("/v1/chat/completions", b"[1, 2]", "must be a JSON object"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {}, "messages: Field required"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": 9}, "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2, "temperature": 0},
     "temperature 0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 17}, "17"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2},
     "top_logprobs needs logprobs: true"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi " * 3000}]}, "fit in the context"),
    ("/v1/completions", {"prompt": "word " * 3000}, "context holds"),
    ("/v1/completions", {"prompt": ""}, "empty"),
    ("/v1/completions", {"prompt": [10**9]}, "not in the vocabulary"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 2, "echo": True, "suffix": "x"}, "echo with logprobs and a suffix"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "mirostat": 3}, "mirostat"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f"}],
                              "function_call": "required"}, 'function_call is "auto", "none" or'),
    ("/v1/completions", {"prompt": "hi", "suffix": "x"}, "has no fill-in-the-middle tokens"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"99999999": 1}}, "not in the vocabulary"),
    ("/v1/completions", {"prompt": "hi", "repeat_penalty": 0}, "repeat_penalty: Input should be greater than 0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs: Input should be less than or equal to 20"),
    ("/infill", {"input_prefix": "def f():"}, "input_suffix: Field required"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}}, "unknown type 'objec'"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "xml"}},
     "'xml' is not one of"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "response_format": {
        "type": "json_schema"}}, "needs"),
    ("/v1/completions", {"prompt": "hi", "grammar": "root ::= foo"}, "Rule 'foo' not found"),
    ("/v1/completions", {"prompt": "hi", "json_schema": {"type": "object", "required": ["a"], "properties": {"b": {}}}},
     "requires 'a'"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": float("nan")},
     "temperature: Input should be a finite number"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "seed": 2**70}, "seed: Input should be less"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages.0.content: only text is supported"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]},
     "SmolLM2-135M-Instruct.Q4_1.gguf's chat template does not render tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER],
                              "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "names the function 'get_time', which is not among the tools"),
    # hostile schemas, grammars and bodies: a 400 whose message names the part at fault
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5000)}}}}},
     "response_format.json_schema.schema.properties: 5000 optional properties; at most 2500 are supported"),
    ("/v1/completions", {"prompt": "hi", "json_schema": {"enum": list(range(60000))}},
     "json_schema.enum: an enum of 60000 values; at most 50000 are supported"),
    ("/v1/completions", {"prompt": "hi", "grammar": 'root ::= x\nx ::= x "a"'},
     "grammar: the grammar is not usable: it allows no text at all"),
    ("/v1/completions", {"prompt": "hi", "stream": True, "grammar": 'root ::= x\nx ::= x "a"'},
     "grammar: the grammar is not usable: it allows no text at all"),
    ("/v1/completions", {"prompt": "hi", "json_schema": {"properties": {"a": {"type": "string", "pattern": "a(b"}}}},
     "json_schema.properties.a: the JSON schema is not usable: the regex 'a(b' does not parse: unclosed group"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "x": ' + b"[" * 2000 + b"]" * 2000
     + b"}", "the body nests more than 512 levels deep"),
    ("/v1/chat/completions", b'{"messages": [], "x": ' + b"[" * 100000 + b"]" * 100000 + b"}",
     "the body nests more than 512 levels deep"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"100": "abc"}},
     'logit_bias is an object of token ids to numbers (false bans the token), or a list of [token id, number] '
     'pairs, got {"100": "abc"}'),
]


@pytest.mark.parametrize("kind", ["server", "parallel_server"])
@pytest.mark.parametrize("path, body, fragment", BAD)
def test_bad_input_is_a_4xx_with_an_openai_error_body(request, kind, path, body, fragment):
    server = request.getfixturevalue(kind)
    status, answer = server.request("POST", path, body)
    assert status == 400, (status, answer)
    assert set(answer) == {"error"} and set(answer["error"]) == {"message", "type", "param", "code"}
    assert fragment in answer["error"]["message"] and answer["error"]["type"] == "invalid_request_error"
    assert len(answer["error"]["message"]) <= 300 and "\n" not in answer["error"]["message"]
    assert server.get("/health") == (200, {"status": "ok"})


def _stream(server, body: dict) -> list:
    """The server-sent events of a streamed completion, read to the end."""
    req = urllib.request.Request(server.url + "/v1/completions", data=json.dumps({**body, "stream": True}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return [line[len(b"data: "):].decode() for line in r.read().split(b"\n\n") if line.startswith(b"data: ")]


def test_hostile_grammars_during_another_client_s_stream_leave_it_whole_and_hold_up_no_one(plain_server):
    """While a stream is under way: a schema the grammar engine once crashed on, a grammar whose
    compiling runs out of its time limit and a body nested 2,000 deep each get their 400, and the
    stream ends with [DONE] and the text it has alone. Then a plain request sent while the slow
    grammar compiles is answered before that grammar's 400."""
    body = {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0}
    alone = plain_server.client().completions.create(model="x", **body).choices[0].text
    hostile = [("/v1/completions", {"prompt": "hi", "json_schema": {
                   "type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(3500)}}}),
               ("/v1/completions", {"prompt": "hi", "grammar": "root ::= r0\n" + "\n".join(
                   f'r{i} ::= "a" r{i + 1}' for i in range(20000)) + '\nr20000 ::= "b"'}),
               ("/v1/chat/completions", b'{"messages": [], "x": ' + b"[" * 2000 + b"]" * 2000 + b"}")]
    with ThreadPoolExecutor(4) as pool:
        stream = pool.submit(_stream, plain_server, body)
        answers = [pool.submit(plain_server.request, "POST", path, b) for path, b in hostile]
        assert [a.result()[0] for a in answers] == [400, 400, 400]
        assert "took more than 1 s" in answers[1].result()[1]["error"]["message"]
        events = stream.result()
        assert events[-1] == "[DONE]"
        assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == alone
        slow = pool.submit(plain_server.request, "POST", *hostile[1])
        time.sleep(0.3)  # the slow grammar is compiling
        quick = plain_server.client().completions.create(model="x", prompt="def f(", max_tokens=2, temperature=0)
        assert quick.choices[0].text and not slow.done()
        assert slow.result()[0] == 400
    assert plain_server.get("/health") == (200, {"status": "ok"})


def test_tools_through_the_openai_client(model_file):
    """Qwen2.5-Coder-0.5B (its template renders tools): the call parsed by the client, whole and
    streamed, with tool_choice "required" and a named function; the follow-up with the call and
    its result, answered as text; the deprecated functions and function_call. (Whether a model
    calls a tool of its own accord, "auto", and reads the result: the 1.5B in process,
    tests/real/test_tools.py; the 0.5B does neither.)"""
    qwen = Server("-m", str(model_file(QWEN_DRAFT)), "-t", str(THREADS), "-c", "2048", "--spec", "none")
    try:
        client = qwen.client()
        ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
        for tool_choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            reply = client.chat.completions.create(model="x", messages=ask, tools=[WEATHER], tool_choice=tool_choice,
                                                   temperature=0, max_tokens=60)
            choice = reply.choices[0]
            assert choice.finish_reason == "tool_calls" and choice.message.content is None, tool_choice
            [call] = choice.message.tool_calls
            assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
            arguments = json.loads(call.function.arguments)
            jsonschema.validate(arguments, WEATHER["function"]["parameters"])
            calls, reasons = {}, []
            for chunk in client.chat.completions.create(model="x", messages=ask, tools=[WEATHER],
                                                        tool_choice=tool_choice, temperature=0, max_tokens=60,
                                                        stream=True):
                delta = chunk.choices[0].delta
                assert not delta.content
                for part in delta.tool_calls or []:
                    got = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
                    got["id"] = got["id"] or part.id
                    got["name"] += part.function.name or ""
                    got["arguments"] += part.function.arguments or ""
                reasons.append(chunk.choices[0].finish_reason)
            assert reasons[-1] == "tool_calls" and calls[0]["id"].startswith("call_")
            assert list(calls) == [0]
            assert (calls[0]["name"], json.loads(calls[0]["arguments"])) == ("get_weather", arguments)
        result = {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "sunny"})}
        follow = client.chat.completions.create(model="x", messages=[*ask, choice.message.model_dump(), result],
                                                temperature=0, max_tokens=40)
        assert follow.choices[0].finish_reason == "stop" and follow.choices[0].message.content.strip()
        legacy = client.chat.completions.create(model="x", messages=ask, functions=[WEATHER["function"]],
                                                function_call={"name": "get_weather"}, temperature=0, max_tokens=60)
        assert legacy.choices[0].finish_reason == "function_call"
        assert legacy.choices[0].message.function_call.name == "get_weather"
        assert json.loads(legacy.choices[0].message.function_call.arguments) == arguments
    finally:
        qwen.stop()


def test_completions_without_max_tokens_stop_at_16_as_openai_s_do_and_tool_choice_none_is_neutral(server):
    status, answer = server.request("POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": None,
                                                                "temperature": 0})
    assert status == 200 and answer["usage"]["completion_tokens"] <= 16, answer
    status, answer = server.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "tool_choice": "none", "max_tokens": 4})
    assert status == 200, answer


@pytest.mark.parametrize("kind", ["server", "parallel_server"])
def test_a_client_that_gives_up_on_a_whole_answer_frees_its_turn(request, kind):
    """A non-streaming client leaves (its timeout) during a long answer: the generation stops
    within a step, and the next request is answered at once, not after the abandoned one's end."""
    srv = request.getfixturevalue(kind)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 1500, "temperature": 0}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    clients = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(4 if kind == "parallel_server" else 1)]
    for c in clients:
        c.sendall(head + body)
    time.sleep(1.0)  # their answers are under way
    for c in clients:  # the clients' timeouts: they close without reading
        c.close()
    gone = time.monotonic()
    status, answer = srv.request("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 4, "temperature": 0})
    assert status == 200 and answer["choices"][0]["text"], answer
    assert time.monotonic() - gone < 2.5


def _half_closed(port: int, request: bytes) -> bytes:
    """Send ``request``, close the sending side (as nc -N does), read until the server closes."""
    c = socket.create_connection(("127.0.0.1", port))
    c.settimeout(30)
    try:
        c.sendall(request)
        c.shutdown(socket.SHUT_WR)
        reply = b""
        for _ in range(10_000):
            chunk = c.recv(65536)
            if not chunk:
                return reply
            reply += chunk
        raise AssertionError("the reply never ended")
    finally:
        c.close()


def test_a_body_cut_short_is_one_log_line_and_a_half_closed_client_is_answered(smol):
    """Three clients close while sending their body and one half-closes mid-body: one log line
    each, saying the client left, and no traceback. One half-closes after a whole HTTP/1.0
    request (nc -N): it gets its whole answer, as llama-server gives it."""
    server = Server("-m", smol, "-t", str(THREADS), "-c", "1024")
    cut = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: 1000\r\n\r\n{\"prompt\"")
    try:
        for _ in range(3):
            c = socket.create_connection(("127.0.0.1", server.port))
            c.sendall(cut)
            c.close()
        assert _half_closed(server.port, cut) == b""
        body = b'{"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0}'
        reply = _half_closed(server.port, b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        head, _, answer = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and json.loads(answer)["choices"][0]["text"], reply
        assert server.request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})[0] == 200
    finally:
        log = server.stop()
    assert "Traceback" not in log and "Exception" not in log, log
    assert len([line for line in log.splitlines() if "POST /v1/completions 499 (client gone)" in line]) == 4, log
    assert len([line for line in log.splitlines() if "POST /v1/completions 200" in line]) == 2, log


def test_sigterm_ends_answers_under_way_with_their_last_chunk_and_exits_0(smol):
    """SIGTERM while a stream and a whole answer are under way: the stream gets its final chunk
    (finish_reason set) and [DONE], the whole answer comes back with what it had, and the
    process exits 0 within 10 s."""
    server = Server("-m", smol, "-t", str(THREADS), "-c", "2048", "--parallel", "2")
    client = server.client()
    whole = {}

    def ask_whole():
        whole["reply"] = client.completions.create(model="x", prompt="Once upon a time", max_tokens=1500,
                                                   temperature=0)
    try:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(ask_whole)
            finish, pieces = None, 0
            for chunk in client.completions.create(model="x", prompt="The history of", max_tokens=1500,
                                                   temperature=0, stream=True):
                pieces += 1
                if pieces == 5:
                    signalled = time.monotonic()
                    server.proc.send_signal(signal.SIGTERM)
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            pending.result(timeout=30)
        assert finish == "length" and pieces < 1000  # ended, not run to 1500 tokens
        assert whole["reply"].choices[0].finish_reason == "length"
        assert whole["reply"].usage.completion_tokens < 1500
        assert server.proc.wait(timeout=10) == 0 and time.monotonic() - signalled < 10
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
        server.proc.communicate()


def test_unknown_routes_and_methods(server):
    assert server.get("/v1/nothing")[0] == 404 and server.get("/v1/completions")[0] == 405
    assert server.get("/v1/models")[1]["data"][0]["id"] == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_an_api_key_is_required_when_given(smol):
    keyed = Server("-m", smol, "-t", str(THREADS), "--spec", "none", "--api-key", "s3cret")
    try:
        assert keyed.get("/health")[0] == 200  # health stays open
        assert keyed.get("/v1/models")[0] == 401
        status, body = keyed.get("/v1/models", {"Authorization": "Bearer wrong"})
        assert status == 401 and body["error"]["type"] == "authentication_error"
        assert keyed.client(api_key="s3cret").models.list().data[0].object == "model"
        ask = {"max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
        status, body = keyed.request("POST", "/v1/messages", ask, {"x-api-key": "wrong"})  # Anthropic's header
        assert status == 401 and body["error"]["type"] == "authentication_error" and body["type"] == "error"
        assert keyed.request("POST", "/v1/messages", ask, {"x-api-key": "s3cret"})[0] == 200
    finally:
        keyed.stop()


def test_no_memory_growth_over_100_requests_and_one_log_line_each(smol):
    """The resident memory grows less than 160 KiB a request over 100 requests after 20 (less than
    one row of SmolLM2's logits, 192 KiB, kept per request), and each request logs one line."""
    served = Server("-m", smol, "-t", str(THREADS), "-c", "1024")
    try:
        client = served.client()
        process = psutil.Process(served.proc.pid)

        def batch(n):
            for i in range(n):
                client.completions.create(model="x", prompt=PROMPTS[i % len(PROMPTS)], max_tokens=4, temperature=0.5,
                                          seed=i)
        batch(20)
        before = process.memory_info().rss
        batch(100)
        growth = process.memory_info().rss - before
        assert growth < 16 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over 100 requests"
    finally:
        log = served.stop()
    assert sum(" POST /v1/completions 200 " in line for line in log.splitlines()) == 120


def test_a_follow_up_evaluates_only_its_new_tokens(plain_server):
    client = plain_server.client()
    first = [{"role": "user", "content": "Name three colours."}]
    reply = client.chat.completions.create(model="x", messages=first, max_tokens=16, temperature=0)
    follow = first + [{"role": "assistant", "content": reply.choices[0].message.content},
                      {"role": "user", "content": "And three animals?"}]
    again = client.chat.completions.create(model="x", messages=follow, max_tokens=8, temperature=0)
    evaluated, prompt = again.model_extra["timings"]["prompt_n"], again.usage.prompt_tokens
    assert evaluated < prompt - reply.usage.prompt_tokens, (evaluated, prompt)  # the first turn came from the cache
    reused = again.usage.prompt_tokens_details.cached_tokens  # reported as OpenAI and llama-server report it
    assert reused == again.model_extra["timings"]["cache_n"] == prompt - evaluated


def test_serve_without_the_server_extra_says_how_to_install_it(smol, monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # import fastapi: ImportError
    assert_one_line_error(run("serve", "-m", smol), "pip install 'llamaspec[server]'")


def test_a_port_in_use_is_a_one_line_error_before_loading(smol):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_one_line_error(run("serve", "-m", smol, "--port", str(port)), f"cannot listen on 127.0.0.1:{port}")
    assert_one_line_error(run("serve", "-m", smol, "--host", "no.such.host.invalid"), "cannot listen on no.such")
