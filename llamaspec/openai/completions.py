"""llama-cpp-python's completion methods for a LlamaSpec: the same names, arguments and return
values (OpenAI's shapes: dicts, or iterators of chunk dicts with ``stream=True``), so a script
written for ``llama_cpp.Llama`` switches with one line. ``llamaspec serve`` is a thin layer over
them.

A grammar constrains the text (``requested_grammar``): OpenAI's ``response_format`` (``json_object``,
with llama-cpp-python's optional ``schema``, or ``json_schema``), llama-cpp-python's ``grammar``
(a LlamaGrammar or GBNF text) and llama-server's ``json_schema``; one that does not parse raises
GrammarError before anything is decoded. Penalties and logit biases shape every row the target
is verified at (llama.cpp's definitions); ``logprobs`` come from those rows; ``suffix`` asks for
the middle between the prompt and it (fill-in-the-middle); ``echo`` puts the prompt before the
text (with ``logprobs``, its tokens' log-probabilities too, the model reading the whole prompt
again with a row of logits per token). ``tools`` and ``tool_choice`` are OpenAI's (``tools.py``): the tools go through the model's
chat template, calls come back as ``tool_calls``. ``mirostat_mode`` samples with mirostat as
llama-cpp-python does (``mirostat``); ``logits_processor`` and ``stopping_criteria`` are asked once
per generated token, as plain decoding asks them; ``tfs_z`` is accepted and does nothing, as in
llama-cpp-python (llama.cpp no longer has tail-free sampling). OpenAI's deprecated ``functions``
and ``function_call`` are tools in an older shape. Responses also carry llama-server's ``timings`` object. ``n`` choices are n
samples decoded together; with a ``batcher`` (LlamaSpec.batcher) a request is decoded beside the
batcher's other requests. ``create_native`` and ``create_infill`` answer in llama-server's own
shape instead (its ``/completion`` and ``/infill``: ``content``, ``stop_type``, ``timings``...).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple, Union

from ..errors import ConfigError, GrammarError, shown
from ..constraints import Grammar
from .tools import (CallReader, Event, Tools, grammar_with, legacy_chunks, legacy_messages, legacy_reply, legacy_tools,
                    read as read_calls, template_tools, with_calls)
from ..engine.generation import Chunk, Result
from ..engine.scheduler import RequestStream, Stream, aggregate
from ..engine.stats import Stats
from ..sampling import TokenLogprob
from ..config import SamplingConfig

_S = SamplingConfig()

Response = Dict[str, Any]


class Tokens(Protocol):
    """What the completions read of a model's vocabulary (``llama.binding.Model``)."""

    add_bos: bool
    bos: int

    def piece(self, token: int) -> bytes: ...


class Generator(Protocol):
    """What the completions use of a LlamaSpec (or anything that generates as one does)."""

    model: Tokens
    model_name: str

    def tokenize(self, text: str, add_special: bool = True) -> List[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def fim_tokens(self, prefix: str, suffix: str, extra: Optional[Sequence[Dict[str, str]]] = None,
                   prompt: str = "") -> List[int]: ...

    def chat_template(self) -> Any: ...

    def chat_prompt(self, messages: Sequence[Dict[str, Any]], max_tokens: int = -1, trim: bool = True,
                    tools: Optional[Sequence[Any]] = None) -> Tuple[List[int], int]: ...

    def stream(self, prompt: Union[str, Sequence[int]], **options: Any) -> Stream: ...

    def sample_stream(self, prompt: Union[str, Sequence[int]], n: int, **options: Any) -> RequestStream: ...


def create_completion(spec: Generator, prompt: Union[str, List[int]], suffix: Optional[str] = None,
                      max_tokens: Optional[int] = 16, temperature: float = 0.8, top_p: float = 0.95,
                      min_p: float = 0.05, typical_p: float = 1.0, logprobs: Optional[int] = None, echo: bool = False,
                      stop: Optional[Union[str, List[str]]] = None, frequency_penalty: float = 0.0,
                      presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                      stream: bool = False, seed: Optional[int] = None, tfs_z: float = 1.0, mirostat_mode: int = 0,
                      mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: Optional[str] = None,
                      stopping_criteria: Any = None, logits_processor: Any = None, grammar: Any = None,
                      logit_bias: Optional[Dict[str, float]] = None, n: int = 1, response_format: Any = None,
                      json_schema: Any = None, batcher: Any = None, repeat_last_n: int = _S.penalty_last_n,
                      abandoned: Optional[threading.Event] = None,
                      sources: Optional[str] = None) -> Union[Response, Iterator[Response]]:
    """A completion of a raw prompt (tokenized as ``llamaspec generate`` does), as
    ``llama_cpp.Llama.create_completion`` returns it; with ``n`` > 1, n choices (samples decoded
    together, as OpenAI's ``n``). With a ``batcher`` (LlamaSpec.batcher) the request is decoded
    beside the batcher's other requests. ``response_format`` and ``json_schema``: as for chat
    (llama-server takes them for completions too). ``abandoned``: set when nobody waits for the
    answer any more (the server's client left, the server is shutting down); the generation stops
    at its next step and the answer (or the stream's last chunks) says what it had. ``sources``:
    the draft sources this request may use (``--spec``'s names: auto, none or a list of those
    loaded; None: auto). Each choice says where each of its tokens came from (``sources``)."""
    scored = echo and logprobs is not None
    if scored and suffix is not None:
        raise ConfigError("echo with logprobs and a suffix: the prompt read is the fill-in-the-middle layout, not the "
                          "echoed text; ask without the suffix or without echo")
    rules = requested_grammar(response_format, grammar, json_schema)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model or spec.model_name}
    echoed = ""
    if echo:
        echoed = prompt if isinstance(prompt, str) else spec.detokenize(prompt)
    if suffix is not None:
        if not isinstance(prompt, str):
            raise ConfigError("suffix needs a text prompt (the code before the gap), not tokens")
        prompt = spec.fim_tokens(prompt, suffix)
    opts = options(max_tokens, temperature, top_p, min_p, top_k, stop, seed, rules,
                   shaping(repeat_penalty, frequency_penalty, presence_penalty, repeat_last_n, logit_bias, typical_p),
                   mirostat(temperature, mirostat_mode, mirostat_tau, mirostat_eta))
    events = _start(spec, batcher, prompt, n, {**opts, "logprobs": logprobs, "echo": scored,
                                               "logits_processor": logits_processor,
                                               "stopping_criteria": stopping_criteria, "sources": sources})
    tokens = (spec.tokenize(prompt) if isinstance(prompt, str) else list(prompt)) if scored else []
    if stream:
        return _completion_chunks(spec, events, n, head, echoed, abandoned, tokens)
    results = _results(events, n, abandoned)
    return {**head, "choices": [{"text": echoed + r.text, "index": i,
                                 "logprobs": _text_logprobs(spec, r.logprobs, _echoed(spec, tokens, r.prompt_logprobs)),
                                 "finish_reason": finish_reason(r), "sources": r.sources}
                                for i, r in enumerate(results)], **_totals(results)}


