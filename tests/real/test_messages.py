"""Anthropic's Messages API on llamaspec serve, asked by the official anthropic client
(Qwen2.5-Coder-0.5B, whose template renders tools; greedy, no speculation, so texts compare
exactly): the same text as /v1/chat/completions, streams as the client reads them, tools with a
forced tool, a tool result's follow-up read from the cache, stop sequences, count_tokens, and
every bad input a 400 in Anthropic's error shape."""

from __future__ import annotations

import json
import urllib.request

import anthropic
import jsonschema
import pytest

from conftest import QWEN_DRAFT, THREADS
from checks import Server, WEATHER

TOOL = {"name": "get_weather", "description": WEATHER["function"]["description"],
        "input_schema": WEATHER["function"]["parameters"]}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
SYSTEM = "You are a terse assistant."
GREEDY = {"temperature": 0}  # the client has no sampling arguments any more: sent as extra fields


@pytest.fixture(scope="module")
def server(model_file):
    server = Server("-m", str(model_file(QWEN_DRAFT)), "-t", str(THREADS), "-c", "4096", "--spec", "none")
    yield server
    server.stop()


def sse(server, body: dict) -> list:
    """A streamed request's events as (name, data), read off the wire."""
    request = urllib.request.Request(server.url + "/v1/messages", data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})
    events = []
    with urllib.request.urlopen(request, timeout=300) as response:
        for block in response.read().decode().split("\n\n"):
            lines = dict(line.split(": ", 1) for line in block.splitlines() if line)
            if lines:
                events.append((lines["event"], json.loads(lines["data"])))
    return events


def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=300)


def test_a_message_is_the_chat_completion_s_text_whole_and_streamed(server):
    question = [{"role": "user", "content": "Name three colours."}]
    chat = server.client().chat.completions.create(
        model="x", messages=[{"role": "system", "content": SYSTEM}, *question], max_tokens=24, temperature=0)
    message = client(server).messages.create(model="x", system=SYSTEM, messages=question, max_tokens=24,
                                             extra_body=GREEDY)
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == chat.choices[0].message.content
    assert message.stop_reason == ("max_tokens" if chat.choices[0].finish_reason == "length" else "end_turn")
    assert message.usage.output_tokens == chat.usage.completion_tokens
    total = message.usage.input_tokens + message.usage.cache_read_input_tokens
    assert total == chat.usage.prompt_tokens and message.usage.cache_read_input_tokens > 0  # read just before

    with client(server).messages.stream(model="x", system=[{"type": "text", "text": SYSTEM}], messages=question,
                                        max_tokens=24, extra_body=GREEDY) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1] == "content_block_start" and "content_block_stop" in kinds
    raw = sse(server, {"system": SYSTEM, "messages": question, "max_tokens": 24, "stream": True, **GREEDY})
    assert [name for name, _ in raw][:3] == ["message_start", "ping", "content_block_start"]  # the client hides pings
    assert all(name == data["type"] for name, data in raw)
    assert final.content[0].text == message.content[0].text and final.stop_reason == message.stop_reason
    assert final.usage.output_tokens == message.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == total


def test_count_tokens_is_the_prompt_a_request_reads(server):
    counted = client(server).messages.count_tokens(model="x", system=SYSTEM, messages=ASK, tools=[TOOL])
    message = client(server).messages.create(model="x", system=SYSTEM, messages=ASK, tools=[TOOL], max_tokens=1,
                                             extra_body=GREEDY)
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "get_weather"}, {"type": "any"}])
def test_a_forced_tool_comes_back_as_a_tool_use_whose_input_follows_its_schema(server, choice):
    message = client(server).messages.create(model="x", messages=ASK, tools=[TOOL], tool_choice=choice,
                                             max_tokens=60, extra_body=GREEDY)
    uses = [b for b in message.content if b.type == "tool_use"]
    assert uses and message.stop_reason == "tool_use"
    for use in uses:
        assert use.name == "get_weather" and use.id.startswith("toolu_")
        jsonschema.validate(use.input, TOOL["input_schema"])
        assert "paris" in use.input["city"].lower()

    with client(server).messages.stream(model="x", messages=ASK, tools=[TOOL], tool_choice=choice, max_tokens=60,
                                        extra_body=GREEDY) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "input_json_delta" in deltas and final.stop_reason == "tool_use"
    assert [b.input for b in final.content if b.type == "tool_use"] == [u.input for u in uses]


