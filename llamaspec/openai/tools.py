"""OpenAI's tool calling over a model's own chat template (Hermes' format, Qwen2.5's):

    request = Tools.of(tools, tool_choice)   # ConfigError for a malformed tool or choice
    template.render(messages, tools)         # the template tells the model of the tools
    request.grammar()                        # "required" / a named function: what the reply may say
    reader = CallReader(request.names)       # the reply's text -> content and OpenAI tool_calls

The model answers a call as its template tells it to:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

``tool_choice``: ``"auto"`` (the default with tools) lets the model answer or call; ``"none"``
renders the tools but reads the reply as plain text (no call is parsed, nothing constrained);
``"required"`` constrains the reply to one or more calls, each call's arguments following its
function's ``parameters`` schema (as llama.cpp's Hermes-2-Pro grammar does); a named function
(``{"type": "function", "function": {"name": ...}}``) constrains it to one call of that function.

Small models often write the call as a JSON code block instead (```json ... ```): such a block
is read as a call too when it holds exactly ``{"name": <a tool's name>, "arguments": {...}}``,
as llama.cpp's Hermes-2-Pro parser reads it. A block that does not parse as a call of a known
function (broken JSON, an unknown name, no closing tag) stays in the content: no text is dropped. With tools, the content is the text outside
the calls without leading and trailing whitespace, or None when nothing is left.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from ..errors import ConfigError, GrammarError, shown
from ..constraints import Grammar
from ..constraints.json_schema import to_lark

START, END = "<tool_call>", "</tool_call>"
# Where a reply's calls are: the template's tags, or (as llama.cpp's Hermes parser also reads
# them) a JSON code block, which small models such as Qwen2.5-Coder-1.5B write instead.
BLOCKS = ((START, END), ("```json\n", "\n```"))
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names

Call = Dict[str, Any]


@dataclass(frozen=True)
class Tools:
    """A request's checked tools (OpenAI's shape) and its choice: ``"auto"``, ``"none"``,
    ``"required"`` or the name of the one function the reply must call."""

    tools: Tuple[Dict[str, Any], ...]
    choice: str
    function: Optional[str] = None

    @staticmethod
    def of(tools: Any, tool_choice: Any = None) -> Optional["Tools"]:
        """The request's tools, or None where it has none (ConfigError for what is malformed)."""
        if tools is not None and not isinstance(tools, (list, tuple)):
            raise ConfigError(f"tools is a list of {{\"type\": \"function\", \"function\": {{...}}}}, "
                              f"got {type(tools).__name__}")
        checked = tuple(_tool(t, i) for i, t in enumerate(tools or ()))
        names = [t["function"]["name"] for t in checked]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"two tools are named {shown(twice[0])}")
        choice, function = _choice(tool_choice, names)
        if not checked:
            if choice in ("required", "function"):
                raise ConfigError(f"tool_choice {shown(tool_choice, as_json=True)} needs tools")
            return None
        return Tools(checked, choice, function)

    @property
    def names(self) -> List[str]:
        return [t["function"]["name"] for t in self.tools]

    @property
    def calls(self) -> bool:
        """Whether the reply is read for calls (every choice but "none")."""
        return self.choice != "none"

    def grammar(self) -> Optional[Grammar]:
        """What the reply may say: one or more calls ("required"), one call of the named function,
        or anything (None: "auto", "none")."""
        if self.choice == "required":
            return calls_grammar(list(enumerate(t["function"] for t in self.tools)), many=True)
        if self.choice == "function":
            return calls_grammar([(i, t["function"]) for i, t in enumerate(self.tools)
                                  if t["function"]["name"] == self.function], many=False)
        return None


def _tool(tool: Any, i: int) -> Dict[str, Any]:
    """One tool in OpenAI's shape, checked; ``parameters`` defaults to any object."""
    if not isinstance(tool, dict):
        raise ConfigError(f"tools[{i}] is an object {{\"type\": \"function\", \"function\": {{...}}}}, got {shown(tool)}")
    if tool.get("type", "function") != "function":
        raise ConfigError(f"tools[{i}] has type {shown(tool.get('type'))}; only \"function\" tools are supported")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ConfigError(f"tools[{i}] needs \"function\": {{\"name\": ..., \"parameters\": {{...}}}}")
    name = function.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ConfigError(f"tools[{i}]'s function needs a name of 1 to 64 letters, digits, _ or -, got {shown(name)}")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ConfigError(f"the description of tool {shown(name)} is not text")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise ConfigError(f"the parameters of tool {shown(name)} are a JSON schema object, got {shown(parameters)}")
    checked = {"name": name}
    if description is not None:
        checked["description"] = description
    checked["parameters"] = parameters if parameters is not None else {"type": "object", "properties": {}}
    return {"type": "function", "function": checked}