def _completion_chunks(spec: Generator, events: "Events", n: int, head: Response, echoed: str = "",
                       abandoned: Optional[threading.Event] = None, tokens: Sequence[int] = ()) -> Iterator[Response]:
    """With ``tokens`` (the prompt's, echo with logprobs) each choice's echo comes with its first
    chunk, which carries the prompt's log-probabilities; else before any."""
    try:
        if echoed and not tokens:
            for i in range(n):
                yield {**head, "choices": [{"text": echoed, "index": i, "logprobs": None, "finish_reason": None}]}
        for i, chunk, totals in _read(events, n, abandoned):
            if tokens and chunk.prompt_logprobs:
                yield {**head, "choices": [{"text": echoed, "index": i, "finish_reason": None,
                                            "logprobs": _text_logprobs(spec, [], _echoed(spec, tokens,
                                                                                         chunk.prompt_logprobs))}]}
            logprobs = _text_logprobs(spec, chunk.logprobs) if chunk.logprobs else None
            if chunk.result is not None:
                yield {**head, "choices": [{"text": chunk.text, "index": i, "logprobs": logprobs,
                                            "finish_reason": finish_reason(chunk.result)}], **totals}
            elif chunk.text or logprobs or chunk.tokens:
                yield {**head, "choices": [{"text": chunk.text, "index": i, "logprobs": logprobs,
                                            "finish_reason": None, **provenance(chunk)}]}
    finally:
        events.close()  # a reader that stops early stops the generation


def create_infill(spec: Generator, input_prefix: str, input_suffix: str, input_extra: Sequence[Dict[str, str]] = (),
                  prompt: str = "", stream: bool = False, **arguments: Any) -> Union[Response, Iterator[Response]]:
    """llama-server's ``POST /infill``: the text between ``input_prefix`` (then ``prompt``) and
    ``input_suffix``, the project's other files (``input_extra``) read first; in llama-server's own
    response shape. Other arguments: create_native's."""
    tokens = spec.fim_tokens(input_prefix, input_suffix, list(input_extra), prompt)
    return create_native(spec, tokens, stream=stream, **arguments)


_MISSING = object()  # a field a reply lacks (_picked)
# The samplers llamaspec applies, in llama.cpp's names and order (see SamplingConfig).
SAMPLERS = ("penalties", "top_k", "typ_p", "top_p", "min_p", "temperature")


