"""Tool calling without a model: the checks of tools and tool_choice, the reading of a reply into
content and calls (whole or chunk by chunk), past calls as a template needs them, and, on
Qwen2.5's vocabulary, which texts the grammars of "required" and of a named function allow."""

from __future__ import annotations

import json

import pytest

from llamaspec.errors import ConfigError
from llamaspec.constraints import Grammar
from llamaspec.openai.tools import CallReader, Tools, grammar_with, read, template_tools, with_calls

from checks import WEATHER


TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters: any object
NAMES = ["get_weather", "get_time"]


def call_text(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


# --- checking -------------------------------------------------------------------------------

def test_tools_and_tool_choice_are_checked():
    request = Tools.of([WEATHER, TIME])
    assert request.choice == "auto" and request.names == NAMES and request.calls
    assert request.tools[1]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert Tools.of([WEATHER], "none").calls is False
    named = Tools.of([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}})
    assert (named.choice, named.function) == ("function", "get_time")
    assert Tools.of(None) is None and Tools.of([], "none") is None and Tools.of([], "auto") is None


@pytest.mark.parametrize("tools, choice, fragment", [
    ([WEATHER], {"type": "function", "function": {"name": "get_wether"}},
     "names the function 'get_wether', which is not among the tools (get_weather)"),
    ([{"type": "function", "function": {"description": "no name"}}], None, "tools[0]'s function needs a name"),
    ([{"type": "function", "function": {"name": "two words"}}], None, "tools[0]'s function needs a name"),
    ([{"type": "function"}], None, 'tools[0] needs "function"'),
    ([{"type": "retrieval", "function": {"name": "f"}}], None, "only \"function\" tools"),
    ([WEATHER, WEATHER], None, "two tools are named 'get_weather'"),
    ([{"type": "function", "function": {"name": "f", "parameters": "x"}}], None, "parameters of tool 'f'"),
    ({"type": "function"}, None, "tools is a list"),
    ([WEATHER], "always", 'tool_choice is "auto", "none", "required" or'),
    (None, "required", 'tool_choice "required" needs tools'),
    ([], {"type": "function", "function": {"name": "f"}}, "needs tools"),
])
def test_a_malformed_tool_or_choice_is_a_one_line_error_naming_it(tools, choice, fragment):
    with pytest.raises(ConfigError) as e:
        Tools.of(tools, choice)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_a_constraining_choice_and_a_response_format_are_not_both_taken():
    asked = Grammar.json()
    assert grammar_with(Tools.of([WEATHER], "auto"), asked) is asked
    assert grammar_with(None, asked) is asked
    assert grammar_with(Tools.of([WEATHER], "required"), None).kind == "tools"
    with pytest.raises(ConfigError, match='tool_choice "required" constrains the reply to calls'):
        grammar_with(Tools.of([WEATHER], "required"), asked)
    with pytest.raises(ConfigError, match='tool_choice "get_weather" constrains'):
        grammar_with(Tools.of([WEATHER], {"type": "function", "function": {"name": "get_weather"}}), asked)


class Template:
    def __init__(self, renders: bool) -> None:
        self.renders_tools, self.name = renders, "model.gguf"


def test_a_template_without_tools_is_an_error_naming_the_model_unless_nothing_needs_it():
    request = Tools.of([WEATHER])
    user = [{"role": "user", "content": "hi"}]
    assert template_tools(Template(True), request, user) == [request.tools[0]]
    with pytest.raises(ConfigError, match="^model.gguf's chat template does not render tools"):
        template_tools(Template(False), request, user)
    past = [*user, {"role": "tool", "content": "18 C", "tool_call_id": "call_1"}]
    with pytest.raises(ConfigError, match="^model.gguf's chat template does not render tools"):
        template_tools(Template(False), None, past)
    assert template_tools(Template(False), Tools.of([WEATHER], "none"), user) is None
    assert template_tools(Template(False), None, user) is None


def test_past_calls_reach_the_template_with_their_arguments_as_objects():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    out = with_calls(message, {"role": "assistant", "content": ""})
    assert out == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    result = {"role": "tool", "content": "18 C", "tool_call_id": "call_1", "name": "get_weather"}
    assert with_calls(result, {"role": "tool", "content": "18 C"}) == result
    assert with_calls({"role": "user", "content": "hi"}, {"role": "user", "content": "hi"}) == {"role": "user",
                                                                                                "content": "hi"}
    bad = {**call, "function": {"name": "get_weather", "arguments": "{city: Paris}"}}
    with pytest.raises(ConfigError, match="the arguments of the call of 'get_weather' are not JSON"):
        with_calls({"role": "assistant", "tool_calls": [bad]}, {"role": "assistant", "content": ""})
    with pytest.raises(ConfigError, match="only assistant messages have tool_calls"):
        with_calls({"role": "user", "tool_calls": [call]}, {"role": "user", "content": ""})


# --- reading a reply ------------------------------------------------------------------------