def _choice(value: Any, names: Sequence[str]) -> Tuple[str, Optional[str]]:
    if value is None:
        return ("auto" if names else "none"), None
    if value in ("auto", "none", "required"):
        return value, None
    if isinstance(value, dict) and value.get("type", "function") == "function" and isinstance(value.get("function"), dict):
        name = value["function"].get("name")
        if not isinstance(name, str):
            raise ConfigError(f"tool_choice's function needs a name, got {shown(value, as_json=True)}")
        if names and name not in names:
            raise ConfigError(f"tool_choice names the function {shown(name)}, which is not among the tools "
                              f"({', '.join(names)})")
        return "function", name
    raise ConfigError(f"tool_choice is \"auto\", \"none\", \"required\" or "
                      f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {shown(value, as_json=True)}")


def calls_grammar(functions: Sequence[Tuple[int, Dict[str, Any]]], many: bool) -> Grammar:
    """Calls of ``functions`` (each with its index among the tools) in the template's format:
    each ``<tool_call>``, a JSON object ``{"name": <a function's name>, "arguments": <its
    parameters' schema>}`` and ``</tool_call>``, with JSON's whitespace where llama.cpp allows
    it; one call, or with ``many`` one or more separated by whitespace. Nothing before the first
    call or after the last. Its errors name the tool (``tools[2].function.parameters...``)."""
    calls = [call_schema(f) for _, f in functions]
    schema = {"anyOf": calls} if len(calls) > 1 else calls[0]
    try:
        call_json = to_lark(schema)
    except GrammarError as e:
        raise GrammarError(e.problem, _tool_place(e.where, functions)) from None
    call_json = re.sub(r"(?m)^(// at \w+ )(.*)$", lambda m: m.group(1) + _tool_place(m.group(2), functions), call_json)
    assert call_json.startswith("start: ")
    call_json = "call_json: " + call_json[len("start: "):]
    calls = "call (sp call)*" if many else "call"
    text = (f"start: {calls}\n"
            f"call: {json.dumps(START)} sp call_json sp {json.dumps(END)}\n" + call_json)
    return Grammar.lark(text, kind="tools", source=json.dumps([f["name"] for _, f in functions]))


def _tool_place(place: str, functions: Sequence[Tuple[int, Dict[str, Any]]]) -> str:
    """A place in the calls' schema as the place in the request's tools."""
    found = re.match(r"(?:anyOf\[(\d+)\]\.)?properties\.arguments(?:\.(.*))?$", place)
    if not found:
        return "tools"
    index = functions[int(found.group(1) or 0)][0]
    return f"tools[{index}].function.parameters" + (f".{found.group(2)}" if found.group(2) else "")


def call_schema(function: Dict[str, Any]) -> Dict[str, Any]:
    """The JSON schema of one call of ``function``: its name, then its arguments."""
    return {"type": "object", "properties": {"name": {"const": function["name"]},
                                             "arguments": function.get("parameters") or {"type": "object"}},
            "required": ["name", "arguments"], "additionalProperties": False}


def grammar_with(request: Optional[Tools], asked: Optional[Grammar]) -> Optional[Grammar]:
    """The reply's grammar: the calls' ("required", a named function), else ``asked`` (the
    request's response_format, grammar or json_schema). ConfigError for both at once."""
    own = request.grammar() if request is not None else None
    if own is None:
        return asked
    if asked is not None:
        raise ConfigError(f"tool_choice {shown(request.function or request.choice, as_json=True)} constrains the "
                          f"reply to calls; give response_format, grammar or json_schema without it")
    return own


def template_tools(template: Any, request: Optional[Tools], messages: Sequence[Dict[str, Any]]) -> Optional[List[Any]]:
    """The tools to render with ``template`` (a ChatTemplate). ConfigError naming the model where
    its template does not render tools and the request needs it to (tools to call, past calls or
    their results in the messages); with tool_choice "none" such a template gets no tools."""
    if request is None and not has_calls(messages):
        return None  # an ordinary chat: the template is not asked
    tools = list(request.tools) if request is not None else None
    if template.renders_tools:
        return tools
    if (request is not None and request.calls) or has_calls(messages):
        raise ConfigError(f"{template.name}'s chat template does not render tools; tools need a model whose "
                          f"template does (Qwen2.5's, for one)")
    return None


def has_calls(messages: Sequence[Dict[str, Any]]) -> bool:
    """Whether ``messages`` hold past calls or their results."""
    return any(isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in messages)


def with_calls(message: Dict[str, Any], text: Dict[str, Any]) -> Dict[str, Any]:
    """``text`` (the message as role and text content) with what a template needs of its tool
    parts: an assistant's ``tool_calls`` (arguments given as JSON text become objects, as
    templates write them with ``tojson``), a tool result's ``tool_call_id`` and ``name``."""
    out = dict(text)
    calls = message.get("tool_calls")
    if calls:
        if message.get("role") != "assistant":
            raise ConfigError(f"only assistant messages have tool_calls, not {shown(message.get('role'))} messages")
        if not isinstance(calls, list):
            raise ConfigError(f"an assistant message's tool_calls is a list, got {type(calls).__name__}")
        out["tool_calls"] = [_past_call(c) for c in calls]
    if message.get("role") == "tool":
        for key in ("tool_call_id", "name"):
            value = message.get(key)
            if value is not None:
                if not isinstance(value, str):
                    raise ConfigError(f"a tool message's {key} is text, got {shown(value)}")
                out[key] = value
    return out


def _past_call(call: Any) -> Dict[str, Any]:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise ConfigError(f"a tool call is {{\"id\": ..., \"type\": \"function\", \"function\": {{\"name\": ..., "
                          f"\"arguments\": ...}}}}, got {shown(call)}")
    name = call["function"].get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a tool call's function needs a name, got {shown(call)}")
    arguments = call["function"].get("arguments")
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            raise ConfigError(f"the arguments of the call of {shown(name)} are not JSON: {e}") from None
    out = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call.get("id") is not None:
        out["id"] = str(call["id"])
    return out


def new_call(name: str, arguments: Any) -> Call:
    """A call as OpenAI returns it: an id, the name and the arguments as JSON text."""
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def parse_call(inner: str, names: Sequence[str]) -> Optional[Call]:
    """The call that a block's text (between ``<tool_call>`` and ``</tool_call>``) holds, or None
    where it holds none (not JSON, not ``{"name": ..., "arguments": {...}}``, a function not among
    ``names``)."""
    try:
        value = json.loads(inner)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or set(value) - {"name", "arguments"} or value.get("name") not in names:
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return new_call(value["name"], arguments)


Event = Tuple[str, Any]  # ("content", text) or ("call", Call)


class CallReader:
    """A reply's text as it comes, read into content and calls. Text that may be the start of a
    block (``BLOCKS``) is held back (as a stop string is), a call comes once its block is closed,
    a block that holds no call is content, and whitespace at either end of the content is left
    out."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self._held = ""  # text not yet read: the start of a block, or of its opening tag
        self._inside: Optional[Tuple[str, str]] = None  # the block being read: its opening and closing tags
        self._space = ""  # whitespace after the content so far: shown once more content follows
        self._started = False
        self._events: List[Event] = []

    def feed(self, text: str) -> List[Event]:
        self._held += text
        while True:
            if self._inside is None:
                found = [(self._held.find(tags[0]), tags) for tags in BLOCKS if tags[0] in self._held]
                if not found:
                    keep = max(_partial(self._held, opening) for opening, _ in BLOCKS)
                    self._content(self._held[:len(self._held) - keep])
                    self._held = self._held[len(self._held) - keep:]
                    break
                at, self._inside = min(found)
                self._content(self._held[:at])
                self._held = self._held[at:]
            opening, closing = self._inside
            end = self._held.find(closing, len(opening))
            if end < 0:
                break
            block, self._held = self._held[:end + len(closing)], self._held[end + len(closing):]
            self._inside = None
            call = parse_call(block[len(opening):end].strip(), self.names)
            if call is None:
                self._content(block)
            else:
                self._events.append(("call", call))
        return self._take()

    def finish(self) -> List[Event]:
        """What is held back, as content: the start of a tag, or a block never closed."""
        self._content(self._held)
        self._held, self._inside = "", None
        return self._take()

    def _content(self, text: str) -> None:
        if not text:
            return
        text = self._space + text
        body = text.rstrip()
        self._space = text[len(body):]
        if not self._started:
            body = body.lstrip()
        if body:
            self._events.append(("content", body))
            self._started = True

    def _take(self) -> List[Event]:
        events, self._events = self._events, []
        return events


def _partial(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that starts ``tag`` (without being all of it)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def read(text: str, names: Sequence[str]) -> Tuple[Optional[str], List[Call]]:
    """A whole reply as (content or None, calls)."""
    reader = CallReader(names)
    events = reader.feed(text) + reader.finish()
    content = "".join(e[1] for e in events if e[0] == "content")
    return content or None, [e[1] for e in events if e[0] == "call"]


# --- OpenAI's deprecated functions: the same calls in the older shapes --------------------------


def legacy_tools(functions: Any, function_call: Any) -> Tuple[Any, Any]:
    """OpenAI's deprecated ``functions`` and ``function_call`` as (tools, tool_choice): each
    function a tool; ``function_call`` "auto", "none" or ``{"name": ...}`` the choice."""
    if functions is not None and not isinstance(functions, (list, tuple)):
        raise ConfigError(f"functions is a list of {{\"name\": ..., \"parameters\": {{...}}}}, "
                          f"got {type(functions).__name__}")
    tools = [{"type": "function", "function": f} for f in functions or ()]
    choice = function_call
    if isinstance(function_call, dict):
        choice = {"type": "function", "function": function_call}
    elif function_call not in (None, "auto", "none"):
        raise ConfigError(f"function_call is \"auto\", \"none\" or {{\"name\": ...}}, got "
                          f"{shown(function_call, as_json=True)}")
    return tools or None, choice


def legacy_messages(messages: Sequence[Any]) -> List[Any]:
    """``messages`` with the deprecated shapes in today's: an assistant message's
    ``function_call`` a call in ``tool_calls``, a ``function`` message (its ``name`` and
    ``content``) a tool result."""
    return [_legacy_message(m, i) for i, m in enumerate(messages)]


def _legacy_message(message: Any, i: int) -> Any:
    if not isinstance(message, dict):
        return message
    if message.get("role") == "function":
        return {"role": "tool", "name": message.get("name"), "content": message.get("content"),
                "tool_call_id": f"call_{i}"}
    if message.get("function_call") is not None:
        out = {k: v for k, v in message.items() if k != "function_call"}
        out["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": message["function_call"]}]
        return out
    return message


def legacy_reply(response: Dict[str, Any]) -> Dict[str, Any]:
    """A chat completion with tool calls in the deprecated shape: the message's first call as
    ``function_call`` (name and arguments; ``tool_calls`` stays only when it holds more than one)
    and finish reason ``function_call``."""
    choices = []
    for choice in response["choices"]:
        message = dict(choice["message"])
        calls = message.get("tool_calls")
        if calls:
            message["function_call"] = calls[0]["function"]
            if len(calls) == 1:
                del message["tool_calls"]
            choice = {**choice, "message": message, "finish_reason": "function_call"}
        choices.append(choice)
    return {**response, "choices": choices}


def legacy_chunks(chunks: Iterator[Dict[str, Any]]) -> Iterator[Dict[str, Any]]:
    """A chat completion's stream in the deprecated shape: the first call's parts as
    ``function_call`` deltas (its name with empty arguments, then the arguments' pieces), finish
    reason ``function_call``."""
    try:
        for chunk in chunks:
            choices = []
            for choice in chunk["choices"]:
                delta = choice.get("delta", {})
                parts = delta.get("tool_calls") or []
                first = [p for p in parts if p.get("index") == 0]
                if first:
                    rest = [p for p in parts if p.get("index") != 0]
                    delta = {k: v for k, v in delta.items() if k != "tool_calls"}
                    delta["function_call"] = {k: v for k, v in first[0]["function"].items()}
                    if rest:
                        delta["tool_calls"] = rest
                    choice = {**choice, "delta": delta}
                if choice.get("finish_reason") == "tool_calls":
                    choice = {**choice, "finish_reason": "function_call"}
                choices.append(choice)
            yield {**chunk, "choices": choices}
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()  # a reader that stops early stops the generation