def create_native(spec: Generator, prompt: Union[str, Sequence[Union[int, str]]], n_predict: Optional[int] = None,
                  max_tokens: Optional[int] = None, stream: bool = False, return_tokens: bool = False,
                  n_probs: int = 0, response_fields: Optional[Sequence[str]] = None,
                  temperature: float = _S.temperature, top_p: float = _S.top_p, min_p: float = _S.min_p,
                  typical_p: float = _S.typical_p, top_k: int = _S.top_k, stop: Optional[Union[str, List[str]]] = None,
                  seed: Optional[int] = None, frequency_penalty: float = _S.frequency_penalty,
                  presence_penalty: float = _S.presence_penalty, repeat_penalty: float = _S.repeat_penalty,
                  repeat_last_n: int = _S.penalty_last_n, logit_bias: Any = None, mirostat_mode: int = _S.mirostat,
                  mirostat_tau: float = _S.mirostat_tau, mirostat_eta: float = _S.mirostat_eta, grammar: Any = None,
                  response_format: Any = None, json_schema: Any = None, model: Optional[str] = None, n: int = 1,
                  batcher: Any = None, abandoned: Optional[threading.Event] = None,
                  tfs_z: float = 1.0, sources: Optional[str] = None) -> Union[Response, Iterator[Response]]:
    """llama-server's ``POST /completion`` in its own shape (``content``, ``stop_type``,
    ``timings``...): ``prompt`` is text (tokenized as create_completion tokenizes it), token ids,
    or both mixed as llama-server reads them (``native_tokens``; a list of several strings, which
    llama-server reads as several prompts, is refused). ``n_predict`` (else
    ``max_tokens``, as llama-server falls back to it): -1 until a stop or a full context, 0 reads
    the prompt into the cache and generates nothing (what editors send to warm the cache). The
    reply's ``tokens`` are the generated ids with ``return_tokens`` (each streamed chunk has its
    own); ``n_probs`` > 0 adds each token's and its best alternatives' log-probabilities;
    ``response_fields`` keeps only those fields (``timings/prompt_n`` lifted to the top, as
    llama.vim asks). A stream is the chunks' text with their tokens, then a last chunk of
    ``stop: true`` with the totals and no text, as llama-server streams. Sampling arguments and
    ``sources``: create_completion's (``tfs_z`` does nothing there either). Each chunk's
    ``sources`` (beside its tokens) and the reply's say where each token came from."""
    if n != 1:
        raise ConfigError(f"is 1 (one completion a request), got {n}", "n")
    length = n_predict if n_predict is not None else max_tokens if max_tokens is not None else -1
    if length < -1:
        raise ConfigError(f"is -1 (until a stop or a full context) or a number of tokens, got {length}", "n_predict")
    rules = requested_grammar(response_format, grammar, json_schema)
    shaped = shaping(repeat_penalty, frequency_penalty, presence_penalty, repeat_last_n, logit_bias, typical_p)
    opts = {**options(None, temperature, top_p, min_p, top_k, stop, seed, rules, shaped,
                      mirostat(temperature, mirostat_mode, mirostat_tau, mirostat_eta)),
            "max_tokens": length, "logprobs": n_probs or None, "sources": sources}
    if not isinstance(prompt, str):
        if len(prompt) > 1 and all(isinstance(p, str) for p in prompt):  # llama-server's several prompts
            raise ConfigError("a list of strings is several prompts, which are not served: send one a request",
                              "prompt")
        prompt = native_tokens(spec.tokenize, prompt, add_special=True)
    events = _start(spec, batcher, prompt, 1, opts)
    reply = _Native(spec, prompt, opts, model or spec.model_name, 0 if batcher is None else -1, return_tokens,
                    response_fields)
    if stream:
        return reply.chunks(events, abandoned)
    return reply.final(_results(events, 1, abandoned)[0], streamed=False)


def native_tokens(tokenize: Any, items: Sequence[Union[int, str]], add_special: bool) -> List[int]:
    """A list of token ids and texts as llama-server reads a mixed prompt: each text's tokens
    (``tokenize(text, add_special)``; special tokens only for a text that comes first), each id
    as it is."""
    tokens: List[int] = []
    for i, item in enumerate(items):
        tokens += tokenize(item, add_special and i == 0) if isinstance(item, str) else [item]
    return tokens


class _Native:
    """The replies of one native completion: its streamed chunks, and its last reply."""

    def __init__(self, spec: Generator, prompt: Union[str, List[int]], opts: Dict[str, Any], model: str, slot: int,
                 return_tokens: bool, fields: Optional[Sequence[str]]) -> None:
        self.spec, self.opts, self.model, self.slot = spec, opts, model, slot
        self.return_tokens, self.fields = return_tokens, fields
        self.prompt = spec.tokenize(prompt) if isinstance(prompt, str) else prompt

    def chunks(self, events: "Events", abandoned: Optional[threading.Event]) -> Iterator[Response]:
        """Each chunk's text and tokens (``stop: false``), then the last reply without text."""
        done = 0
        try:
            for _, chunk in _until(events, abandoned):
                done += len(chunk.tokens)
                if chunk.text or chunk.tokens:
                    part = {"index": 0, "content": chunk.text, "tokens": list(chunk.tokens), "stop": False,
                            "id_slot": self.slot, "tokens_predicted": done, "tokens_evaluated": len(self.prompt),
                            **provenance(chunk)}
                    if chunk.logprobs:
                        part["completion_probabilities"] = _probabilities(self.spec, chunk.logprobs)
                    yield part
                if chunk.result is not None:
                    yield self.final(chunk.result, streamed=True)
        finally:
            events.close()  # a reader that stops early stops the generation

    def final(self, result: Result, streamed: bool) -> Response:
        """llama-server's last reply: in a stream without the text and tokens, which came before."""
        stats = result.stats
        settings = {**native_params(self.opts, streamed), "seed": -1 if stats.seed is None else stats.seed}
        reply = {"index": 0, "content": "" if streamed else result.text,
                 "tokens": list(result.tokens) if self.return_tokens and not streamed else [], "id_slot": self.slot,
                 "stop": True, "model": self.model, "tokens_predicted": len(result.tokens),
                 "tokens_evaluated": stats.n_prompt, "generation_settings": settings,
                 "prompt": self.spec.detokenize(self.prompt), "has_new_line": "\n" in result.text,
                 "truncated": result.stop_reason == "context", "stop_type": _stop_type(result),
                 "stopping_word": result.stop_string or "", "tokens_cached": _cached_after(result),
                 "timings": native_timings(stats), "sources": [] if streamed else result.sources,
                 "draft_sources": draft_sources(stats)}
        if result.logprobs and not streamed:
            reply["completion_probabilities"] = _probabilities(self.spec, result.logprobs)
        return _picked(reply, self.fields) if self.fields is not None else reply