def arguments(call: dict) -> dict:
    return json.loads(call["function"]["arguments"])


def test_one_call():
    content, calls = read(call_text("get_weather", {"city": "Paris"}), NAMES)
    assert content is None and len(calls) == 1
    call = calls[0]
    assert set(call) == {"id", "type", "function"} and call["type"] == "function"
    assert call["id"].startswith("call_") and len(call["id"]) > 10
    assert call["function"]["name"] == "get_weather" and arguments(call) == {"city": "Paris"}
    assert isinstance(call["function"]["arguments"], str)


def test_two_calls_have_their_own_ids():
    text = call_text("get_weather", {"city": "Paris"}) + "\n" + call_text("get_time", {})
    content, calls = read(text, NAMES)
    assert content is None and [c["function"]["name"] for c in calls] == NAMES
    assert arguments(calls[1]) == {} and calls[0]["id"] != calls[1]["id"]


def test_content_then_a_call():
    content, calls = read("Let me look that up.\n" + call_text("get_weather", {"city": "Oslo"}), NAMES)
    assert content == "Let me look that up." and arguments(calls[0]) == {"city": "Oslo"}


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"\n</tool_call>',  # broken JSON
    '<tool_call>\n{"name": "get_wether", "arguments": {}}\n</tool_call>',  # not a tool
    '<tool_call>\n["get_weather"]\n</tool_call>',  # not a call
    '<tool_call>\n{"name": "get_weather", "arguments": 5}\n</tool_call>',
    'Sure: <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',  # never closed (max_tokens)
    '```json\n{"city": "Paris"}\n```',  # a JSON block that is no call
])
def test_text_that_is_not_a_call_stays_content(text):
    assert read(text, NAMES) == (text, [])


def test_a_json_block_holding_a_call_is_a_call():
    text = 'Here:\n```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'
    content, calls = read(text, NAMES)
    assert content == "Here:" and arguments(calls[0]) == {"city": "Paris"}


def test_arguments_written_as_json_text_are_read():
    content, calls = read('<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"UTC\\"}"}</tool_call>', NAMES)
    assert content is None and arguments(calls[0]) == {"zone": "UTC"}


def streamed(pieces, names=NAMES):
    reader = CallReader(names)
    events = []
    for piece in pieces:
        events.append(reader.feed(piece))
    events.append(reader.finish())
    return events


def test_a_stream_holds_back_what_may_start_a_call_over_chunk_boundaries():
    text = "Checking. " + call_text("get_weather", {"city": "Paris"}) + " Done."
    for cut in range(1, len(text)):
        for second in (cut + 1, cut + 5, len(text)):
            events = streamed([text[:cut], text[cut:second], text[second:]])
            flat = [e for chunk in events for e in chunk]
            assert [e for e in flat if e[0] == "content"] != []
            content = "".join(v for k, v in flat if k == "content")
            calls = [v for k, v in flat if k == "call"]
            assert content == "Checking.  Done." and len(calls) == 1, (cut, second, flat)  # the text around the call
            assert arguments(calls[0]) == {"city": "Paris"}
            # no content shows any part of the tags or of the call's JSON
            assert not any(k == "content" and ("<" in v or "{" in v) for k, v in flat)


def test_a_stream_shows_text_as_soon_as_it_cannot_start_a_call():
    reader = CallReader(NAMES)
    assert reader.feed("Hello <tool") == [("content", "Hello")]
    assert reader.feed("box> and") == [("content", " <toolbox> and")]
    assert reader.feed(" more `") == [("content", " more")]
    assert reader.feed("x`") == [("content", " `x")]  # "`" may start a JSON block
    assert reader.finish() == [("content", "`")]


def test_a_stream_gives_a_call_once_its_block_is_closed_and_a_cut_block_as_content():
    reader = CallReader(NAMES)
    assert reader.feed('<tool_call>\n{"name": "get_time", "argu') == []
    [(kind, call)] = reader.feed('ments": {}}\n</tool_call>')
    assert kind == "call" and call["function"]["name"] == "get_time"
    assert reader.feed('\n<tool_call>\n{"name": "get_weather"') == []
    assert reader.finish() == [("content", '<tool_call>\n{"name": "get_weather"')]


def test_streamed_and_whole_replies_read_the_same():
    text = "  A.\n" + call_text("get_time", {}) + "\n\nB\n" + call_text("get_weather", {"city": "Rome"}) + "\n"
    whole_content, whole_calls = read(text, NAMES)
    events = [e for chunk in streamed([text[i:i + 3] for i in range(0, len(text), 3)]) for e in chunk]
    assert "".join(v for k, v in events if k == "content") == whole_content == "A.\n\n\nB"
    assert [arguments(v) for k, v in events if k == "call"] == [arguments(c) for c in whole_calls]


# --- grammars on Qwen2.5's vocabulary ------------------------------------------------------


def test_auto_and_none_do_not_constrain():
    assert Tools.of([WEATHER], "auto").grammar() is None and Tools.of([WEATHER], "none").grammar() is None
