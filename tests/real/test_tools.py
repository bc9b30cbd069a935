"""Tool calling on Qwen2.5-Coder-1.5B, greedy: "auto", "required" and a named function, whole
and streamed, come back as OpenAI's tool_calls whose arguments follow the function's schema; a
follow-up with the call and its result gets a text answer; SmolLM2, whose template has no tools,
is refused by name."""

from __future__ import annotations

import json

import jsonschema
import pytest

from llamaspec import ConfigError
from llamaspec.constraints import Grammar, GrammarVocabulary
from llamaspec.openai.tools import Tools

from checks import WEATHER


ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def check_calls(message: dict) -> list:
    """The message's calls, each a call of get_weather whose arguments follow its schema."""
    calls = message["tool_calls"]
    assert calls, message
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"]["name"] == "get_weather"
        arguments = json.loads(call["function"]["arguments"])
        jsonschema.validate(arguments, WEATHER["function"]["parameters"])
        assert "paris" in arguments["city"].lower()
    return calls


def streamed(chunks) -> tuple:
    """A stream's message (content and calls, put together as the openai client does) and its
    finish reason."""
    content, calls, reasons = "", {}, []
    for chunk in chunks:
        [choice] = chunk["choices"]
        delta = choice["delta"]
        content += delta.get("content") or ""
        for part in delta.get("tool_calls", []):
            call = calls.setdefault(part["index"], {"type": "function", "function": {"name": "", "arguments": ""}})
            if "id" in part:
                assert "arguments" in part["function"] and part["function"]["arguments"] == ""
                call["id"] = part["id"]
            call["function"]["name"] += part["function"].get("name", "")
            call["function"]["arguments"] += part["function"].get("arguments", "")
        reasons.append(choice["finish_reason"])
    assert all(r is None for r in reasons[:-1])
    return {"content": content or None, "tool_calls": [calls[i] for i in sorted(calls)]}, reasons[-1]


@pytest.mark.parametrize("choice", ["auto", "required", NAMED])
def test_a_call_comes_back_as_openai_tool_calls_whole_and_streamed(qwen_plain, choice):
    reply = qwen_plain.create_chat_completion(ASK, tools=[WEATHER], tool_choice=choice, temperature=0,
                                              max_tokens=60)
    [answer] = reply["choices"]
    assert answer["finish_reason"] == "tool_calls", answer
    calls = check_calls(answer["message"])
    assert answer["message"]["content"] is None
    message, reason = streamed(qwen_plain.create_chat_completion(ASK, tools=[WEATHER], tool_choice=choice,
                                                                 temperature=0, max_tokens=60, stream=True))
    assert reason == "tool_calls" and message["content"] is None
    assert [c["function"] for c in check_calls(message)] == [c["function"] for c in calls]


def test_each_of_n_choices_has_its_own_calls(qwen_plain):
    reply = qwen_plain.create_chat_completion(ASK, tools=[WEATHER], tool_choice="required", temperature=0.8,
                                              seed=3, n=2, max_tokens=60)
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    ids = []
    for answer in reply["choices"]:
        assert answer["finish_reason"] == "tool_calls"
        ids += [c["id"] for c in check_calls(answer["message"])]
    assert len(set(ids)) == len(ids)


def test_a_follow_up_with_the_call_and_its_result_gets_a_text_answer(qwen_plain):
    first = qwen_plain.create_chat_completion(ASK, tools=[WEATHER], tool_choice="required", temperature=0,
                                              max_tokens=60)["choices"][0]["message"]
    [call] = check_calls(first)
    result = {"role": "tool", "tool_call_id": call["id"], "name": "get_weather",
              "content": json.dumps({"city": "Paris", "temperature": 18, "unit": "celsius", "sky": "sunny"})}
    follow = [*ASK, first, result]
    prompt = qwen_plain.format_chat([*ASK, {**first, "tool_calls": [
        {**call, "function": {"name": "get_weather", "arguments": json.loads(call["function"]["arguments"])}}]},
        result])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"' in prompt  # an object, not text
    assert '<tool_response>\n{"city": "Paris", "temperature": 18' in prompt
    answer = qwen_plain.create_chat_completion(follow, temperature=0, max_tokens=40)["choices"][0]
    assert answer["finish_reason"] == "stop" and "tool_calls" not in answer["message"]
    assert "18" in answer["message"]["content"], answer


def test_tool_choice_none_reads_no_calls_and_a_format_with_a_forced_call_is_refused(qwen_plain):
    answer = qwen_plain.create_chat_completion(ASK, tools=[WEATHER], tool_choice="none", temperature=0,
                                               max_tokens=8)["choices"][0]
    assert "tool_calls" not in answer["message"] and answer["finish_reason"] in ("stop", "length")
    with pytest.raises(ConfigError, match='tool_choice "required" constrains the reply to calls'):
        qwen_plain.create_chat_completion(ASK, tools=[WEATHER], tool_choice="required",
                                          response_format={"type": "json_object"})


