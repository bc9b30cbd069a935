"""Anthropic's Messages API translated to the chat completions' shapes and back, without a model."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from llamaspec import ConfigError
from llamaspec.server.anthropic import _stop, chat_arguments, error_body

TOOL = {"name": "read_file", "description": "Read a file", "input_schema": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}


def test_a_conversation_with_calls_and_results_becomes_openai_chat_messages():
    messages = [
        {"role": "user", "content": "Fix app.py"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "...", "signature": "x"},
                                          {"type": "text", "text": "Reading it."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "read_file",
                                           "input": {"path": "app.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "print(1)"}]},
                                     {"type": "text", "text": "Go on.", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_2", "name": "read_file",
                                           "input": {"path": "b.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                                      "content": "no such file"}]},
    ]
    out = chat_arguments([{"type": "text", "text": "You code."}], messages, [TOOL], {"type": "tool", "name": "read_file"})
    assert out["messages"] == [
        {"role": "system", "content": "You code."},
        {"role": "user", "content": "Fix app.py"},
        {"role": "assistant", "content": "Reading it.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "app.py"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "name": "read_file", "content": "print(1)"},
        {"role": "user", "content": "Go on."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "toolu_2", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "b.py"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_2", "name": "read_file", "content": "Error: no such file"},
    ]
    assert out["tools"] == [{"type": "function", "function": {"name": "read_file", "parameters": TOOL["input_schema"],
                                                               "description": "Read a file"}}]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "read_file"}}


@pytest.mark.parametrize("choice, openai", [({"type": "auto"}, "auto"), ({"type": "any"}, "required"),
                                            ({"type": "none"}, "none"), (None, None)])
def test_tool_choices_map_to_openai_s(choice, openai):
    assert chat_arguments(None, [{"role": "user", "content": "hi"}], [TOOL], choice)["tool_choice"] == openai


@pytest.mark.parametrize("messages, where", [
    ([{"role": "user", "content": [{"type": "image", "source": {}}]}], "messages[0].content[0].type"),
    ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "x"}]}],
     "messages[0].content[0].tool_use_id"),
    ([{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x"}]}], "messages[0].content[0].type"),
    ([{"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "y", "input": {}}]}],
     "messages[0].content[0].type"),
    ([{"role": "assistant", "content": [{"type": "tool_use", "id": "x", "name": "y", "input": [1]}]}],
     "messages[0].content[0].input"),
    ([{"role": "user", "content": [{"type": "text", "text": 3}]}], "messages[0].content[0].text"),
    ([{"role": "user", "content": 3}], "messages[0].content"),
    ([{"role": "system", "content": "x"}], "messages[0].role"),
])
def test_what_is_not_supported_is_refused_naming_its_place(messages, where):
    with pytest.raises(ConfigError) as caught:
        chat_arguments(None, messages, None, None)
    assert caught.value.where == where and "\n" not in str(caught.value)


def test_server_tools_and_unknown_choices_are_refused():
    with pytest.raises(ConfigError, match="server tools"):
        chat_arguments(None, [{"role": "user", "content": "hi"}], [{"type": "bash_20250124", "name": "bash"}], None)
    with pytest.raises(ConfigError, match="input_schema"):
        chat_arguments(None, [{"role": "user", "content": "hi"}], [{"name": "x"}], None)
    with pytest.raises(ConfigError) as caught:
        chat_arguments(None, [{"role": "user", "content": "hi"}], [TOOL], {"type": "tool"})
    assert caught.value.where == "tool_choice.name"


def result(stop_reason: str, stop_string=None) -> SimpleNamespace:
    return SimpleNamespace(stop_reason=stop_reason, stop_string=stop_string)


def test_stop_reasons_are_anthropic_s():
    assert _stop(result("stop"), called=True) == {"stop_reason": "tool_use", "stop_sequence": None}
    assert _stop(result("stop", "END"), called=False) == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert _stop(result("stop"), called=False)["stop_reason"] == "end_turn"
    assert _stop(result("length"), called=False)["stop_reason"] == "max_tokens"
    assert _stop(result("context"), called=False)["stop_reason"] == "max_tokens"


def test_errors_are_typed_by_status_as_anthropic_types_them():
    assert error_body(400, "bad") == {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    assert [error_body(s, "")["error"]["type"] for s in (401, 404, 413, 500, 503)] == [
        "authentication_error", "not_found_error", "request_too_large", "api_error", "overloaded_error"]
    json.dumps(error_body(418, "x"))
