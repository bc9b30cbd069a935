"""OpenAI's Responses API (``POST /v1/responses``) over the chat completions: what Codex CLI and
the OpenAI Agents SDK speak.

A request is translated to OpenAI's chat shapes and started as every chat is
(``completions.start_chat``), and its reply read back into the Responses API's shapes:

    instructions, input (messages, function_call,      ->  chat messages (system, tool_calls, tool)
        function_call_output items)
    tools (flat function tools), tool_choice           ->  OpenAI chat tools, tool_choice
    text.format (json_object, json_schema)             ->  the reply's grammar
    reply events: content, call, end                   ->  output items: message, function_call;
                                                           status, usage

Nothing is stored: each request carries its whole conversation, so ``previous_response_id``,
``conversation``, ``store: true`` and ``background: true`` (which ask the server to keep a
response) are refused, and ``store`` false or absent is what a stateless client such as Codex
sends anyway. Only function tools can be called (a hosted tool such as ``web_search`` has no
server here to run it) and only text is read (an ``input_image`` part is refused by name).
``tool_choice`` ``required`` and a named function constrain the reply to calls whose arguments
follow the tool's ``parameters`` (as for chat completions); ``text.format`` constrains the text
with the same JSON-schema conversion and limits as ``response_format``. ``truncation: "auto"``
leaves the oldest turns out of a conversation longer than the context, as OpenAI does.
``parallel_tool_calls``, ``reasoning``, ``metadata`` and ``user`` are accepted and echoed; a
reply may hold several calls whatever ``parallel_tool_calls`` says. Defaults of the sampling
fields not given are llamaspec's, as on every endpoint.

A stream is the Responses API's typed events, numbered by ``sequence_number``:
``response.created`` and ``response.in_progress``; per message item
``response.output_item.added``, ``response.content_part.added``, its
``response.output_text.delta``\\ s, ``response.output_text.done``, ``response.content_part.done``
and ``response.output_item.done``; per call ``response.output_item.added``,
``response.function_call_arguments.delta`` and ``.done``, ``response.output_item.done``; last
``response.completed`` (or ``response.incomplete``) with the whole response. Errors are
OpenAI's ``{"error": {...}}`` bodies, and in a stream an ``error`` event.
"""

from __future__ import annotations

import threading
import time
import uuid
from contextlib import closing
from typing import Any, ClassVar, Dict, Iterator, List, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ..config import SamplingConfig
from ..constraints import Grammar
from ..errors import ConfigError, shown
from ..openai.completions import ChatRun, Generator, Response, cached, options, reply_events, start_chat, timings
from .events import TypedEvents

PATH = "/v1/responses"
_S = SamplingConfig()

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text")