def _cached_after(result: Result) -> int:
    """What the KV cache holds after the answer, as llama-server counts it: the prompt and every
    generated token but the last, which no decode has read yet."""
    return result.stats.n_prompt + max(len(result.tokens) - 1, 0)


def _stop_type(result: Result) -> str:
    """llama-server's: "word" (a stop string, named by ``stopping_word``), "eos" (the model ended
    the text, or its grammar did), else "limit" (n_predict, a full context, the server stopping)."""
    if result.stop_reason == "stop":
        return "word" if result.stop_string else "eos"
    return "limit"


def native_params(opts: Dict[str, Any], stream: bool = False) -> Response:
    """Generation options (``options``') by llama-server's names, as its ``generation_settings``
    and ``/props`` show them."""
    rules = opts.get("grammar")
    return {"n_predict": opts["max_tokens"], "max_tokens": opts["max_tokens"],
            "seed": -1 if opts.get("seed") is None else opts["seed"], "temperature": opts["temperature"],
            "top_k": opts["top_k"], "top_p": opts["top_p"], "min_p": opts["min_p"],
            "typical_p": opts.get("typical_p", _S.typical_p),
            "repeat_last_n": opts.get("penalty_last_n", _S.penalty_last_n),
            "repeat_penalty": opts.get("repeat_penalty", _S.repeat_penalty),
            "presence_penalty": opts.get("presence_penalty", _S.presence_penalty),
            "frequency_penalty": opts.get("frequency_penalty", _S.frequency_penalty),
            "mirostat": opts.get("mirostat", _S.mirostat), "mirostat_tau": opts.get("mirostat_tau", _S.mirostat_tau),
            "mirostat_eta": opts.get("mirostat_eta", _S.mirostat_eta), "stop": list(opts.get("stop", [])),
            "n_keep": 0, "ignore_eos": False, "stream": stream, "n_probs": opts.get("logprobs") or 0,
            "grammar": rules.text if isinstance(rules, Grammar) else "", "samplers": list(SAMPLERS)}


def native_timings(stats: Stats) -> Response:
    """``timings`` with llama-server's per-token figures too."""
    return {**timings(stats), "prompt_per_token_ms": 1000 * stats.t_prompt / max(stats.n_prompt_eval, 1),
            "predicted_per_token_ms": 1000 * stats.t_decode / max(stats.n_predict - stats.n_first, 1)}


def _probabilities(spec: Generator, logprobs: Sequence[TokenLogprob]) -> List[Response]:
    """llama-server's ``completion_probabilities``: each token's and its best alternatives'."""
    def entry(token: int, logprob: float) -> Response:
        piece = spec.model.piece(token)
        return {"id": token, "token": piece.decode("utf-8", errors="replace"), "bytes": list(piece), "logprob": logprob}
    return [{**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]} for lp in logprobs]


def _picked(reply: Response, fields: Sequence[str]) -> Response:
    """llama-server's ``response_fields``: only these, a nested one (``timings/prompt_n``) lifted to
    the top under its path; one the reply lacks left out."""
    picked = {}
    for path in fields:
        value: Any = reply
        for key in path.split("/"):
            value = value.get(key, _MISSING) if isinstance(value, dict) else _MISSING
        if value is not _MISSING:
            picked[path] = value
    return picked


def _text_logprobs(spec: Generator, logprobs: Optional[List[TokenLogprob]],
                   prompt: Sequence[Union[int, TokenLogprob]] = ()) -> Optional[Response]:
    """A completion's ``logprobs`` as OpenAI's legacy completions give them (tokens, their
    log-probabilities, the best tokens' at each and each token's offset in the text). ``prompt``
    (echo): the prompt's tokens first, each as its TokenLogprob, or its id where it has none
    (the first: null, as OpenAI gives it)."""
    if logprobs is None:
        return None
    entries = [*prompt, *logprobs]
    tokens = [_piece(spec, e if isinstance(e, int) else e.token) for e in entries]
    offsets = [0]
    for token in tokens[:-1]:
        offsets.append(offsets[-1] + len(token))
    return {"tokens": tokens, "token_logprobs": [None if isinstance(e, int) else e.logprob for e in entries],
            "top_logprobs": [None if isinstance(e, int) else {_piece(spec, t): v for t, v in e.top} for e in entries],
            "text_offset": offsets}


