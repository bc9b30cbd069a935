"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) over the chat
completions: what Claude Code and the ``anthropic`` client speak.

A request is translated to OpenAI's chat shapes and started as every chat is
(``completions.start_chat``), and its reply read back into Anthropic's shapes:

    system, messages (text, tool_use, tool_result)  ->  chat messages (tool_calls, tool)
    tools (input_schema), tool_choice               ->  OpenAI tools, tool_choice
    reply events: content, call, end                ->  content blocks: text, tool_use
                                                        stop_reason, usage

``tool_choice`` ``any`` and ``tool`` constrain the reply to calls whose input follows the tool's
``input_schema`` (the grammar OpenAI's ``required`` and named choices get); ``auto`` lets the model
answer or call; ``none`` reads the reply as text. ``usage`` counts as Anthropic counts: the prompt
read now (``input_tokens``), reused from the KV cache (``cache_read_input_tokens``) and written
to it beyond that (``cache_creation_input_tokens``: none, llamaspec keeps what it reads anyway).
A stream is Anthropic's events: ``message_start``, ``ping``, per block ``content_block_start``,
its deltas (``text_delta``, ``input_json_delta``) and ``content_block_stop``, then
``message_delta`` (stop reason, usage) and ``message_stop``. Errors are Anthropic's
``{"type": "error", "error": {"type", "message"}}``. Defaults of the sampling fields not given
are llamaspec's, as on every endpoint.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any, ClassVar, Dict, Iterator, List, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ..config import SamplingConfig
from ..errors import ConfigError, shown
from ..openai.completions import (ChatRun, Generator, Response, cached, chat_tokens, options, reply_events,
                                  start_chat, timings)
from ..openai.tools import Tools
from .events import TypedEvents

PATH = "/v1/messages"
_S = SamplingConfig()

# Anthropic's error types by status code (its API's errors page).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error", 529: "overloaded_error"}


def error_body(status: int, message: str) -> Dict[str, Any]:
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


class MessagesRequest(BaseModel):
    """The body of ``POST /v1/messages``: Anthropic's fields (content blocks are checked by
    ``chat_arguments``, which names the block at fault)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: Optional[str] = None
    messages: List[Dict[str, Any]] = Field(min_length=1)
    system: Union[str, List[Dict[str, Any]], None] = None
    max_tokens: int = Field(ge=1)  # required, as Anthropic requires it
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Dict[str, Any]] = None
    stop_sequences: Optional[List[str]] = None
    temperature: float = Field(_S.temperature, ge=0, le=2)
    top_p: float = Field(_S.top_p, gt=0, le=1)
    top_k: int = Field(_S.top_k, ge=0)
    stream: bool = False
    metadata: Optional[Dict[str, Any]] = None  # accepted; user_id is the client's business

    n: ClassVar[int] = 1  # one reply a request

    def arguments(self) -> Dict[str, Any]:
        """The arguments of ``create_message``: the conversation in OpenAI's chat shapes."""
        return {**chat_arguments(self.system, self.messages, self.tools, self.tool_choice),
                "max_tokens": self.max_tokens, "stop": self.stop_sequences or [], "temperature": self.temperature,
                "top_p": self.top_p, "top_k": self.top_k, "model": self.model}


class CountTokensRequest(BaseModel):
    """The body of ``POST /v1/messages/count_tokens``: a request's prompt without its sampling."""

    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    messages: List[Dict[str, Any]] = Field(min_length=1)
    system: Union[str, List[Dict[str, Any]], None] = None
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Dict[str, Any]] = None

    def arguments(self) -> Dict[str, Any]:
        return chat_arguments(self.system, self.messages, self.tools, self.tool_choice)


def chat_arguments(system: Any, messages: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]],
                   tool_choice: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """An Anthropic conversation as create_chat_completion's ``messages``, ``tools`` and
    ``tool_choice``; ConfigError naming the field at fault."""
    chat = [{"role": "system", "content": _text(system, "system")}] if system else []
    issued: Dict[str, str] = {}  # tool_use ids of the assistant's past calls -> the tool's name
    for i, message in enumerate(messages):
        chat += _message(message, f"messages[{i}]", issued)
    return {"messages": chat, "tools": _tools(tools), "tool_choice": _tool_choice(tool_choice)}