class ResponsesRequest(BaseModel):
    """The body of ``POST /v1/responses``: the Responses API's fields (``input``'s items, the
    tools and ``text.format`` are checked by ``chat_arguments`` and ``text_grammar``, which name
    the item at fault)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: Optional[str] = None
    input: Any = Field(...)  # a string, or a list of items
    instructions: Optional[str] = None
    tools: Optional[List[Any]] = None
    tool_choice: Any = None
    max_output_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    stream: bool = False
    text: Optional[Dict[str, Any]] = None
    parallel_tool_calls: Optional[bool] = None
    metadata: Optional[Dict[str, Any]] = None
    user: Optional[str] = None
    reasoning: Optional[Dict[str, Any]] = None
    truncation: Optional[str] = Field(None, pattern="^(auto|disabled)$")
    # what asks the server to keep a response: refused (see ``stateless``)
    store: Optional[bool] = None
    previous_response_id: Optional[str] = None
    conversation: Any = None
    background: Optional[bool] = None

    n: ClassVar[int] = 1  # one reply a request

    def arguments(self) -> Dict[str, Any]:
        """The arguments of ``create_response``: the conversation in OpenAI's chat shapes, and
        the request's fields a response echoes (``echo``)."""
        stateless(self)
        chat = chat_arguments(self.instructions, self.input, self.tools, self.tool_choice)
        grammar = text_grammar(self.text)
        if grammar is not None and (chat["tool_choice"] == "required" or isinstance(chat["tool_choice"], dict)):
            raise ConfigError(f"tool_choice {shown(self.tool_choice, as_json=True)} constrains the reply to calls; "
                              f"give text.format without it", "text.format")
        temperature = _S.temperature if self.temperature is None else self.temperature
        top_p = _S.top_p if self.top_p is None else self.top_p
        return {**chat, "grammar": grammar, "max_tokens": self.max_output_tokens, "temperature": temperature,
                "top_p": top_p, "model": self.model, "trim": self.truncation == "auto",
                "echo": self.echo(temperature, top_p)}

    def echo(self, temperature: float, top_p: float) -> Dict[str, Any]:
        """The request's fields as its response echoes them (OpenAI's defaults where not given)."""
        return {"instructions": self.instructions, "max_output_tokens": self.max_output_tokens,
                "parallel_tool_calls": self.parallel_tool_calls is not False,
                "tool_choice": self.tool_choice if self.tool_choice is not None else "auto",
                "tools": self.tools or [], "temperature": temperature, "top_p": top_p,
                "text": self.text or {"format": {"type": "text"}}, "metadata": self.metadata or {},
                "reasoning": self.reasoning, "truncation": self.truncation or "disabled", "user": self.user,
                "store": False, "previous_response_id": None}


def stateless(body: ResponsesRequest) -> None:
    """ConfigError for a field that asks the server to keep or recall a response: llamaspec keeps
    none (the client sends the whole conversation each time)."""
    for field, asked in (("previous_response_id", body.previous_response_id is not None),
                         ("conversation", body.conversation is not None), ("store", body.store is True),
                         ("background", body.background is True)):
        if asked:
            raise ConfigError(f"llamaspec stores no responses: send the whole conversation as input, without "
                              f"{field}{': true' if field in ('store', 'background') else ''}", field)


def chat_arguments(instructions: Optional[str], input: Any, tools: Optional[List[Any]],
                   tool_choice: Any) -> Dict[str, Any]:
    """A Responses conversation as create_chat_completion's ``messages``, ``tools`` and
    ``tool_choice``; ConfigError naming the field at fault."""
    return {"messages": chat_messages(instructions, input), "tools": _tools(tools),
            "tool_choice": _tool_choice(tool_choice)}


def chat_messages(instructions: Optional[str], input: Any) -> List[Dict[str, Any]]:
    """``instructions`` (a system message first) and ``input`` (a user's text, or items) as chat
    messages: an assistant's function_call items become its ``tool_calls``, their outputs ``tool``
    messages."""
    chat = [{"role": "system", "content": instructions}] if instructions else []
    if isinstance(input, str):
        return chat + [{"role": "user", "content": input}]
    if not isinstance(input, list) or not input:
        raise ConfigError(f"input is a string or a non-empty list of items, got {shown(input)}", "input")
    issued: Dict[str, str] = {}  # call_ids of the function_call items so far -> the function's name
    for i, item in enumerate(input):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"an input item is an object, got {shown(item)}", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            chat.append(_message(item, where))
        elif kind == "function_call":
            _add_call(chat, _past_call(item, where, issued))
        elif kind == "function_call_output":
            chat.append(_output(item, where, issued))
        elif kind == "reasoning":
            continue  # a reasoning model's thoughts of an earlier turn: not shown to the model again
        else:
            raise ConfigError(f"input items of type {shown(kind)} are not supported (message, function_call and "
                              f"function_call_output are)", f"{where}.type")
    return chat


def _message(item: Dict[str, Any], where: str) -> Dict[str, Any]:
    role = item.get("role")
    if role not in ROLES:
        raise ConfigError(f"role is \"user\", \"assistant\", \"system\" or \"developer\", got {shown(role)}",
                          f"{where}.role")
    return {"role": ROLES[role], "content": _text(item.get("content"), f"{where}.content")}