def _echoed(spec: Generator, tokens: Sequence[int], logprobs: Optional[List[TokenLogprob]]) -> List[Union[int, TokenLogprob]]:
    """The echoed prompt's entries for _text_logprobs: its ``tokens`` (a leading BOS left out, as
    llama-cpp-python leaves it out of the echoed text), the first as its id alone, the others with
    their ``logprobs`` (``logprobs[i]`` is ``tokens[i + 1]``'s)."""
    if not tokens or logprobs is None:
        return []
    skip = 1 if spec.model.add_bos and tokens[0] == spec.model.bos and len(tokens) > 1 else 0
    return [tokens[skip], *logprobs[skip:]]


def _chat_logprobs(spec: Generator, logprobs: Optional[List[TokenLogprob]]) -> Optional[Response]:
    """A chat choice's ``logprobs`` as OpenAI gives them: per token, its text, bytes,
    log-probability and the best tokens'."""
    if logprobs is None:
        return None

    def entry(token: int, logprob: float) -> Response:
        return {"token": _piece(spec, token), "logprob": logprob, "bytes": list(spec.model.piece(token))}
    return {"content": [{**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                        for lp in logprobs]}


def _piece(spec: Generator, token: int) -> str:
    return spec.model.piece(token).decode("utf-8", errors="replace")


def create_chat_completion(spec: Generator, messages: Sequence[Dict[str, Any]], functions: Any = None,
                           function_call: Any = None, tools: Any = None, tool_choice: Any = None,
                           temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
                           typical_p: float = 1.0, stream: bool = False, stop: Optional[Union[str, List[str]]] = None,
                           seed: Optional[int] = None, response_format: Any = None, max_tokens: Optional[int] = None,
                           presence_penalty: float = 0.0, frequency_penalty: float = 0.0, repeat_penalty: float = 1.0,
                           tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                           mirostat_eta: float = 0.1, model: Optional[str] = None, logits_processor: Any = None,
                           grammar: Any = None, logit_bias: Optional[Dict[str, float]] = None,
                           logprobs: Optional[bool] = None, top_logprobs: Optional[int] = None,
                           trim: bool = False, n: int = 1, json_schema: Any = None, batcher: Any = None,
                           repeat_last_n: int = _S.penalty_last_n, abandoned: Optional[threading.Event] = None,
                           sources: Optional[str] = None) -> Union[Response, Iterator[Response]]:
    """A reply to chat messages, rendered with the model's own chat template, as
    ``llama_cpp.Llama.create_chat_completion`` returns it (``n`` and ``batcher``: as in
    create_completion). A conversation longer than the context raises PromptError, unless
    ``trim`` leaves its oldest turns out. ``response_format``, ``grammar`` and ``json_schema``
    (llama-server's field) constrain the reply (see ``requested_grammar``). ``tools`` and
    ``tool_choice``: OpenAI's (see tools.py); a reply with calls has ``tool_calls`` and finish
    reason "tool_calls"; with OpenAI's deprecated ``functions`` and ``function_call`` instead, the
    same calls in their older shapes (``function_call``, finish reason "function_call"; see
    tools.legacy_tools). ``abandoned`` and ``sources``: as in create_completion; each choice's
    ``sources`` (and each streamed chunk's, with its ``pieces``) say where its tokens came from."""
    legacy = functions is not None or function_call is not None
    tools, tool_choice = _tools(tools, tool_choice, functions, function_call)
    messages = legacy_messages(messages)
    if top_logprobs is not None and not logprobs:
        raise ConfigError("top_logprobs needs logprobs: true")
    opts = options(max_tokens, temperature, top_p, min_p, top_k, stop, seed,
                   requested_grammar(response_format, grammar, json_schema),
                   shaping(repeat_penalty, frequency_penalty, presence_penalty, repeat_last_n, logit_bias, typical_p),
                   mirostat(temperature, mirostat_mode, mirostat_tau, mirostat_eta))
    opts["logprobs"] = (top_logprobs or 0) if logprobs else None
    opts["logits_processor"] = logits_processor
    opts["sources"] = sources
    run = start_chat(spec, messages, tools, tool_choice, opts, trim, n, batcher)
    events, names = run.events, run.names
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model or spec.model_name}
    if stream:
        chunks = _chat_chunks(spec, events, n, head, abandoned, names)
        return legacy_chunks(chunks) if legacy else chunks
    results = _results(events, n, abandoned)
    replies = [_reply(r.text, names) for r in results]
    response = {**head, "object": "chat.completion",
                "choices": [{"index": i, "message": replies[i], "logprobs": _chat_logprobs(spec, r.logprobs),
                             "finish_reason": "tool_calls" if "tool_calls" in replies[i] else finish_reason(r),
                             "sources": r.sources}
                            for i, r in enumerate(results)], **_totals(results)}
    return legacy_reply(response) if legacy else response


