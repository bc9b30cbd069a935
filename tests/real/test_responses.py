"""OpenAI's Responses API (``POST /v1/responses``) on a real ``llamaspec serve``, asked by the real
openai client: SmolLM2 for text (the chat completions' text, streamed or not, the KV cache's
reuse, text.format, every refusal), Qwen2.5-Coder-0.5B for function calls (SmolLM2's template
renders no tools)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from conftest import QWEN_DRAFT, THREADS
from checks import Server, WEATHER

TERSE = "You are terse."
QUESTION = "Name three colours."
TOOL = {"type": "function", **WEATHER["function"], "strict": True}  # the Responses API's flat function tool
PARIS = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def smol_server(smol):
    server = Server("-m", smol, "-t", str(THREADS), "-c", "2048", "--spec", "none")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def qwen_server(model_file):
    server = Server("-m", str(model_file(QWEN_DRAFT)), "-t", str(THREADS), "-c", "2048", "--spec", "none")
    yield server
    server.stop()


def test_text_is_the_chat_completions_reply_streamed_or_not_and_a_follow_up_reuses_the_cache(smol_server):
    client = smol_server.client()
    chat = client.chat.completions.create(model="x", messages=[{"role": "system", "content": TERSE},
                                                               {"role": "user", "content": QUESTION}],
                                          max_tokens=32, temperature=0)
    expected = chat.choices[0].message.content
    assert chat.choices[0].finish_reason == "stop"  # the reply ends within the limit: the response completes
    reply = client.responses.create(model="x", instructions=TERSE, input=QUESTION, max_output_tokens=32, temperature=0)
    assert reply.status == "completed" and reply.object == "response" and reply.id.startswith("resp_")
    assert reply.output_text == expected and reply.output[0].content[0].text == expected
    assert reply.output[0].type == "message" and reply.output[0].role == "assistant"
    assert reply.usage.output_tokens == chat.usage.completion_tokens
    assert reply.usage.input_tokens == chat.usage.prompt_tokens
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens
    assert reply.instructions == TERSE and reply.max_output_tokens == 32 and reply.model_extra["timings"]["predicted_n"]

    events = list(client.responses.create(model="x", instructions=TERSE, input=QUESTION, max_output_tokens=32,
                                          temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == expected
    last = events[-1].response
    assert last.output_text == expected and last.usage.output_tokens == chat.usage.completion_tokens
    with client.responses.stream(model="x", instructions=TERSE, input=QUESTION, max_output_tokens=32,
                                 temperature=0) as stream:
        assert stream.get_final_response().output_text == expected

    follow_up = client.responses.create(
        model="x", instructions=TERSE, max_output_tokens=16, temperature=0,
        input=[{"role": "user", "content": QUESTION}, reply.output[0].model_dump(exclude_none=True),
               {"role": "user", "content": [{"type": "input_text", "text": "Two more?"}]}])
    assert follow_up.usage.input_tokens > reply.usage.total_tokens
    assert follow_up.usage.input_tokens_details.cached_tokens > 0


def test_a_token_limit_leaves_the_response_incomplete(smol_server):
    reply = smol_server.client().responses.create(model="x", input=QUESTION, max_output_tokens=3, temperature=0)
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage.output_tokens == 3 and reply.output_text


def test_text_format_json_schema_gives_json_that_validates(smol_server):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
              "required": ["colour"], "additionalProperties": False}
    reply = smol_server.client().responses.create(
        model="x", input="Pick a colour.", max_output_tokens=32, temperature=0,
        text={"format": {"type": "json_schema", "name": "colour", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(reply.output_text), schema)
    assert reply.text.format.type == "json_schema"


def test_a_function_tool_is_called_with_arguments_that_validate_and_its_output_gets_a_text_answer(qwen_server):
    client = qwen_server.client()
    asked = client.responses.create(model="x", input=PARIS, tools=[TOOL], tool_choice="required",
                                    max_output_tokens=48, temperature=0)
    call = next(item for item in asked.output if item.type == "function_call")
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), TOOL["parameters"])
    assert asked.tool_choice == "required" and asked.tools[0].name == "get_weather"

    with client.responses.stream(model="x", input=PARIS, tools=[TOOL], max_output_tokens=48, temperature=0,
                                 tool_choice={"type": "function", "name": "get_weather"}) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    [named] = [item for item in streamed.output if item.type == "function_call"]
    assert named.name == "get_weather" and named.status == "completed"
    jsonschema.validate(json.loads(named.arguments), TOOL["parameters"])

    reply = client.responses.create(
        model="x", tools=[TOOL], max_output_tokens=16, temperature=0,
        input=[{"role": "user", "content": PARIS},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id,
                "output": json.dumps({"temperature": 18, "sky": "sunny"})}])
    assert [item.type for item in reply.output] == ["message"] and reply.output_text.strip()


BAD = [
    ({"input": "hi", "previous_response_id": "resp_123"}, "previous_response_id"),
    ({"input": "hi", "store": True}, "store"),
    ({"input": [{"role": "user", "content": "a"},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                {"type": "function_call_output", "call_id": "call_2", "output": "rain"}]}, "input[3].call_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                             {"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input[0].content[1].type"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "hi", "max_output_tokens": "x"}, "max_output_tokens"),
    ({"model": "x"}, "input"),
]


@pytest.mark.parametrize("body, param", BAD)
def test_bad_input_is_a_400_with_an_openai_error_naming_the_field(smol_server, body, param):
    status, answer = smol_server.request("POST", "/v1/responses", body)
    assert status == 400, (status, answer)
    assert set(answer) == {"error"} and set(answer["error"]) == {"message", "type", "param", "code"}
    error = answer["error"]
    assert error["param"] == param and error["message"].startswith(f"{param}: ")
    assert error["type"] == "invalid_request_error" and "\n" not in error["message"]
    assert smol_server.get("/health") == (200, {"status": "ok"})