def test_a_tool_result_s_follow_up_answers_in_text_and_reads_only_its_new_tokens(server):
    first = client(server).messages.create(model="x", messages=ASK, tools=[TOOL],
                                           tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=60,
                                           extra_body=GREEDY)
    use = next(b for b in first.content if b.type == "tool_use")
    history = [*ASK, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": [{"type": "text", "text": "22 degrees celsius, sunny"}]}]}]
    reply = client(server).messages.create(model="x", messages=history, tools=[TOOL], max_tokens=40, extra_body=GREEDY)
    openai_history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": use.id, "type": "function", "function": {"name": use.name, "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "22 degrees celsius, sunny"}]
    chat = server.client().chat.completions.create(model="x", messages=openai_history, tools=[WEATHER],
                                                   max_tokens=40, temperature=0)
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use")
    text = "".join(b.text for b in reply.content if b.type == "text")
    assert text == (chat.choices[0].message.content or "")  # the same prompt, the same greedy reply
    previous = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert reply.usage.cache_read_input_tokens >= previous - 8  # the first turn's prompt came from the cache
    assert reply.usage.input_tokens < 80, reply.usage


def test_a_stop_sequence_ends_the_message_and_is_named(server):
    question = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
    whole = client(server).messages.create(model="x", messages=question, max_tokens=60, extra_body=GREEDY)
    text = whole.content[0].text
    assert "7" in text
    stopped = client(server).messages.create(model="x", messages=question, max_tokens=60, extra_body=GREEDY,
                                             stop_sequences=["7", "never"])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "7"
    assert stopped.content[0].text == text[:text.index("7")]


BAD = [
    ({"messages": ASK}, "max_tokens"),
    ({"max_tokens": "many", "messages": ASK}, "max_tokens"),
    ({"max_tokens": 8}, "messages"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]},
     "messages[0].content[0].type"),
    ({"max_tokens": 8, "messages": [*ASK, {"role": "assistant", "content": "ok"}, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_never", "content": "x"}]}]}, "messages[2].content[0].tool_use_id"),
    ({"max_tokens": 8, "messages": ASK, "tools": [TOOL], "tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
    ({"max_tokens": 8, "messages": ASK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "tools[0].type"),
    ({"max_tokens": 8, "messages": ASK, "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"max_tokens": 8, "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"max_tokens": 8, "messages": ASK, "tools": [TOOL], "tool_choice": {"type": "any"},
      "stop_sequences": "x"}, "stop_sequences"),
    ({"max_tokens": 8, "messages": ASK, "tools": [{**TOOL, "input_schema": {"type": "object", "properties": {
        "x": {"type": "string", "pattern": "(" * 5000}}}}], "tool_choice": {"type": "any"}}, "tools[0]"),
]


@pytest.mark.parametrize("body, named", BAD)
def test_bad_input_is_a_400_in_anthropic_s_shape_naming_the_field(server, body, named):
    status, answer = server.request("POST", "/v1/messages", body)
    assert status == 400, answer
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    assert named in answer["error"]["message"], answer
    assert "\n" not in answer["error"]["message"] and "Traceback" not in answer["error"]["message"]


def test_the_client_sees_errors_as_its_own_exceptions(server):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(server).messages.create(model="x", messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}],
            max_tokens=8)
    assert "document" in str(caught.value)
    status, answer = server.request("POST", "/v1/messages/count_tokens", {"messages": "hi"})
    assert status == 400 and answer["error"]["type"] == "invalid_request_error" and "messages" in json.dumps(answer)


@pytest.fixture(scope="module")
def parallel_server(model_file):
    """Two lanes, drafting with a draft model (the 0.5B drafting for itself: same vocabulary)."""
    path = str(model_file(QWEN_DRAFT))
    server = Server("-m", path, "-md", path, "-t", str(THREADS), "-c", "4096", "--parallel", "2")
    yield server
    server.stop()


@pytest.mark.parametrize("api", ["messages", "chat"])
def test_an_agent_s_turns_read_only_their_new_tokens_on_two_lanes_with_a_draft_model(parallel_server, api):
    """Each turn resends the conversation; the lane that holds it reads only what is new: the
    user's message and the template's tags around the reply it gave (a few tokens more)."""
    history, previous = [], None
    for turn in range(3):
        history.append({"role": "user", "content": f"Step {turn}: write one line of Python that prints {turn}."})
        if api == "messages":
            reply = client(parallel_server).messages.create(model="x", messages=history, max_tokens=16,
                                                            extra_body=GREEDY)
            text = reply.content[0].text
            prompt = reply.usage.input_tokens + reply.usage.cache_read_input_tokens
            read, produced = reply.usage.input_tokens, reply.usage.output_tokens
        else:
            reply = parallel_server.client().chat.completions.create(model="x", messages=history, max_tokens=16,
                                                                     temperature=0)
            text = reply.choices[0].message.content
            prompt, produced = reply.usage.prompt_tokens, reply.usage.completion_tokens
            read = prompt - reply.usage.prompt_tokens_details.cached_tokens
        if previous is not None:
            new = prompt - previous  # the previous prompt is cached, and so is most of its reply
            assert read <= new + 4, (turn, read, new)
            assert read <= new - previous_produced + 8, (turn, read, new, previous_produced)
        previous, previous_produced = prompt, produced
        history.append({"role": "assistant", "content": text})
