"""The public Python API: load a target (and a draft), then generate, stream or chat."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .assembly import MAX_SAMPLES, Assembly
from .llama.binding import Model
from .llama.pool import ModelPool
from .llama.chat import ChatTemplate, Message, fit
from .llama import infill
from .openai import completions
from .llama import hub, models
from .sources import installed_registry
from .sources.registry import Registry
from .config import ModelConfig, SpecConfig, prompt_bytes
from .errors import ConfigError, LlamaspecError, PromptError
from .constraints import Grammar
from .engine.engine import Engine, check_prompt
from .engine.scheduler import Request, RequestStream, Stream
from .engine.batcher import Batcher
from .engine.generation import Result, last, make_config

Prompt = Union[str, Sequence[int]]


class LlamaSpec:
    """A target model, optionally a draft model, their KV caches and the draft sources.

    ``spec`` chooses the sources (a SpecConfig or its text, as ``--spec`` takes it; default auto:
    every one the loaded models and files allow) among the ``registry``'s (default: the built-in
    sources). ``settings``: the sources' settings by keyword (``lookahead_w=8``, as ``load``
    takes them), or a source's whole config by its name (``{"lookahead": LookaheadConfig(...)}``);
    ``references`` are texts lookup and lookahead may copy from. The caches persist between
    calls: a prompt that extends the previous one (the next turn of a chat) evaluates only its
    new tokens. LlamaSpecs given the same ``pool`` share the weights of the models they both load.
    """

    def __init__(self, target: ModelConfig, draft: Optional[ModelConfig] = None, *,
                 settings: Optional[Mapping[str, Any]] = None, cache_dir: Optional[Path] = None,
                 progress: bool = True, references: Sequence[str] = (), spec: Union[SpecConfig, str] = SpecConfig(),
                 pool: Optional[ModelPool] = None, registry: Optional[Registry] = None) -> None:
        self.target_config = target
        self._lock = threading.RLock()
        self._active: Optional[Union[Stream, RequestStream]] = None
        self._closed = False
        self._batchers: List[Batcher] = []
        spec = SpecConfig.parse(spec) if isinstance(spec, str) else spec
        self._parts = Assembly(target, draft, settings, cache_dir, progress, references, spec, pool, registry)
        self.registry, self.spec_name = self._parts.registry, self._parts.spec_name
        self.model, self.ctx = self._parts.model, self._parts.ctx
        self._restart()
        self._template: Optional[ChatTemplate] = None

    @property
    def draft_model(self) -> Optional[Model]:
        """The draft model, where one is loaded."""
        return next(iter(self._parts.draft_models), None)

    def _restart(self) -> None:
        """Empty caches, fresh sources, acceptance model and planner (the cost model lives on)."""
        self._scheduler = self._parts.scheduler()
        self.engine: Engine = self._scheduler.engine

    def tokenize(self, text: str, add_special: bool = True) -> List[int]:
        """Tokens of raw text with special tokens parsed, as llama.cpp's programs tokenize a prompt."""
        self._check_open()
        return self.model.tokenize(_utf8(text, "the text"), add_special=add_special, parse_special=True)

    def detokenize(self, tokens: Sequence[int]) -> str:
        self._check_open()
        return self.model.detokenize(tokens)

    def format_chat(self, messages: Sequence[Message], tools: Optional[Sequence[Any]] = None) -> str:
        """The prompt text of chat messages (and OpenAI's ``tools``) with the model's own template."""
        return self.chat_template().render(messages, tools)

    def chat_template(self) -> ChatTemplate:
        """The model's chat template (ConfigError for a model without one)."""
        self._check_open()
        if self._template is None:
            self._template = ChatTemplate(self.model)
        return self._template

    # --- generation ---------------------------------------------------------------------
    # One LlamaSpec decodes one sequence at a time: every call holds the lock, so calls from
    # several threads run one after the other. A generation that starts while an earlier
    # stream is unfinished closes that stream (reading it again raises StreamClosedError).

    def generate(self, prompt: Prompt, n: int = 1, **options: Any) -> Any:
        """Generate from raw text (or tokens). Options: max_tokens, stop, temperature, top_k,
        top_p, min_p, seed. With ``n`` > 1, a list of n samples decoded together (sample i
        uses seed + i), which draft from each other; n > 1 needs a temperature above 0."""
        if n == 1:
            with self._lock:
                return last(self.stream(prompt, **options))
        return self.samples(prompt, n, **options)

    def samples(self, prompt: Prompt, n: int, **options: Any) -> List[Result]:
        """``n`` samples of one prompt decoded together in every llama_decode (see generate)."""
        with self._lock:
            stream = self.sample_stream(prompt, n, **options)
            for _ in stream:
                pass
            return stream.results

    def sample_stream(self, prompt: Prompt, n: int, **options: Any) -> RequestStream:
        """(sample index, Chunk) as ``n`` samples of one prompt decoded together accept text;
        each sample's last chunk carries its Result. The samples run on this LlamaSpec's
        context, so, like a Stream, this one is closed when another generation starts."""
        config = make_config(**options)
        request = Request(self._prompt_tokens(prompt), config, n, self._strategy(config))  # bad n: before any decoding
        if n > MAX_SAMPLES:
            raise ConfigError(f"at most {MAX_SAMPLES} samples at once, got {n}")
        with self._lock:
            self._active = self._submit(request)
            return self._active

    def _submit(self, request: Request) -> RequestStream:
        """``request`` on this LlamaSpec's engine, read (and stepped) under its lock."""
        with self._lock:
            self._check_open()
            if not request.prompt:
                raise PromptError("the prompt is empty")
            check_prompt(len(request.prompt), self.ctx.n_ctx)
            self._close_active("another generation started on the same LlamaSpec")
            self._scheduler.submit(request)
            return RequestStream(request, self._scheduler.cancel, self._scheduler.step, lock=self._lock)

    def batcher(self, parallel: int) -> Batcher:
        """Requests from any thread decoded together, up to ``parallel`` sequences at once, each
        with this LlamaSpec's context size, on a context of their own (see batcher.py), and, with a
        draft model, on a draft context of their own. Their sources: this LlamaSpec's, and
        between samples of one request, consensus. Closed with this LlamaSpec at the latest."""
        with self._lock:
            self._check_open()
            batcher = self._parts.batcher(parallel, self._prompt_tokens)
            self._batchers.append(batcher)
            return batcher

    def chat(self, messages: Sequence[Message], trim: bool = True, **options: Any) -> Result:
        """Reply to chat messages, formatted with the model's own template (see chat_stream)."""
        with self._lock:
            return last(self.chat_stream(messages, trim, **options))

    def chat_stream(self, messages: Sequence[Message], trim: bool = True, **options: Any) -> Stream:
        """Stream a reply to chat messages. When the conversation does not fit the context with
        room for the reply, the oldest turns are left out (never the system message) and the
        result says how many (``dropped_turns``); with ``trim=False`` a PromptError is raised
        instead."""
        config = make_config(**options)
        with self._lock:
            tokens, dropped = self.chat_prompt(messages, config.max_tokens, trim)
            return self._start(tokens, config, dropped)

    def chat_prompt(self, messages: Sequence[Message], max_tokens: int = -1, trim: bool = True,
                    tools: Optional[Sequence[Any]] = None) -> Tuple[List[int], int]:
        """The tokens of chat messages (and OpenAI's ``tools``) as a prompt, and how many of the
        oldest turns were left out so that it fits the context with room for the reply (see
        chat_stream)."""
        with self._lock:
            self._check_open()
            room = self.ctx.n_ctx - reply_room(max_tokens, self.ctx.n_ctx)
            kept, dropped = fit(messages, lambda m: len(self._chat_tokens(m, tools)), room)
            if dropped and not trim:
                raise PromptError(f"the conversation does not fit the {self.ctx.n_ctx}-token context with room for "
                                  f"the reply; {dropped} of its oldest turns would have to go")
            return self._chat_tokens(kept, tools), dropped

    def _chat_tokens(self, messages: Sequence[Message], tools: Optional[Sequence[Any]] = None) -> List[int]:
        for m in messages:
            self._fits(_utf8(str(m.get("content", "")), f"the {m.get('role', '')} message"),
                       f"the {m.get('role', '')} message")
        return self.model.tokenize(self.format_chat(messages, tools), add_special=False, parse_special=True)

    def fim_tokens(self, prefix: str, suffix: str, extra: Optional[Sequence[Dict[str, str]]] = None,
                   prompt: str = "") -> List[int]:
        """The prompt that asks for the text between ``prefix`` and ``suffix`` with the model's
        fill-in-the-middle tokens: as llama-cpp-python's ``create_completion(suffix=...)`` lays it
        out or, with ``extra`` (other files, {"filename", "text"}; may be empty) and ``prompt``, as
        llama-server's /infill does (see llama/infill.py). ConfigError for a model without them."""
        with self._lock:
            self._check_open()
            for text, what in ((prefix, "the prefix"), (suffix, "the suffix"), (prompt, "the prompt"),
                               *((str(c.get("text", "")), "an extra file") for c in extra or ())):
                self._fits(_utf8(text, what), what)
            if extra is None and not prompt:
                return infill.fim_tokens(self.model, prefix, suffix)
            return infill.infill_tokens(self.model, prefix, suffix, extra or (), prompt)

    def stream(self, prompt: Prompt, **options: Any) -> Stream:
        """Chunks of text as the target accepts them; the last chunk carries the Result."""
        config = make_config(**options)
        with self._lock:
            return self._start(self._prompt_tokens(prompt), config)

    def _prompt_tokens(self, prompt: Prompt) -> List[int]:
        with self._lock:
            self._check_open()
            if isinstance(prompt, str):
                self._fits(prompt, "the prompt")
            tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
            if not tokens or (isinstance(prompt, str) and not prompt.strip()):
                raise PromptError("the prompt is empty")
            bad = [t for t in tokens if not 0 <= t < self.model.n_vocab]
            if bad:
                raise PromptError(f"token {bad[0]} is not in the vocabulary of {self.model.n_vocab} tokens")
            return tokens

    def _fits(self, text: str, what: str) -> None:
        """PromptError, before tokenizing, for a text too long for the context whatever its tokens."""
        limit = prompt_bytes(self.ctx.n_ctx)
        if 4 * len(text) <= limit:  # a character is at most 4 bytes: it fits, no need to count them
            return
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise PromptError(f"{what} is {size:,} bytes: more than a context of {self.ctx.n_ctx} tokens can hold; "
                              f"shorten it or raise the context size (n_ctx)")

    def _start(self, tokens: List[int], config: Any, dropped_turns: int = 0) -> Stream:
        with self._lock:
            self._active = Stream(self._submit(Request(tokens, config, 1, self._strategy(config))), dropped_turns)
            return self._active

    def _strategy(self, config: Any) -> str:
        """What the statistics call a generation: this LlamaSpec's sources (``--spec``'s name for
        them), or the text's own choice (ConfigError for a source not loaded)."""
        return self.spec_name if config.sources is None else self._parts.label(config.sources)

    def compile_grammar(self, grammar: Grammar) -> None:
        """Compile ``grammar`` for this model now, in this thread (GrammarError if it cannot be
        compiled within its time limit); it is kept for the generations that follow. A
        generation compiles its grammar itself; a server calls this before a request takes its
        turn, so that compiling holds up no other request."""
        self._check_open()
        self._parts.grammars.start(grammar)

    # --- llama-cpp-python's completion methods ----------------------------------------------
    def create_completion(self, prompt: Prompt, **kwargs: Any) -> Any:
        """``llama_cpp.Llama.create_completion``: a dict, or an iterator of chunk dicts with
        ``stream=True`` (see ``completions.py``)."""
        with self._lock:
            return completions.create_completion(self, prompt if isinstance(prompt, str) else list(prompt), **kwargs)

    def create_chat_completion(self, messages: Sequence[Message], **kwargs: Any) -> Any:
        """``llama_cpp.Llama.create_chat_completion``: a dict, or an iterator of chunk dicts with
        ``stream=True`` (see ``completions.py``)."""
        with self._lock:
            return completions.create_chat_completion(self, messages, **kwargs)

    @property
    def model_name(self) -> str:
        """The target's name: its models.txt name or hub name (OWNER/REPO:QUANT) when it was loaded
        so, else its file name."""
        given = str(self.target_config.path)
        if hub.is_hub(given):
            return given[len(hub.PREFIX):]
        return given if given in models.load_model_list() else Path(given).name

    def reset(self) -> None:
        """Forget the conversation and what speculation learned from it: every KV cache, the
        sources' memory of the text, the acceptance estimates. (The measured costs stay.)"""
        with self._lock:
            self._check_open()
            self._close_active("the LlamaSpec was reset")
            self._restart()

    def close(self) -> None:
        """Free the models and their caches; every later call raises LlamaspecError."""
        with self._lock:
            if self._closed:
                return
            self._close_active("its LlamaSpec was closed")
            self._closed = True
            for batcher in self._batchers:
                batcher.close()
            self._parts.close()

    def _close_active(self, why: str) -> None:
        """Close the unfinished stream, if any: reading it again raises StreamClosedError(why)."""
        if self._active is not None and not self._active.done:
            self._active.close(f"this stream was closed: {why}")

    def _check_open(self) -> None:
        if self._closed:
            raise LlamaspecError("this LlamaSpec is closed")

    def __enter__(self) -> "LlamaSpec":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reply_room(max_tokens: int, n_ctx: int) -> int:
    """Tokens a chat prompt leaves free for the reply: max_tokens, at most a quarter of the context."""
    return min(max_tokens if max_tokens >= 0 else n_ctx, n_ctx // 4)


def _utf8(text: str, what: str) -> str:
    """``text``, or PromptError when it cannot be UTF-8 (undecodable bytes, read as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PromptError(f"{what} is not valid UTF-8 text") from None
    return text


def load(model: Optional[str] = None, draft: Optional[str] = None, *, hf: Optional[str] = None,
         hf_draft: Optional[str] = None, hf_file: Optional[str] = None, hf_file_draft: Optional[str] = None,
         spec: str = "auto", references: Sequence[str] = (),
         sources: Sequence[Any] = (), n_ctx: int = ModelConfig.n_ctx, n_threads: Optional[int] = None,
         n_gpu_layers: int = ModelConfig.n_gpu_layers, n_gpu_layers_draft: int = ModelConfig.n_gpu_layers,
         cache_dir: Optional[Path] = None, progress: bool = True, rpc: Sequence[str] = (), rpc_draft: bool = False,
         tensor_split: Sequence[float] = (), rpc_timeout: float = ModelConfig.rpc_timeout,
         **settings: Any) -> LlamaSpec:
    """Load a target model (a GGUF path, a models.txt name, or a Hugging Face hub model:
    ``hf="OWNER/REPO[:QUANT]"``, with ``hf_file`` to name the file) and optionally a draft model
    (``draft``, or ``hf_draft`` and ``hf_file_draft``), as llama.cpp's -m, -hf, -hff and -hfd take them.

    ``spec``: "auto" (every source the models allow), "none" (plain decoding) or a list such as
    "lookup,lookahead,draft". ``references``: texts lookup and lookahead copy from. ``sources``:
    draft sources of one's own (a module's import name, a Python file's path, a module or a
    Plugin), besides the built-in ones and those installed packages declare. ``settings``: each
    source's settings by keyword, as the command line's flags (``draft_max``, ``draft_min``,
    ``draft_p_min``, ``lookup_ngram_min``, ``lookup_cache_static``, ``lookahead_w``...; a source of
    one's own adds its own); a source's name takes its whole config (``lookahead=LookaheadConfig(w=8)``)
    or True, which runs it alone (with the draft model when one is given), as ``--lookahead`` does.
    ``rpc``: llama.cpp RPC servers ("HOST:PORT", each running rpc-server) that hold the target's
    layers (all of them unless ``n_gpu_layers`` says how many; ``tensor_split``: each one's share);
    the draft model stays here unless ``rpc_draft``. A decode on them that takes longer than
    ``rpc_timeout`` seconds ends the generation with RemoteError.
    """
    model = chosen_model(model, hf, hf_file, ("model", "hf", "hf_file"))
    draft = chosen_model(draft, hf_draft, hf_file_draft, ("draft", "hf_draft", "hf_file_draft"), required=False)
    registry = installed_registry(sources)
    spec_cfg = alone(registry, SpecConfig.parse(spec), [name for name, on in settings.items() if on is True],
                     draft is not None, "spec")
    placed = dict(rpc=tuple(rpc), tensor_split=tuple(tensor_split), rpc_timeout=rpc_timeout)
    target = ModelConfig(model, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, **placed)
    draft_cfg = ModelConfig(draft, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers_draft,
                            **(placed if rpc_draft else {})) if draft else None
    return LlamaSpec(target, draft_cfg, settings={k: v for k, v in settings.items() if v is not False},
                     cache_dir=cache_dir, progress=progress, references=references, spec=spec_cfg, registry=registry)


def chosen_model(model: Optional[str], hf: Optional[str], hf_file: Optional[str], names: Tuple[str, str, str],
                 required: bool = True) -> Optional[str]:
    """The model argument: ``model``, or the hub model ``hf`` names (with ``hf_file``); ConfigError
    for both, or for none where one is ``required`` (``names``: the three as the caller calls them,
    ``model``, ``hf``, ``hf_file`` or ``-m``, ``-hf``, ``--hf-file``)."""
    if hf_file and not hf:
        raise ConfigError(f"{names[2]} names a file of the repository {names[1]} gives: give {names[1]} too")
    if model is not None and hf is not None:
        raise ConfigError(f"give {names[0]} or {names[1]}, not both")
    if hf is not None:
        return hub.hub_spec(hf, hf_file)
    if model is None and required:
        raise ConfigError(f"give {names[0]} (a GGUF file or a models.txt name) or {names[1]} (a hub model)")
    return model


def alone(registry: Registry, spec: SpecConfig, names: Sequence[str], draft: bool, given: str) -> SpecConfig:
    """``spec``, or the sources ``names`` alone (each one's shorthand: ``--lookup``,
    ``lookup=True``), with the draft model's source when a draft model is given; ConfigError for
    both, or a name that is no source with a shorthand (``given``: what the spec was given as)."""
    if not names:
        return spec
    for name in names:
        if name not in registry.names or "alone" not in registry[name].flags:
            raise ConfigError(f"{name}=True: only {', '.join(p.name for p in registry.plugins if 'alone' in p.flags)} "
                              f"run alone so")
    if spec.sources is not None:
        raise ConfigError(f"give {given} or the {' / '.join(names)} shorthands, not both")
    return SpecConfig(frozenset(list(names) + (registry.on_draft_model() if draft else [])), spec.fixed)