def test_a_model_without_tools_in_its_template_is_refused_by_name(smol_plain):
    with pytest.raises(ConfigError, match="^SmolLM2-135M-Instruct.Q4_1.gguf's chat template does not render tools"):
        smol_plain.create_chat_completion(ASK, tools=[WEATHER])
    answer = smol_plain.create_chat_completion(ASK, tools=[WEATHER], tool_choice="none", max_tokens=4)
    assert "tool_calls" not in answer["choices"][0]["message"]


@pytest.mark.parametrize("function_call", ["auto", {"name": "get_weather"}])
def test_openai_s_deprecated_functions_are_the_same_calls_in_the_older_shapes(qwen_plain, function_call):
    """``functions`` and ``function_call``: the reply's call as ``function_call`` with finish
    reason "function_call", whole and streamed; the tools request's call, argument for argument;
    a follow-up with the call and a ``function`` message gets a text answer."""
    functions = [WEATHER["function"]]
    choice = NAMED if isinstance(function_call, dict) else function_call
    tools = qwen_plain.create_chat_completion(ASK, tools=[WEATHER], tool_choice=choice, temperature=0, max_tokens=60)
    reply = qwen_plain.create_chat_completion(ASK, functions=functions, function_call=function_call, temperature=0,
                                              max_tokens=60)
    [answer] = reply["choices"]
    assert answer["finish_reason"] == "function_call" and "tool_calls" not in answer["message"]
    assert answer["message"]["function_call"] == tools["choices"][0]["message"]["tool_calls"][0]["function"]
    assert answer["message"]["content"] is None
    called, reasons = {"name": "", "arguments": ""}, []
    for chunk in qwen_plain.create_chat_completion(ASK, functions=functions, function_call=function_call,
                                                   temperature=0, max_tokens=60, stream=True):
        delta = chunk["choices"][0]["delta"]
        assert "tool_calls" not in delta and not delta.get("content")
        for key in called:
            called[key] += delta.get("function_call", {}).get(key, "")
        reasons.append(chunk["choices"][0]["finish_reason"])
    assert reasons[-1] == "function_call" and called == answer["message"]["function_call"]
    result = {"role": "function", "name": "get_weather", "content": json.dumps({"temperature": 18, "sky": "sunny"})}
    follow = qwen_plain.create_chat_completion([*ASK, answer["message"], result], temperature=0,
                                               max_tokens=40)["choices"][0]
    assert follow["finish_reason"] == "stop" and "18" in follow["message"]["content"], follow
    with pytest.raises(ConfigError, match="give tools and tool_choice, or the deprecated functions"):
        qwen_plain.create_chat_completion(ASK, functions=functions, tools=[WEATHER])
    with pytest.raises(ConfigError, match='function_call is "auto", "none" or'):
        qwen_plain.create_chat_completion(ASK, functions=functions, function_call="required")


# --- moved from the unit tier: they need the model's vocabulary ---

TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters: any object


def call_text(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


# --- checking -------------------------------------------------------------------------------


# --- reading a reply ------------------------------------------------------------------------

def arguments(call: dict) -> dict:
    return json.loads(call["function"]["arguments"])


# --- grammars on Qwen2.5's vocabulary ------------------------------------------------------

def allows(vocab: GrammarVocabulary, grammar: Grammar, text: str) -> bool:
    c = vocab.constraint(grammar)
    vocab = vocab.model
    tokens = vocab.tokenize(text, add_special=False, parse_special=True)
    if c.valid(tokens) != len(tokens):
        return False
    for t in tokens:
        c.advance(t)
    return c.complete


PARIS = call_text("get_weather", {"city": "Paris"})
GOOD = [PARIS, call_text("get_weather", {"city": "Paris", "unit": "celsius"}),
        '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>']
BAD = [call_text("get_weather", {"town": "Paris"}), call_text("get_weather", {"city": 5}),
       call_text("get_weather", {"city": "Paris", "unit": "kelvin"}), call_text("get_weather", {}),
       call_text("get_wether", {"city": "Paris"}), "Sure. " + PARIS, PARIS + " Done.", "",
       PARIS[:-1], '<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n</tool_call>']


def test_the_required_grammar_allows_one_or_more_valid_calls_and_nothing_else(qwen_vocab, grammar_vocabulary):
    qwen_vocab = grammar_vocabulary(qwen_vocab)
    grammar = Tools.of([WEATHER, TIME], "required").grammar()
    for text in GOOD + [PARIS + "\n" + call_text("get_time", {"zone": "UTC"}), call_text("get_time", {})]:
        assert allows(qwen_vocab, grammar, text), text
    for text in BAD:
        assert not allows(qwen_vocab, grammar, text), text


def test_a_named_function_s_grammar_allows_one_call_of_it_only(qwen_vocab, grammar_vocabulary):
    qwen_vocab = grammar_vocabulary(qwen_vocab)
    grammar = Tools.of([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}}).grammar()
    for text in GOOD:
        assert allows(qwen_vocab, grammar, text), text
    for text in BAD + [call_text("get_time", {}), PARIS + "\n" + PARIS]:
        assert not allows(qwen_vocab, grammar, text), text