def _message(message: Dict[str, Any], where: str, issued: Dict[str, str]) -> List[Dict[str, Any]]:
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant"):
        raise ConfigError(f"role is \"user\" or \"assistant\", got {shown(role)}", f"{where}.role")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise ConfigError(f"content is a string or a list of content blocks, got {shown(content)}", f"{where}.content")
    texts: List[str] = []
    calls: List[Dict[str, Any]] = []
    results: List[Dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise ConfigError(f"a text block's text is a string, got {shown(block.get('text'))}", f"{at}.text")
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            calls.append(_past_call(block, at, issued))
        elif kind == "tool_result" and role == "user":
            results.append(_result(block, at, issued))
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # the model's reasoning of an earlier turn: not shown to it again, as Anthropic drops it
        else:
            raise ConfigError(f"content blocks of type {shown(kind)} are not supported in {role} messages "
                              f"(text{', tool_use' if role == 'assistant' else ', tool_result'} are)", f"{at}.type")
    if role == "assistant":
        out: Dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if calls:
            out["tool_calls"] = calls
        return [out]
    return results + ([{"role": "user", "content": "".join(texts)}] if texts or not results else [])


def _text(value: Any, where: str) -> str:
    """A string, or text blocks' text (``cache_control`` and citations accepted, ignored)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ConfigError(f"is a string or a list of text blocks, got {shown(value)}", where)
    parts = []
    for j, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise ConfigError(f"only text blocks ({{\"type\": \"text\", \"text\": ...}}) are supported here, "
                              f"got {shown(block)}", f"{where}[{j}]")
        parts.append(block["text"])
    return "".join(parts)


def _past_call(block: Dict[str, Any], where: str, issued: Dict[str, str]) -> Dict[str, Any]:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not call_id:
        raise ConfigError(f"a tool_use block needs an id, got {shown(call_id)}", f"{where}.id")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a tool_use block needs a name, got {shown(name)}", f"{where}.name")
    if not isinstance(arguments, dict):
        raise ConfigError(f"a tool_use block's input is an object, got {shown(arguments)}", f"{where}.input")
    issued[call_id] = name
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _result(block: Dict[str, Any], where: str, issued: Dict[str, str]) -> Dict[str, Any]:
    call_id = block.get("tool_use_id")
    if call_id not in issued:
        raise ConfigError(f"tool_result for {shown(call_id)}, which no earlier assistant message's tool_use has "
                          f"as its id", f"{where}.tool_use_id")
    content = block.get("content", "")
    text = _text(content, f"{where}.content") if content is not None else ""
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": call_id, "name": issued[call_id], "content": text}


def _tools(tools: Optional[List[Dict[str, Any]]]) -> Optional[List[Dict[str, Any]]]:
    """Anthropic's client tools (name, description, input_schema) as OpenAI's function tools."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type", "custom") != "custom":
            raise ConfigError(f"tools of type {shown(tool.get('type'))} (Anthropic's server tools) are not "
                              f"supported; give client tools: name, description, input_schema", f"tools[{i}].type")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise ConfigError(f"a tool needs an input_schema (a JSON schema object), got {shown(schema)}",
                              f"tools[{i}].input_schema")
        function = {"name": tool.get("name"), "parameters": schema}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Optional[Dict[str, Any]]) -> Any:
    """Anthropic's tool_choice as OpenAI's: auto, any (required), tool (a named function), none."""
    if choice is None:
        return None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            raise ConfigError(f"tool_choice of type \"tool\" needs the tool's name, got {shown(name)}",
                              "tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    raise ConfigError(f"tool_choice's type is \"auto\", \"any\", \"tool\" or \"none\", got {shown(kind)}",
                      "tool_choice.type")


def count_tokens(spec: Generator, messages: List[Dict[str, Any]], tools: Any = None,
                 tool_choice: Any = None) -> Dict[str, int]:
    """``/v1/messages/count_tokens``: the prompt's tokens, rendered as a request would be."""
    return {"input_tokens": len(chat_tokens(spec, messages, Tools.of(tools, tool_choice)))}