def _text(content: Any, where: str) -> str:
    """A string, or text parts' text (``input_text``, ``output_text``; their annotations are not
    read); ConfigError naming a part of another type (images, files, audio)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ConfigError(f"is a string or a list of content parts, got {shown(content)}", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            raise ConfigError(f"content parts of type {shown(kind)} are not supported; only text is read "
                              f"(input_text, output_text)", f"{where}[{j}].type")
        if not isinstance(part.get("text"), str):
            raise ConfigError(f"a text part's text is a string, got {shown(part.get('text'))}", f"{where}[{j}].text")
        texts.append(part["text"])
    return "".join(texts)


def _past_call(item: Dict[str, Any], where: str, issued: Dict[str, str]) -> Dict[str, Any]:
    """A function_call item as an OpenAI chat tool call (its arguments JSON text, as given)."""
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
    if not isinstance(call_id, str) or not call_id:
        raise ConfigError(f"a function_call item needs a call_id, got {shown(call_id)}", f"{where}.call_id")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a function_call item needs a name, got {shown(name)}", f"{where}.name")
    if not isinstance(arguments, str):
        raise ConfigError(f"a function_call item's arguments are JSON text, got {shown(arguments)}",
                          f"{where}.arguments")
    issued[call_id] = name
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _add_call(chat: List[Dict[str, Any]], call: Dict[str, Any]) -> None:
    """A past call as the last assistant message's (the text it came with, or the calls before
    it), or as a new assistant message."""
    if chat and chat[-1]["role"] == "assistant":
        chat[-1].setdefault("tool_calls", []).append(call)
    else:
        chat.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _output(item: Dict[str, Any], where: str, issued: Dict[str, str]) -> Dict[str, Any]:
    """A function_call_output item as a tool message, for a call an earlier item made."""
    call_id = item.get("call_id")
    if call_id not in issued:
        raise ConfigError(f"function_call_output for {shown(call_id)}, which no earlier function_call item has as "
                          f"its call_id", f"{where}.call_id")
    return {"role": "tool", "tool_call_id": call_id, "name": issued[call_id],
            "content": _text(item.get("output", ""), f"{where}.output")}


def _tools(tools: Optional[List[Any]]) -> Optional[List[Dict[str, Any]]]:
    """The Responses API's function tools (flat: name, description, parameters, strict) as
    OpenAI's chat tools; ``strict`` is not needed: a constrained call follows its schema anyway."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise ConfigError(f"tools of type {shown(kind)} are not supported; only function tools "
                              f"({{\"type\": \"function\", \"name\", \"parameters\"}}) are", f"tools[{i}].type")
        function = {key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    """The Responses API's tool_choice as OpenAI's chat one: auto, none, required, a function."""
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if not isinstance(name, str):
            raise ConfigError(f"a tool_choice of type \"function\" needs the function's name, got {shown(name)}",
                              "tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    raise ConfigError(f"tool_choice is \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"name\": ...}}, "
                      f"got {shown(choice, as_json=True)}", "tool_choice")


def text_grammar(text: Optional[Dict[str, Any]]) -> Optional[Grammar]:
    """The grammar ``text.format`` asks for: none (``text``), any JSON object (``json_object``)
    or JSON that validates against a schema (``json_schema``), converted as response_format's is
    (the same limits), its errors named ``text.format...``."""
    spec = (text or {}).get("format")
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ConfigError(f"text.format is an object such as {{\"type\": \"json_object\"}}, got {shown(spec)}",
                          "text.format")
    kind = spec.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json("text.format")
    if kind == "json_schema":
        if not isinstance(spec.get("schema"), dict):
            raise ConfigError(f"a json_schema format needs \"schema\": a JSON schema object, got "
                              f"{shown(spec.get('schema'))}", "text.format.schema")
        return Grammar.json_schema(spec["schema"], "text.format.schema")
    raise ConfigError(f"text.format's type is \"text\", \"json_object\" or \"json_schema\", got {shown(kind)}",
                      "text.format.type")


def create_response(spec: Generator, messages: List[Dict[str, Any]], tools: Any = None, tool_choice: Any = None,
                    max_tokens: Optional[int] = None, temperature: float = _S.temperature, top_p: float = _S.top_p,
                    stream: bool = False, model: Optional[str] = None, grammar: Any = None, trim: bool = False,
                    echo: Optional[Dict[str, Any]] = None, n: int = 1, batcher: Any = None,
                    abandoned: Optional[threading.Event] = None) -> Union[Response, Iterator[Response]]:
    """A reply to a conversation in create_chat_completion's shapes (``chat_arguments``) as the
    Responses API gives it: a response, or with ``stream`` its events. ``grammar``: the text's
    constraint (``text_grammar``, or the server's ``--grammar``); ``trim``: leave the oldest turns
    out of a conversation longer than the context; ``echo``: the request's fields the response
    echoes (ResponsesRequest.echo; from Python, this call's own); ``batcher`` and ``abandoned``: as in
    create_chat_completion."""
    if n != 1:
        raise ConfigError("a response request gives one reply")
    opts = options(max_tokens, temperature, top_p, _S.min_p, _S.top_k, None, None, grammar)
    run = start_chat(spec, messages, tools, tool_choice, opts, trim, batcher=batcher)
    head = {"id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()),
            "status": "in_progress", "error": None, "incomplete_details": None,
            "model": model or spec.model_name, "output": [], "usage": None}
    head.update(echo or ResponsesRequest.model_construct(max_output_tokens=max_tokens).echo(temperature, top_p))
    events = _numbered(_events(run, head, abandoned))
    if stream:
        return events
    last = None
    for last in events:
        pass
    assert last is not None
    return last["response"]


def _numbered(events: Iterator[Response]) -> Iterator[Response]:
    """Each event with its ``sequence_number``, counted from 0. Closing these closes ``events``
    (and the generation) at once, not when the garbage collector comes."""
    with closing(events):
        for i, event in enumerate(events):
            yield {"type": event["type"], "sequence_number": i, **event}


def _events(run: ChatRun, head: Response, abandoned: Optional[threading.Event]) -> Iterator[Response]:
    """The reply as the Responses API's stream events (see the module's docstring). Every event
    holds its own copies of the items: the server may write an event after later ones changed
    them. However the stream ends, the generation is closed (also before the reply's first
    event, where reply_events would not have started)."""
    try:
        yield {"type": "response.created", "response": head}
        yield {"type": "response.in_progress", "response": head}
        yield from _items(head, reply_events(run, abandoned))
    finally:
        run.events.close()


def _items(head: Response, replies: Iterator[Any]) -> Iterator[Response]:
    """The output items' events of the reply's ``replies`` (reply_events), then the last."""
    output: List[Dict[str, Any]] = []
    text: Optional[Dict[str, Any]] = None  # the message item being written, if any
    for kind, value in replies:
        if kind == "content":
            if text is None:
                text = _message_item("", "in_progress")
                output.append(text)
                yield from _text_opened(text, len(output) - 1)
            text["content"][0]["text"] += value
            yield {"type": "response.output_text.delta", "item_id": text["id"], "output_index": len(output) - 1,
                   "content_index": 0, "delta": value, "logprobs": []}
            continue
        status = _status(value) if kind == "end" else "completed"
        if text is None and kind == "end" and not output:  # an empty reply: an empty message, as OpenAI gives it
            text = _message_item("", "in_progress")
            output.append(text)
            yield from _text_opened(text, 0)
        if text is not None:
            text["status"] = status
            yield from _text_closed(text, output.index(text))
            text = None
        if kind == "call":
            output.append(_call_item(value))
            yield from _call_events(output[-1], len(output) - 1)
        else:
            yield _end(head, output, value, status)


def _message_item(text: str, status: str) -> Dict[str, Any]:
    return {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": status, "role": "assistant",
            "content": [_text_part(text)]}


def _text_part(text: str) -> Dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _copy(item: Dict[str, Any]) -> Dict[str, Any]:
    """An item as it is now (its content parts copied too)."""
    return {**item, "content": [dict(part) for part in item["content"]]} if "content" in item else dict(item)


def _text_opened(item: Dict[str, Any], index: int) -> Iterator[Response]:
    yield {"type": "response.output_item.added", "output_index": index, "item": {**_copy(item), "content": []}}
    yield {"type": "response.content_part.added", "item_id": item["id"], "output_index": index,
           "content_index": 0, "part": _text_part("")}


def _text_closed(item: Dict[str, Any], index: int) -> Iterator[Response]:
    text = item["content"][0]["text"]
    yield {"type": "response.output_text.done", "item_id": item["id"], "output_index": index, "content_index": 0,
           "text": text, "logprobs": []}
    yield {"type": "response.content_part.done", "item_id": item["id"], "output_index": index, "content_index": 0,
           "part": _text_part(text)}
    yield {"type": "response.output_item.done", "output_index": index, "item": _copy(item)}


def _call_item(call: Dict[str, Any]) -> Dict[str, Any]:
    """An OpenAI chat call (its arguments JSON text that follows the tool's schema) as a
    function_call item."""
    return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": "completed"}


def _call_events(item: Dict[str, Any], index: int) -> Iterator[Response]:
    """A call comes whole (once its block closed): added with no arguments, its arguments in one
    delta, done."""
    yield {"type": "response.output_item.added", "output_index": index,
           "item": {**item, "arguments": "", "status": "in_progress"}}
    yield {"type": "response.function_call_arguments.delta", "item_id": item["id"], "output_index": index,
           "delta": item["arguments"]}
    yield {"type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": index,
           "arguments": item["arguments"]}
    yield {"type": "response.output_item.done", "output_index": index, "item": dict(item)}


def _status(result: Any) -> str:
    """"completed" where the model ended its reply, "incomplete" where the token limit (or the
    context's end, or the server stopping) cut it short."""
    return "completed" if result.stop_reason == "stop" else "incomplete"


def _end(head: Response, output: List[Dict[str, Any]], result: Any, status: str) -> Response:
    """The last event: the whole response, its usage and llama-server's timings."""
    response = {**head, "status": status,
                "incomplete_details": _incomplete(result) if status == "incomplete" else None,
                "output": [_copy(item) for item in output], "output_text": _output_text(output),
                "usage": _usage(result), "timings": timings(result.stats)}
    return {"type": f"response.{status}", "response": response}


def _incomplete(result: Any) -> Dict[str, Any]:
    """Why a reply was cut short: the token limit (or the context's end), or none OpenAI names
    (the server stopping)."""
    return {"reason": "max_output_tokens" if result.stop_reason in ("length", "context") else None}


def _output_text(output: List[Dict[str, Any]]) -> str:
    """The text of every message item, joined (the SDKs' ``output_text``)."""
    return "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])


def _usage(result: Any) -> Dict[str, Any]:
    """OpenAI's usage: the whole prompt (``cached_tokens`` of it reused from the KV cache; none
    counted as written to it, ``cache_write_tokens``: llamaspec keeps what it reads anyway) and
    the reply's tokens (none of them reasoning)."""
    stats = result.stats
    n_input, n_output = stats.n_prompt, len(result.tokens)
    return {"input_tokens": n_input, "input_tokens_details": {"cached_tokens": cached(stats), "cache_write_tokens": 0},
            "output_tokens": n_output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": n_input + n_output}


class ResponseEvents(TypedEvents):
    """How a response's stream is framed: typed events; an error after the stream started is an
    ``error`` event numbered after the last event sent."""

    def __init__(self) -> None:
        super().__init__(self._error, frozenset({"response.completed", "response.incomplete"}))
        self.sent = -1  # the last event's sequence_number

    def frame(self, chunks: List[Dict[str, Any]]) -> str:
        if chunks:
            self.sent = chunks[-1].get("sequence_number", self.sent)
        return super().frame(chunks)

    def _error(self, message: str) -> Dict[str, Any]:
        return {"type": "error", "code": "server_error", "message": message, "param": None,
                "sequence_number": self.sent + 1}


def events(body: Any) -> TypedEvents:
    return ResponseEvents()