@dataclass
class ChatRun:
    """A chat reply under way: its ``events``, the ``names`` of the tools its text is read for
    calls of (None: the reply is plain text) and its prompt's length in tokens."""

    events: "Events"
    names: Optional[List[str]]
    n_prompt: int


def start_chat(spec: Generator, messages: Sequence[Dict[str, Any]], tools: Any, tool_choice: Any,
               opts: Dict[str, Any], trim: bool = False, n: int = 1, batcher: Any = None) -> ChatRun:
    """Starts the reply to chat ``messages`` (OpenAI's shapes, tool calls and results included)
    with ``tools`` and ``tool_choice`` (OpenAI's) and generation options ``opts`` (``options``);
    a choice of calls replaces ``opts``' grammar by the calls' (ConfigError for both). Every API
    that chats (OpenAI's chat completions and Responses, Anthropic's Messages) starts here."""
    called = Tools.of(tools, tool_choice)
    opts = {**opts, "grammar": grammar_with(called, opts.get("grammar"))}
    tokens = chat_tokens(spec, messages, called, opts["max_tokens"], trim)
    names = called.names if called is not None and called.calls else None
    return ChatRun(_start(spec, batcher, tokens, n, opts), names, len(tokens))


def chat_tokens(spec: Generator, messages: Sequence[Dict[str, Any]], called: Optional[Tools],
                max_tokens: int = -1, trim: bool = False) -> List[int]:
    """The prompt of chat ``messages`` with the tools ``called`` (Tools.of), rendered with the
    model's template (PromptError where it leaves no room for ``max_tokens``, unless ``trim``)."""
    chat = [with_calls(m, _text_message(m)) for m in messages]
    shown = template_tools(spec.chat_template(), called, chat)
    return spec.chat_prompt(chat, max_tokens, trim, tools=shown)[0]


def reply_events(run: ChatRun, abandoned: Optional[threading.Event] = None) -> Iterator[Tuple[str, Any]]:
    """A one-choice reply as it comes: ("content", text), ("call", an OpenAI call) and last
    ("end", its Result), text read for calls where the run has tools to call."""
    reader = CallReader(run.names) if run.names is not None else None
    try:
        for _, chunk, _ in _read(run.events, 1, abandoned):
            yield from _text_events(reader, chunk)
            if chunk.result is not None:
                yield "end", chunk.result
    finally:
        run.events.close()  # a reader that stops early stops the generation


def _reply(text: str, names: Optional[List[str]]) -> Response:
    """The assistant's message: its text, or with tools to call, its calls and the text around them."""
    if names is None:
        return {"role": "assistant", "content": text}
    content, calls = read_calls(text, names)
    if not calls:
        return {"role": "assistant", "content": content or ""}
    return {"role": "assistant", "content": content, "tool_calls": calls}


def _chat_chunks(spec: Generator, events: "Events", n: int, head: Response, abandoned: Optional[threading.Event] = None,
                 names: Optional[List[str]] = None) -> Iterator[Response]:
    """The chunks of a chat reply; with ``names`` (tools to call), each choice's text is read for
    calls, which come as OpenAI streams them: their id and name, then their arguments. A chunk's
    tokens' log-probabilities, when asked for, come with its first delta."""
    head = {**head, "object": "chat.completion.chunk"}
    readers = [CallReader(names) if names is not None else None for _ in range(n)]
    calls = [0] * n
    try:
        for i in range(n):
            yield {**head, "choices": [{"index": i, "delta": {"role": "assistant"}, "logprobs": None,
                                        "finish_reason": None}]}
        for i, chunk, totals in _read(events, n, abandoned):
            deltas, calls[i] = _deltas(readers[i], chunk, calls[i])
            logprobs = _chat_logprobs(spec, chunk.logprobs) if chunk.logprobs else None
            if (logprobs is not None or (chunk.tokens and readers[i] is None)) and not deltas:
                deltas = [{"content": ""}]
            origin = provenance(chunk, readers[i] is None)
            for k, delta in enumerate(deltas):
                yield {**head, "choices": [{"index": i, "delta": delta, "logprobs": None if k else logprobs,
                                            "finish_reason": None, **({} if k else origin)}]}
            if chunk.result is not None:
                reason = "tool_calls" if calls[i] else finish_reason(chunk.result)
                yield {**head, "choices": [{"index": i, "delta": {}, "logprobs": None, "finish_reason": reason}],
                       **totals}
    finally:
        events.close()  # a reader that stops early stops the generation


def provenance(chunk: Chunk, pieces: bool = True) -> Response:
    """A streamed chunk's extra fields, which OpenAI's clients ignore: ``sources``, where each of
    its tokens came from ("plain": the target's own choice, else the draft source whose
    candidate it accepted), and with ``pieces`` the text each token released (joined: the
    chunk's text, where it is not read for tool calls)."""
    return {"sources": chunk.sources, "pieces": chunk.pieces} if pieces else {"sources": chunk.sources}


def _text_events(reader: Optional[CallReader], chunk: Chunk) -> List[Event]:
    """A chunk's text as ("content", text) and ("call", call) events: read for calls by
    ``reader`` (what it held back comes with the last chunk), or as it is without one."""
    if reader is None:
        return [("content", chunk.text)] if chunk.text else []
    read = reader.feed(chunk.text) if chunk.text else []
    return read + reader.finish() if chunk.result is not None else read


