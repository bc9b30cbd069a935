"""llama-server's native endpoints beside the OpenAI ones, with llama-server's field names,
defaults and reply shapes: what llama.vim, llama.vscode, llama.cpp's web UI and scripts
written for llama-server send.

    POST /completion, /completions   a prompt (text, token ids or both) continued, in
                                     llama-server's shape (completions.create_native)
    POST /infill                     the middle of code, the same shape (completions.create_infill)
    POST /tokenize, /detokenize      text to token ids (with their pieces) and back
    POST /apply-template             the chat template's rendering of OpenAI chat messages
    GET /props, GET /slots           the defaults, the model, what drafts; each slot and whether
                                     a request runs on it

Sampling defaults are llamaspec's (SamplingConfig), which are llama-server's. What differs, and
why: a request takes the next free slot (``id_slot`` is accepted, not obeyed: a slot's cache
is not kept apart for a client) and the cached prefix is always reused (``cache_prompt`` is
accepted); a request has one prompt and one completion (``n`` 1; a list of strings,
llama-server's several prompts, is a 400); llama-server's samplers that llamaspec lacks (DRY,
XTC, dynamic temperature) and timing limits (``t_max_predict_ms``) are ignored; POST /props
answers 501, as llama-server without ``--props``; /slots is always on.
"""

from __future__ import annotations

from importlib import metadata
from typing import Annotated, Any, Dict, List, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from ..config import MAX_LOGPROBS, SamplingConfig
from ..errors import ConfigError, shown
from ..openai.completions import _text_message, native_params, native_tokens, options, shaping
from ..openai.tools import Tools, legacy_messages, template_tools, with_calls
from . import schemas

_S = SamplingConfig()
# llamaspec's generation defaults, as /props and /slots show them (n_predict -1: until a stop).
DEFAULTS = options(None, _S.temperature, _S.top_p, _S.min_p, _S.top_k, None, None, None,
                   shaping(_S.repeat_penalty, _S.frequency_penalty, _S.presence_penalty, _S.penalty_last_n, None,
                           _S.typical_p))


def _mixed(value: Any) -> Any:
    """Text, or a list of token ids and texts (what llama-server reads as a prompt); anything
    else is refused with one message, not pydantic's per member of the union."""
    if isinstance(value, str) or isinstance(value, list) and all(isinstance(v, str) or type(v) is int for v in value):
        return value
    raise PydanticCustomError("mixed", "is a string or a list of token ids and strings, got {got}",
                              {"got": shown(value, 80)})


Mixed = Annotated[Union[str, List[Union[int, str]]], BeforeValidator(_mixed)]


class NativeFields(BaseModel):
    """The fields llama-server's /completion and /infill add to the sampling ones."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    return_tokens: bool = False
    n_probs: int = Field(0, ge=0, le=MAX_LOGPROBS)
    response_fields: Optional[List[str]] = None
    cache_prompt: bool = True  # accepted: the cached prefix is always reused
    id_slot: int = -1  # accepted: a request takes the next free slot

    def native(self) -> Dict[str, Any]:
        return {"return_tokens": self.return_tokens, "n_probs": self.n_probs, "response_fields": self.response_fields}


class CompletionRequest(schemas.Sampling, NativeFields):
    """llama-server's /completion: ``n_predict`` (else ``max_tokens``, as llama-server reads it)
    -1 until a stop or a full context, 0 only reads the prompt into the cache."""

    prompt: Mixed
    n_predict: Optional[int] = Field(None, ge=-1)
    max_tokens: Optional[int] = Field(None, ge=-1)

    def arguments(self) -> Dict[str, Any]:
        return {**self.sampling(), **self.native(), "prompt": self.prompt, "n_predict": self.n_predict,
                "max_tokens": self.max_tokens}


class InfillRequest(schemas.InfillRequest, NativeFields):
    """llama-server's /infill, with /completion's native fields."""

    def arguments(self) -> Dict[str, Any]:
        return {**super().arguments(), **self.native()}


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    content: Mixed
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tokens: List[int]


class TemplateRequest(BaseModel):
    """llama-server's /apply-template: chat messages as /v1/chat/completions takes them."""

    model_config = ConfigDict(extra="ignore")

    messages: List[schemas.Message] = Field(min_length=1)
    tools: Optional[List[Any]] = None
    tool_choice: Optional[Any] = None

    def arguments(self) -> Dict[str, Any]:
        return {"messages": [m.message() for m in self.messages], "tools": self.tools, "tool_choice": self.tool_choice}