def create_message(spec: Generator, messages: List[Dict[str, Any]], max_tokens: int, tools: Any = None,
                   tool_choice: Any = None, stop: Optional[List[str]] = None, temperature: float = _S.temperature,
                   top_p: float = _S.top_p, top_k: int = _S.top_k, stream: bool = False, model: Optional[str] = None,
                   grammar: Any = None, n: int = 1, batcher: Any = None,
                   abandoned: Optional[threading.Event] = None) -> Union[Response, Iterator[Response]]:
    """A reply to a conversation in create_chat_completion's shapes (``chat_arguments``) as
    Anthropic's Messages API gives it: a message, or with ``stream`` its events. ``grammar``:
    the text's constraint (the server's ``--grammar``); ``batcher`` and ``abandoned``: as in
    create_chat_completion. The message (a stream: its ``message_delta``) has the tokens'
    ``sources`` (where each came from), an extra beside llama-server's ``timings``."""
    if n != 1:
        raise ConfigError("a message request gives one reply")
    opts = options(max_tokens, temperature, top_p, _S.min_p, top_k, stop, None, grammar)
    run = start_chat(spec, messages, tools, tool_choice, opts, batcher=batcher)
    head = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
            "model": model or spec.model_name}
    if stream:
        return _events(run, head, abandoned)
    content: List[Dict[str, Any]] = []
    result = None
    for kind, value in reply_events(run, abandoned):
        if kind == "content":
            if content and content[-1]["type"] == "text":
                content[-1]["text"] += value
            else:
                content.append({"type": "text", "text": value})
        elif kind == "call":
            content.append(_tool_use(value))
        else:
            result = value
    assert result is not None
    return {**head, "content": content or [{"type": "text", "text": ""}],
            **_stop(result, any(b["type"] == "tool_use" for b in content)), "usage": _usage(result),
            "timings": timings(result.stats), "sources": result.sources}


def _events(run: ChatRun, head: Response, abandoned: Optional[threading.Event]) -> Iterator[Response]:
    """The reply's stream as Anthropic's events (see the module's docstring). Closed before its
    reply's first event (the client gone), it still stops the generation."""
    try:
        yield from _typed(run, head, abandoned)
    finally:
        run.events.close()


def _typed(run: ChatRun, head: Response, abandoned: Optional[threading.Event]) -> Iterator[Response]:
    yield {"type": "message_start", "message": {**head, "content": [], "stop_reason": None, "stop_sequence": None,
                                                "usage": {"input_tokens": run.n_prompt, "output_tokens": 0}}}
    yield {"type": "ping"}
    index, open_text, called = 0, False, False
    for kind, value in reply_events(run, abandoned):
        if kind == "content":
            if not open_text:
                yield {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
                open_text = True
            yield {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": value}}
            continue
        if open_text:
            yield {"type": "content_block_stop", "index": index}
            index, open_text = index + 1, False
        if kind == "call":
            block = _tool_use(value)
            yield {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}}
            yield {"type": "content_block_delta", "index": index,
                   "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}}
            yield {"type": "content_block_stop", "index": index}
            index, called = index + 1, True
        else:
            yield {"type": "message_delta", "delta": _stop(value, called),
                   "usage": {**_usage(value), "output_tokens": len(value.tokens)}, "timings": timings(value.stats),
                   "sources": value.sources}
            yield {"type": "message_stop"}


def _tool_use(call: Dict[str, Any]) -> Dict[str, Any]:
    """An OpenAI call (its arguments JSON text that follows the tool's schema) as a tool_use block."""
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"])}


def _stop(result: Any, called: bool) -> Dict[str, Any]:
    """stop_reason and stop_sequence: a call, a stop sequence, the model's end, the token limit."""
    if called:
        return {"stop_reason": "tool_use", "stop_sequence": None}
    if result.stop_string is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": result.stop_string}
    return {"stop_reason": "max_tokens" if result.stop_reason in ("length", "context") else "end_turn",
            "stop_sequence": None}


def _usage(result: Any) -> Dict[str, int]:
    stats = result.stats
    return {"input_tokens": stats.n_prompt_eval, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached(stats), "output_tokens": len(result.tokens)}


def events(body: Any) -> TypedEvents:
    """How a message's stream is framed: typed events, Anthropic's error event."""
    return TypedEvents(lambda message: error_body(500, message), frozenset({"message_stop"}))