def _deltas(reader: Optional[CallReader], chunk: Chunk, done: int) -> Tuple[List[Response], int]:
    """A chunk's deltas (its text, or read by ``reader``, content and calls) and the number of
    calls so far (``done`` before it)."""
    deltas: List[Response] = []
    for kind, value in _text_events(reader, chunk):
        if kind == "content":
            deltas.append({"content": value})
            continue
        function = value["function"]
        deltas += [{"tool_calls": [{"index": done, "id": value["id"], "type": "function",
                                    "function": {"name": function["name"], "arguments": ""}}]},
                   {"tool_calls": [{"index": done, "function": {"arguments": function["arguments"]}}]}]
        done += 1
    return deltas, done


class _One:
    """One generation on the LlamaSpec's own context as the events of a one-sample request."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[Tuple[int, Chunk]]:
        return ((0, chunk) for chunk in self.stream)

    def stop(self) -> None:
        self.stream.stop()

    def close(self) -> None:
        self.stream.close()


Events = Union[_One, RequestStream]


def _start(spec: Generator, batcher: Any, prompt: Union[str, List[int]], n: int, opts: Dict[str, Any]) -> Events:
    """One choice on the LlamaSpec's own context (with every source it has), or n samples decoded
    together: on the LlamaSpec's context, or through ``batcher`` beside other requests."""
    if n == 1 and batcher is None:
        return _One(spec.stream(prompt, **opts))
    return (batcher or spec).sample_stream(prompt, n, **opts)


def _read(events: Events, n: int, abandoned: Optional[threading.Event] = None) -> Iterator[Tuple[int, Chunk, Response]]:
    """(choice, chunk, totals): totals (usage and timings of every choice) with the last choice's
    last chunk, else empty. Once ``abandoned`` is set, the generation stops at its next step and
    each choice's last chunk still comes (stop reason "interrupted")."""
    results: List[Optional[Result]] = [None] * n
    for i, chunk in _until(events, abandoned):
        totals: Response = {}
        if chunk.result is not None:
            results[i] = chunk.result
            if all(r is not None for r in results):
                totals = _totals([r for r in results if r is not None])
        yield i, chunk, totals


def _results(events: Events, n: int, abandoned: Optional[threading.Event] = None) -> List[Result]:
    """Every choice's result; once ``abandoned`` is set, what each had (stop reason "interrupted")."""
    results: List[Optional[Result]] = [None] * n
    try:
        for i, chunk in _until(events, abandoned):
            if chunk.result is not None:
                results[i] = chunk.result
    finally:
        events.close()
    return [r for r in results if r is not None]


def _until(events: Events, abandoned: Optional[threading.Event]) -> Iterator[Tuple[int, Chunk]]:
    """``events``; once ``abandoned`` is set (nobody waits for the answer, the server is shutting
    down), the generation stops at its next step and the remaining last chunks are read."""
    stopped = False
    for event in events:
        yield event
        if abandoned is not None and abandoned.is_set() and not stopped:
            events.stop()
            stopped = True


def _totals(results: Sequence[Result]) -> Response:
    """The response's usage (the prompt counted once) and llama-server's timings, summed over choices."""
    stats = results[0].stats if len(results) == 1 else aggregate(results)
    prompt, completion = stats.n_prompt, sum(len(r.tokens) for r in results)
    return {"usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                      "prompt_tokens_details": {"cached_tokens": cached(stats)}},
            "timings": timings(stats), "draft_sources": draft_sources(stats)}


def draft_sources(stats: Stats) -> Dict[str, Dict[str, int]]:
    """Each draft source's figures (an extra of the replies): its candidate tokens verified
    (``drafted``), of those accepted, and the target decodes that verified its candidates."""
    return {name: {"drafted": s.drafted, "accepted": s.accepted, "steps": s.steps}
            for name, s in sorted(stats.sources.items())}


def cached(stats: Stats) -> int:
    """The prompt's tokens reused from the KV cache, not read again."""
    return stats.n_prompt - stats.n_prompt_eval


def _text_message(message: Dict[str, Any]) -> Dict[str, str]:
    """A message whose content is text, or a list of text parts (OpenAI's content parts)."""
    if not isinstance(message, dict) or "role" not in message:
        raise ConfigError(f"a message needs a role: {shown(message)}")
    content = message.get("content")
    if content is None:
        content = ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ConfigError("only text content parts are supported")
            parts.append(part["text"])
        content = "".join(parts)
    if not isinstance(content, str):
        raise ConfigError(f"a message's content must be text, got {type(content).__name__}")
    return {"role": str(message["role"]), "content": content}