def tokenize(spec: Any, content: Union[str, List[Union[int, str]]], add_special: bool = False,
             parse_special: bool = True, with_pieces: bool = False) -> Dict[str, Any]:
    """``{"tokens": [ids]}`` of ``content`` (text, or ids and texts mixed); ``with_pieces``: each
    as ``{"id", "piece"}``, a piece that is not UTF-8 by itself as its byte values."""
    items = [content] if isinstance(content, str) else content
    for item in items:
        if isinstance(item, str):
            _utf8(item, "content")
    tokens = known(spec, native_tokens(lambda text, first: spec.model.tokenize(text, first, parse_special), items,
                                       add_special), "content")
    if not with_pieces:
        return {"tokens": tokens}
    return {"tokens": [{"id": t, "piece": piece(spec, t)} for t in tokens]}


def piece(spec: Any, token: int) -> Union[str, List[int]]:
    """A token's text, or its bytes where they are not valid UTF-8 alone (part of a character)."""
    raw = spec.model.piece(token)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def detokenize(spec: Any, tokens: List[int]) -> Dict[str, str]:
    """``{"content"}``: the tokens' text, special tokens spelled out."""
    return {"content": spec.detokenize(known(spec, tokens, "tokens"))}


def known(spec: Any, tokens: List[int], field: str) -> List[int]:
    """``tokens``, or ConfigError naming those not in the model's vocabulary (llama.cpp would
    read them out of bounds)."""
    size = spec.model.n_vocab
    bad = [t for t in tokens if not 0 <= t < size]
    if bad:
        ids = ", ".join(str(t) for t in bad[:8]) + (", ..." if len(bad) > 8 else "")
        many = len(bad) > 1
        raise ConfigError(f"{'ids' if many else 'id'} {ids} {'are' if many else 'is'} not in the vocabulary "
                          f"(0 to {size - 1})", field)
    return tokens


def _utf8(text: str, field: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError("is not valid UTF-8 text", field) from None


def apply_template(spec: Any, messages: List[Dict[str, Any]], tools: Optional[List[Any]] = None,
                   tool_choice: Any = None) -> Dict[str, str]:
    """``{"prompt"}``: the text /v1/chat/completions reads for these messages and tools (the
    model's chat template, the reply's start included), not decoded."""
    called = Tools.of(tools, tool_choice)
    chat = [with_calls(m, _text_message(m)) for m in legacy_messages(messages)]
    return {"prompt": spec.format_chat(chat, template_tools(spec.chat_template(), called, chat))}


def props(spec: Any, slots: int) -> Dict[str, Any]:
    """llama-server's GET /props, and under ``llamaspec`` what drafts (see drafting)."""
    model = spec.model
    return {"default_generation_settings": {"n_ctx": spec.ctx.n_ctx, "params": native_params(DEFAULTS)},
            "total_slots": slots, "model_alias": spec.model_name, "model_path": str(model.path),
            "modalities": {"vision": False, "audio": False}, "endpoint_slots": True, "endpoint_props": False,
            "endpoint_metrics": True, "chat_template": model.chat_template() or "",
            "bos_token": _special(model, model.bos), "eos_token": _special(model, model.eos),
            "build_info": build_info(), "llamaspec": drafting(spec)}


def drafting(spec: Any) -> Dict[str, Any]:
    """What drafts: the sources (``--spec``'s name for them: auto, plain or their names), and the
    draft model where one is loaded."""
    draft = spec.draft_model
    return {"spec": spec.spec_name, "speculative": spec.spec_name != "plain",
            "draft_model": draft.path.name if draft is not None else None,
            "draft_model_path": str(draft.path) if draft is not None else None}


def slots(spec: Any, total: int, busy: int) -> List[Dict[str, Any]]:
    """llama-server's GET /slots: ``total`` slots, the first ``busy`` processing (requests are
    not pinned to a slot, so which one is not known: only how many). llamaspec keeps no task ids
    (``id_task`` -1) and no count of a slot's tokens."""
    params = native_params(DEFAULTS)
    speculative = spec.spec_name != "plain"
    return [{"id": i, "id_task": -1, "n_ctx": spec.ctx.n_ctx, "speculative": speculative, "is_processing": i < busy,
             "params": params, "next_token": {"has_next_token": i < busy}} for i in range(total)]


def _special(model: Any, token: int) -> str:
    """A special token's text ("" where the model has none)."""
    return model.piece(token).decode("utf-8", errors="replace") if token >= 0 else ""


def build_info() -> str:
    return f"llamaspec {_version('llamaspec')} (llama-cpp-python {_version('llama-cpp-python')})"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:  # run from a checkout on PYTHONPATH
        return "not installed"
