"""OpenAI's Responses API translated to the chat completions' shapes and back, without a model."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from llamaspec import ConfigError
from llamaspec.errors import GrammarError
from llamaspec.server import responses
from llamaspec.server.responses import ResponsesRequest, chat_arguments, text_grammar

TOOL = {"type": "function", "name": "read_file", "description": "Read a file", "strict": True, "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}


def request(**fields) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"input": "hi", **fields})


def test_a_conversation_with_calls_and_their_outputs_becomes_openai_chat_messages():
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix "},
                                                         {"type": "input_text", "text": "app.py"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Reading it.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read_file",
         "arguments": '{"path": "app.py"}'},
        {"type": "function_call", "call_id": "call_2", "name": "read_file", "arguments": '{"path": "b.py"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "print(1)"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "no file"}]},
        {"role": "user", "content": "Go on."},
        {"type": "function_call", "call_id": "call_3", "name": "read_file", "arguments": '{"path": "c.py"}'},
    ]
    out = chat_arguments("You code.", items, [TOOL], {"type": "function", "name": "read_file"})
    call = lambda i, path: {"id": f"call_{i}", "type": "function",  # noqa: E731
                            "function": {"name": "read_file", "arguments": json.dumps({"path": path})}}
    assert out["messages"] == [
        {"role": "system", "content": "You code."},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Fix app.py"},
        {"role": "assistant", "content": "Reading it.", "tool_calls": [call(1, "app.py"), call(2, "b.py")]},
        {"role": "tool", "tool_call_id": "call_1", "name": "read_file", "content": "print(1)"},
        {"role": "tool", "tool_call_id": "call_2", "name": "read_file", "content": "no file"},
        {"role": "user", "content": "Go on."},
        {"role": "assistant", "content": "", "tool_calls": [call(3, "c.py")]},
    ]
    assert out["tools"] == [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                                               "parameters": TOOL["parameters"]}}]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "read_file"}}


@pytest.mark.parametrize("choice", ["auto", "none", "required", None])
def test_string_tool_choices_are_openai_s_own(choice):
    assert chat_arguments(None, "hi", [TOOL], choice)["tool_choice"] == choice


def test_a_request_s_arguments_and_what_its_response_echoes():
    body = request(model="m", instructions="Be brief.", max_output_tokens=20, temperature=0, tools=[TOOL],
                   tool_choice="required", metadata={"k": "v"}, store=False, truncation="auto",
                   parallel_tool_calls=False, reasoning={"effort": "low"}, include=["x"], prompt_cache_key="k")
    args = body.arguments()
    assert args["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert (args["max_tokens"], args["temperature"], args["model"]) == (20, 0, "m")
    assert args["trim"] is True and args["grammar"] is None
    assert args["echo"]["tools"] == [TOOL] and args["echo"]["tool_choice"] == "required"
    assert args["echo"]["parallel_tool_calls"] is False and args["echo"]["metadata"] == {"k": "v"}
    assert args["echo"]["text"] == {"format": {"type": "text"}}
    defaults = request().arguments()
    assert defaults["max_tokens"] is None and defaults["trim"] is False and defaults["tool_choice"] is None
    assert defaults["echo"]["tool_choice"] == "auto" and defaults["echo"]["parallel_tool_calls"] is True


def test_text_format_asks_for_json_named_as_the_request_names_it():
    assert text_grammar(None) is None and text_grammar({"format": {"type": "text"}}) is None
    assert text_grammar({"format": {"type": "json_object"}}).kind == "json"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    grammar = text_grammar({"format": {"type": "json_schema", "name": "x", "schema": schema, "strict": True}})
    assert grammar.kind == "json_schema" and json.loads(grammar.source) == schema
    assert grammar.field == "text.format.schema"
    with pytest.raises(GrammarError, match=r"^text\.format\.schema\.properties\.a"):
        text_grammar({"format": {"type": "json_schema", "name": "x",
                                 "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}})


@pytest.mark.parametrize("fields, where", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"store": True}, "store"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"background": True}, "background"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"role": "user", "content": "a"},
                {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
                {"role": "user", "content": "b"},
                {"type": "function_call_output", "call_id": "call_2", "output": "x"}]},
     "input[3].call_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:..."}]}]},
     "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]}, "input[0].arguments"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [TOOL, {"type": "file_search", "vector_store_ids": []}]}, "tools[1].type"),
    ({"tools": [TOOL], "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function"}}, "tool_choice.name"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"tools": [TOOL], "tool_choice": "required", "text": {"format": {"type": "json_object"}}}, "text.format"),
])
def test_what_is_refused_names_its_field(fields, where):
    with pytest.raises(ConfigError) as e:
        request(**fields).arguments()
    assert e.value.where == where and str(e.value).startswith(f"{where}: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("fields, where", [({"max_output_tokens": "x"}, "max_output_tokens"),
                                           ({"max_output_tokens": 0}, "max_output_tokens"),
                                           ({"truncation": "sometimes"}, "truncation"),
                                           ({"temperature": 3}, "temperature")])
def test_fields_of_the_wrong_type_are_refused_by_pydantic(fields, where):
    with pytest.raises(ValidationError) as e:
        request(**fields)
    assert e.value.errors()[0]["loc"] == (where,)
    with pytest.raises(ValidationError, match="input"):
        ResponsesRequest.model_validate({"model": "m"})


def result(stop_reason="stop", tokens=3):
    stats = SimpleNamespace(n_prompt=10, n_prompt_eval=4, t_prompt=0.1, prompt_tps=1.0, n_predict=tokens, t_decode=0.1,
                            decode_tps=1.0, n_drafted=0, n_accept=0, t_llama=0.05)
    return SimpleNamespace(stop_reason=stop_reason, tokens=[1] * tokens, stats=stats)


class Generation:
    closed = False

    def close(self):
        self.closed = True


def answer(monkeypatch, replies, stream, generation=None):
    """create_response over a reply whose events are ``replies`` (no model)."""
    run = SimpleNamespace(n_prompt=10, events=generation or Generation())
    monkeypatch.setattr(responses, "start_chat", lambda *a, **k: run)
    monkeypatch.setattr(responses, "reply_events", lambda run, abandoned: iter(replies))
    spec = SimpleNamespace(model_name="smol")
    out = responses.create_response(spec, [{"role": "user", "content": "hi"}], stream=stream, max_tokens=8)
    return out if stream == "lazy" else list(out) if stream else out


CALL = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}}


def test_a_stream_s_events_in_order_and_its_last_response_is_the_non_streamed_one(monkeypatch):
    replies = [("content", "Let me "), ("content", "look."), ("call", CALL), ("content", "Done"), ("end", result())]
    events = answer(monkeypatch, replies, stream=True)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    added = events[2]["item"]
    assert added["type"] == "message" and added["content"] == [] and added["status"] == "in_progress"
    assert events[6]["text"] == "Let me look." and events[8]["item"]["content"][0]["text"] == "Let me look."
    assert events[9]["item"]["arguments"] == "" and events[9]["output_index"] == 1
    assert events[10]["delta"] == CALL["function"]["arguments"] == events[11]["arguments"]
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["message", "function_call", "message"]
    assert final["output"][1] == {"type": "function_call", "id": final["output"][1]["id"], "call_id": "call_1",
                                  "name": "read_file", "arguments": '{"path": "a"}', "status": "completed"}
    assert final["output_text"] == "Let me look.Done" and final["status"] == "completed"
    assert final["usage"] == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 6, "cache_write_tokens": 0},
                              "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 13}
    whole = answer(monkeypatch, replies, stream=False)
    assert [item["type"] for item in whole["output"]] == ["message", "function_call", "message"]
    assert whole["output_text"] == final["output_text"] and whole["id"].startswith("resp_")
    assert (whole["object"], whole["model"], whole["max_output_tokens"]) == ("response", "smol", 8)
    assert whole["store"] is False
    assert whole["output"][0]["id"].startswith("msg_") and whole["output"][1]["id"].startswith("fc_")


def test_a_reply_cut_by_the_token_limit_is_incomplete_and_an_empty_one_is_an_empty_message(monkeypatch):
    events = answer(monkeypatch, [("content", "abc"), ("end", result("length"))], stream=True)
    assert events[-1]["type"] == "response.incomplete"
    final = events[-1]["response"]
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"
    empty = answer(monkeypatch, [("end", result(tokens=0))], stream=False)
    assert empty["status"] == "completed" and empty["incomplete_details"] is None and empty["output_text"] == ""
    assert [part["text"] for part in empty["output"][0]["content"]] == [""]


def test_the_stream_s_error_event_is_numbered_after_the_last_event_sent():
    events = responses.events(None)
    events.frame([{"type": "response.created", "sequence_number": 0}, {"type": "response.in_progress",
                                                                       "sequence_number": 1}])
    framed = events.failed("the model failed")
    assert framed.startswith("event: error\ndata: ")
    assert json.loads(framed.split("data: ", 1)[1]) == {"type": "error", "code": "server_error",
                                                         "message": "the model failed", "param": None,
                                                         "sequence_number": 2}


def test_a_stream_closed_before_the_reply_s_first_event_closes_its_generation(monkeypatch):
    generation = Generation()
    events = answer(monkeypatch, [("content", "x"), ("end", result())], "lazy", generation)
    assert next(events)["type"] == "response.created" and not generation.closed
    events.close()
    assert generation.closed
