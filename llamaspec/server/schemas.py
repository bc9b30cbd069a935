"""The request bodies of the OpenAI endpoints, as pydantic models: what each field may hold.

Unknown fields are ignored, and so is ``tfs_z``, as llama-cpp-python's server ignores it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict, Field

from ..config import MAX_LOGPROBS, SamplingConfig

_S = SamplingConfig()

# What a field of several shapes holds, for a message that says so (pydantic's names the last
# shape it tried: "logit_bias.dict[str,union[bool,float]].100.bool: Input should be a valid boolean").
SHAPES = {
    "logit_bias": 'an object of token ids to numbers (false bans the token), or a list of [token id, number] pairs',
    "stop": "a string or a list of strings",
    "prompt": "a string or a list of token ids",
}


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    arguments: Union[str, Dict[str, Any], None] = None  # OpenAI's JSON text; an object is taken too


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: ToolFunction


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, List[TextPart], None] = None
    tool_calls: Optional[List[ToolCall]] = None  # an assistant's past calls
    tool_call_id: Optional[str] = None  # a tool result's call
    name: Optional[str] = None

    def message(self) -> Dict[str, Any]:
        """The message as ``create_chat_completion`` takes it (without the fields it does not have)."""
        return self.model_dump(exclude_none=True)


class StreamOptions(BaseModel):
    include_usage: bool = False


class Sampling(BaseModel):
    """What both endpoints share. Defaults are llamaspec's (those of ``llamaspec generate``)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: Optional[str] = None
    temperature: float = Field(_S.temperature, ge=0, le=2)
    top_p: float = Field(_S.top_p, gt=0, le=1)
    top_k: int = Field(_S.top_k, ge=0)  # llama.cpp's extension
    min_p: float = Field(_S.min_p, ge=0, le=1)  # llama.cpp's extension
    typical_p: float = Field(_S.typical_p, gt=0, le=1)  # llama.cpp's extension
    seed: Optional[int] = Field(None, ge=-1, lt=2**63)
    stop: Union[str, List[str], None] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: int = Field(1, ge=1)
    frequency_penalty: float = _S.frequency_penalty
    presence_penalty: float = _S.presence_penalty
    repeat_penalty: float = Field(_S.repeat_penalty, gt=0)  # llama.cpp's extension
    repeat_last_n: int = Field(_S.penalty_last_n, ge=-1)  # llama.cpp's extension
    # OpenAI's {"token id": bias}, or llama-server's [[token id, bias], ...]; false bans the token
    logit_bias: Union[Dict[str, Union[bool, float]], List[Tuple[int, Union[bool, float]]], None] = None
    # the text's constraint: OpenAI's response_format, llama-server's grammar (GBNF) and json_schema
    response_format: Optional[Dict[str, Any]] = None
    grammar: Optional[str] = None
    json_schema: Optional[Dict[str, Any]] = None
    # mirostat as llama-cpp-python's server samples with it (no temperature before it)
    mirostat: int = Field(_S.mirostat, ge=0, le=2)  # llama-server's name
    mirostat_mode: int = Field(_S.mirostat, ge=0, le=2)  # llama-cpp-python's
    mirostat_tau: float = _S.mirostat_tau
    mirostat_eta: float = _S.mirostat_eta
    # llamaspec's: the draft sources this request may use, as --spec names them (auto, none, a list)
    spec: Optional[str] = None

    def sampling(self) -> Dict[str, Any]:
        """The arguments of ``create_completion`` / ``create_chat_completion`` these fields give."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
                "typical_p": self.typical_p,
                "seed": self.seed, "stop": self.stop, "frequency_penalty": self.frequency_penalty,
                "presence_penalty": self.presence_penalty, "repeat_penalty": self.repeat_penalty,
                "repeat_last_n": self.repeat_last_n, "logit_bias": self.logit_bias, "model": self.model,
                "response_format": self.response_format, "grammar": self.grammar, "json_schema": self.json_schema,
                "mirostat_mode": self.mirostat_mode or self.mirostat, "mirostat_tau": self.mirostat_tau,
                "mirostat_eta": self.mirostat_eta, "sources": self.spec}


class ChatRequest(Sampling):
    messages: List[Message] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    tools: Optional[List[Any]] = None
    tool_choice: Optional[Any] = None
    functions: Optional[List[Any]] = None  # OpenAI's deprecated form of tools
    function_call: Optional[Any] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)

    def arguments(self) -> Dict[str, Any]:
        return {**self.sampling(), "messages": [m.message() for m in self.messages],
                "max_tokens": self.max_completion_tokens or self.max_tokens, "tools": self.tools,
                "tool_choice": self.tool_choice, "functions": self.functions, "function_call": self.function_call,
                "logprobs": self.logprobs, "top_logprobs": self.top_logprobs}


class ExtraFile(BaseModel):
    text: str
    filename: str = "tmp"


class InfillRequest(Sampling):
    """llama-server's /infill: the code before and after the gap, other files of the project."""

    input_prefix: str
    input_suffix: str
    input_extra: List[ExtraFile] = []
    prompt: str = ""
    n_predict: int = Field(-1, ge=-1)  # llama-server's name; -1: until the model ends the middle
    max_tokens: Optional[int] = Field(None, ge=1)

    def arguments(self) -> Dict[str, Any]:
        return {**self.sampling(), "input_prefix": self.input_prefix, "input_suffix": self.input_suffix,
                "input_extra": [f.model_dump() for f in self.input_extra], "prompt": self.prompt,
                "max_tokens": self.max_tokens or self.n_predict}


class CompletionRequest(Sampling):
    prompt: Union[str, List[int]]
    max_tokens: Optional[int] = Field(16, ge=1)  # null: OpenAI's default, 16
    echo: bool = False
    suffix: Optional[str] = None
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)

    def arguments(self) -> Dict[str, Any]:
        max_tokens = 16 if self.max_tokens is None else self.max_tokens
        return {**self.sampling(), "prompt": self.prompt, "max_tokens": max_tokens, "echo": self.echo,
                "suffix": self.suffix, "logprobs": self.logprobs}