def options(max_tokens: Optional[int], temperature: float, top_p: float, min_p: float, top_k: int,
            stop: Optional[Union[str, List[str]]], seed: Optional[int], grammar: Optional[Grammar] = None,
            shaping: Optional[Dict[str, Any]] = None, sampler: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """llama-cpp-python's arguments as llamaspec's generation options (max_tokens None or <= 0:
    until a stop or the end of the context); ``shaping``: penalties, biases and typical-p
    (``shaping``); ``sampler``: mirostat's (``mirostat``)."""
    return {"max_tokens": -1 if max_tokens is None or max_tokens <= 0 else max_tokens, "temperature": temperature,
            "top_p": top_p, "min_p": min_p, "top_k": top_k, "stop": [stop] if isinstance(stop, str) else (stop or []),
            "seed": seed, "grammar": grammar, **(shaping or {}), **(sampler or {})}


def mirostat(temperature: float, mode: int, tau: float, eta: float) -> Dict[str, Any]:
    """llama-cpp-python's mirostat as generation options: its chain has no temperature before
    mirostat (a temperature above 0 only says "sample"), where llama.cpp's programs divide by it
    first, so the temperature is 1 here."""
    if not mode:
        return {}
    return {"mirostat": mode, "mirostat_tau": tau, "mirostat_eta": eta, "temperature": 1.0 if temperature > 0 else temperature}


def shaping(repeat_penalty: float, frequency_penalty: float, presence_penalty: float, repeat_last_n: int,
            logit_bias: Any, typical_p: float) -> Dict[str, Any]:
    """The penalties, logit biases and typical-p of a request as generation options (llama.cpp's
    definitions, llama-server's ``repeat_last_n`` window)."""
    return {"repeat_penalty": repeat_penalty, "frequency_penalty": frequency_penalty,
            "presence_penalty": presence_penalty, "penalty_last_n": repeat_last_n, "logit_bias": logit_bias,
            "typical_p": typical_p}


def _tools(tools: Any, tool_choice: Any, functions: Any, function_call: Any) -> Tuple[Any, Any]:
    """A request's tools and tool_choice, or those its deprecated functions and function_call give."""
    if functions is None and function_call is None:
        return tools, tool_choice
    if tools is not None or tool_choice is not None:
        raise ConfigError("give tools and tool_choice, or the deprecated functions and function_call, not both")
    return legacy_tools(functions, function_call)


def grammar_asked(arguments: Dict[str, Any], chat: bool) -> Optional[Grammar]:
    """The grammar the text of a request with ``arguments`` (those of create_chat_completion,
    ``chat``, or create_completion) follows, as they find it: a server compiles it before the
    request takes its turn."""
    asked = requested_grammar(arguments.get("response_format"), arguments.get("grammar"), arguments.get("json_schema"))
    if not chat:
        return asked
    tools, choice = _tools(arguments.get("tools"), arguments.get("tool_choice"), arguments.get("functions"),
                           arguments.get("function_call"))
    return grammar_with(Tools.of(tools, choice), asked)


def requested_grammar(response_format: Any = None, grammar: Any = None, json_schema: Any = None) -> Optional[Grammar]:
    """The grammar a request asks for, if any: OpenAI's ``response_format`` (``{"type": "text"}``,
    ``{"type": "json_object"}`` with llama-cpp-python's optional ``"schema"``, or ``{"type":
    "json_schema", "json_schema": {"name": ..., "schema": {...}}}``), llama-cpp-python's ``grammar``
    (a LlamaGrammar or GBNF text) or llama-server's ``json_schema``. GrammarError for one that does
    not parse or for more than one."""
    asked = [g for g in (_response_format(response_format),
                         Grammar.of(grammar, "grammar") if grammar is not None else None,
                         Grammar.json_schema(json_schema, "json_schema") if json_schema is not None else None)
             if g is not None]
    if len(asked) > 1:
        raise GrammarError("give one of response_format, grammar and json_schema, not several")
    return asked[0] if asked else None


def _response_format(value: Any) -> Optional[Grammar]:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise GrammarError(f"response_format is an object such as {{\"type\": \"json_object\"}}, got {shown(value)}")
    kind = value.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = value.get("schema")
        return Grammar.json_schema(schema, "response_format.schema") if schema is not None else Grammar.json()
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None:
            raise GrammarError('response_format json_schema needs "json_schema": {"name": ..., "schema": {...}}')
        return Grammar.json_schema(schema, "response_format.json_schema.schema")
    raise GrammarError(f"response_format type {shown(kind)} is not one of text, json_object, json_schema")


def finish_reason(result: Result) -> str:
    return "stop" if result.stop_reason == "stop" else "length"


def timings(s: Stats) -> Dict[str, float]:
    """llama-server's figures: prompt tokens reused from the cache and evaluated now, generated
    tokens, drafted and accepted; and llamaspec's ``llama_ms``: of ``predicted_ms``, the time its
    models spent in llama_decode (the rest is the host's own)."""
    return {"cache_n": cached(s), "prompt_n": s.n_prompt_eval, "prompt_ms": 1000 * s.t_prompt, "prompt_per_second": s.prompt_tps,
            "predicted_n": s.n_predict, "predicted_ms": 1000 * s.t_decode, "predicted_per_second": s.decode_tps,
            "draft_n": s.n_drafted, "draft_n_accepted": s.n_accept, "llama_ms": 1000 * s.t_llama}
