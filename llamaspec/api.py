"""The public Python API: load a target (and a draft), then generate, stream or chat."""

from __future__ import annotations

import os
import threading
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .llama.binding import Context, Model, gpus, max_sequences, supports_gpu_offload
from .llama.pool import ModelPool
from .llama.chat import ChatTemplate, Message, fit
from .llama import infill
from . import completions
from .llama import models
from .planning.acceptance_model import AcceptanceModel
from .sources.base import Source
from .sources.draft_model import NAME as DRAFT, DraftSequences
from .sources.registry import Loaded, Need, Registry, TextContext
from .sources import default_registry
from .config import DraftConfig, LookaheadConfig, LookupConfig, ModelConfig, SpecConfig, prompt_bytes
from .planning.costs import CostCurve, CostModel, load_or_measure, load_or_measure_draft
from .errors import ConfigError, LlamaspecError, LlamaspecWarning, PromptError
from .constraints import Grammar, GrammarVocabulary
from .sources.ngram_cache import NgramCaches
from .planning.planner import MAX_LEAVES, Planner
from .engine.engine import Engine, check_prompt
from .engine.scheduler import Request, RequestStream, Scheduler, Stream
from .engine.batcher import Batcher
from .llama.models import resolve_model
from .engine.generation import Result, last, make_config
from .llama.vocab import check_compatible

Prompt = Union[str, Sequence[int]]

# Samples of one prompt decoded together at most (each is a KV-cache sequence).
MAX_SAMPLES = 16


class LlamaSpec:
    """A target model, optionally a draft model, their KV caches and the draft sources.

    ``spec`` chooses the sources (a SpecConfig or its text, as ``--spec`` takes it; default auto:
    every one the loaded models and files allow) among the ``registry``'s (default: the built-in
    sources); ``lookup`` and ``lookahead`` are their parameters; ``references`` are texts lookup
    and lookahead may copy from. The caches persist between calls: a prompt that extends the
    previous one (the next turn of a chat) evaluates only its new tokens. LlamaSpecs given the
    same ``pool`` share the weights of the models they both load.
    """

    def __init__(self, target: ModelConfig, draft: Optional[ModelConfig] = None,
                 draft_config: DraftConfig = DraftConfig(), cache_dir: Optional[Path] = None,
                 progress: bool = True, lookup: LookupConfig = LookupConfig(), references: Sequence[str] = (),
                 lookahead: LookaheadConfig = LookaheadConfig(), spec: Union[SpecConfig, str] = SpecConfig(),
                 pool: Optional[ModelPool] = None, registry: Optional[Registry] = None) -> None:
        self.target_config, self.draft_config = target, draft_config
        self._lock = threading.RLock()
        self._active: Optional[Union[Stream, RequestStream]] = None
        self._closed = False
        self._batchers: List[Batcher] = []
        spec = SpecConfig.parse(spec) if isinstance(spec, str) else spec
        self.registry = registry if registry is not None else default_registry()
        given = frozenset(({Need.DRAFT_MODEL} if draft is not None else set())
                          | ({Need.CACHE_FILES} if lookup.cache_static or lookup.cache_dynamic else set()))
        names = self.registry.resolve(spec, given)
        needed = frozenset().union(*(self.registry[n].needs for n in names))
        readers = [n for n in self.registry.names if self.registry[n].reads_references]
        if references and not names & set(readers):
            raise ConfigError(f"references are read by the {' and '.join(readers)} sources; --spec runs none of them")
        self.spec_name = self.registry.label(names, spec)
        room = self.registry.room(names, Loaded(lookup=lookup, lookahead=lookahead, draft=draft_config),
                                  target.n_ctx, target.n_batch, MAX_LEAVES, spec.fixed)
        leaves, n_seq = room.branches, 1 + room.branches + room.own
        self._scratch = n_seq - 1  # sequences a step's branches and the sources' own (lookahead's window) may use
        # loaded once, shared by every text decoded (bad files: fail before loading any model)
        caches = NgramCaches.open(lookup) if Need.CACHE_FILES in needed else None
        _warn_about(target, draft)
        self._pool = pool if pool is not None else ModelPool()
        self.model = self._pool.get(resolve_model(target.path, cache_dir, progress), target.offloaded, target.rpc,
                                    target.tensor_split, target.rpc_timeout)
        self.draft_model: Optional[Model] = None
        self.ctx: Optional[Context] = None
        self._draft_ctx: Optional[Context] = None
        try:
            if draft is not None and Need.DRAFT_MODEL in needed:
                self.draft_model = self._pool.get(resolve_model(draft.path, cache_dir, progress), draft.offloaded,
                                                  draft.rpc, draft.tensor_split, draft.rpc_timeout)
                check_compatible(self.model, self.draft_model)
            if caches is not None:
                caches.validate_vocab(self.model.n_vocab)
            if target.n_ctx > self.model.n_ctx_train > 0:
                warnings.warn(f"the context ({target.n_ctx} tokens) exceeds the {self.model.n_ctx_train} "
                              f"{self.model.path.name} was trained on: expect worse text past that", LlamaspecWarning,
                              stacklevel=2)
            self.ctx = self.model.context(target.n_ctx, target.threads, target.n_batch, n_seq + MAX_SAMPLES)
            costs_file = models.cache_dir(cache_dir) / "costs.json"
            curve = load_or_measure(self.ctx, costs_file, progress) if names else CostCurve.flat()
            draft_curve = None
            if self.draft_model is not None and draft is not None:
                # a sequence per lane: one text, or the samples of one prompt decoded together
                self._draft_ctx = self.draft_model.context(draft.n_ctx, draft.threads, draft.n_batch, MAX_SAMPLES)
                draft_curve = load_or_measure_draft(self._draft_ctx, curve, self.model, costs_file, progress)
            self._costs = CostModel(curve, {DRAFT: draft_curve} if draft_curve is not None else None)
            self._names, self._fixed = names, spec.fixed
            drafts = DraftSequences(self._draft_ctx) if self._draft_ctx is not None else None
            self._loaded = Loaded(self.model.piece, lookup, lookahead, draft_config, caches, drafts)
            self._text = TextContext(references=tuple(tuple(self.model.tokenize(text, add_special=False,
                                                                                 parse_special=False))
                                                      for text in references))
            self._leaves = leaves
            self._grammars = GrammarVocabulary(self.model)  # built when a first request has a grammar
            self._restart()
        except BaseException:  # nothing half-loaded stays behind
            for ctx in (self.ctx, self._draft_ctx):
                if ctx is not None:
                    ctx.close()
            self._release_models()
            raise
        self._template: Optional[ChatTemplate] = None

    def _restart(self) -> None:
        """Empty caches and an engine of MAX_SAMPLES lanes on them, one request at a time: fresh
        sources, acceptance model and planner (the cost model lives on)."""
        self.ctx.clear()
        if self._draft_ctx is not None:
            self._draft_ctx.clear()
            self._loaded = replace(self._loaded, drafts=DraftSequences(self._draft_ctx))
        self.engine = Engine(self.ctx, MAX_SAMPLES, self._leaves)
        self._scheduler = Scheduler(self.engine, self.model, self._sources_for(self._loaded),
                                    self._planner(self._costs), self.ctx.n_ctx, self.ctx.n_ctx,
                                    self._acceptance_model(), exclusive=True, grammars=self._grammars)

    def _acceptance_model(self) -> AcceptanceModel:
        return AcceptanceModel(self.registry.priors(), self.registry.overall())

    def _planner(self, costs: CostModel) -> Planner:
        return Planner(costs, self._fixed, self.registry.shadowed())

    # --- text ---------------------------------------------------------------------------
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
        request = Request(self._prompt_tokens(prompt), config, n, self.spec_name)  # bad n: before any decoding
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
        if not 1 <= parallel <= MAX_SAMPLES:
            raise ConfigError(f"parallel sequences must be between 1 and {MAX_SAMPLES}, got {parallel}")
        if parallel + self._scratch > max_sequences():
            raise ConfigError(f"{parallel} parallel sequences and {self._scratch} for drafts exceed the "
                              f"{max_sequences()} KV-cache sequences llama.cpp allows; lower the parallel "
                              f"sequences or lookahead's W and G")
        with self._lock:
            self._check_open()
            cfg, n_ctx = self.target_config, self.ctx.n_ctx
            # every lane's share, and room for one batch of branch rows on top of them
            ctx = self.model.context(n_ctx * parallel + cfg.n_batch, cfg.threads, cfg.n_batch, parallel + self._scratch)
            contexts, loaded = [ctx], replace(self._loaded, drafts=None)
            if self._draft_ctx is not None:
                d = self._draft_ctx
                draft_ctx = d.model.context(d.n_ctx * parallel, d.threads, d.n_batch, parallel)
                contexts.append(draft_ctx)
                loaded = replace(self._loaded, drafts=DraftSequences(draft_ctx))
            planner = self._planner(self._costs.fresh())  # learns this batch's timings, not ours
            scheduler = Scheduler(Engine(ctx, parallel), self.model, self._sources_for(loaded), planner,
                                  n_ctx * parallel, n_ctx, self._acceptance_model(), grammars=self._grammars)
            batcher = Batcher(scheduler, contexts, self._prompt_tokens, self.spec_name)
            self._batchers.append(batcher)
            return batcher

    def _sources_for(self, loaded: Loaded) -> Callable[[TextContext], List[Source]]:
        """The sources of one sample: this LlamaSpec's (a draft model on its lane's sequence, lookup
        reading its references), between samples of one prompt its siblings' (consensus), and
        its grammar's, where it has one."""
        def sources(text: TextContext) -> List[Source]:
            return self.registry.build(self._names, loaded, replace(text, references=self._text.references))
        return sources

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
            self._active = Stream(self._submit(Request(tokens, config, 1, self.spec_name)), dropped_turns)
            return self._active

    def compile_grammar(self, grammar: Grammar) -> None:
        """Compile ``grammar`` for this model now, in this thread (GrammarError if it cannot be
        compiled within its time limit); it is kept for the generations that follow. A
        generation compiles its grammar itself; a server calls this before a request takes its
        turn, so that compiling holds up no other request."""
        self._check_open()
        self._grammars.start(grammar)

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
        """The target's name: its models.txt name when it was loaded by name, else its file name."""
        given = str(self.target_config.path)
        return given if given in models.load_registry() else Path(given).name

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
            self._grammars.close()
            for ctx in (self.ctx, self._draft_ctx):
                if ctx is not None:
                    ctx.close()
            self._release_models()

    def _release_models(self) -> None:
        for model in (self.model, self.draft_model):
            if model is not None:
                self._pool.release(model)

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


def _warn_about(*configs: Optional[ModelConfig]) -> None:
    cores = os.cpu_count() or 1
    for cfg in configs:
        if cfg is None:
            continue
        if cfg.threads > cores:
            warnings.warn(f"{cfg.threads} threads on {cores} cores: llama.cpp runs slower with more threads than "
                          f"cores", LlamaspecWarning, stacklevel=3)
        if cfg.n_gpu_layers != 0 and not cfg.rpc and not gpus():
            why = ("found no GPU: the GPU layers run on the CPU" if supports_gpu_offload() else
                   "was built without GPU support: the GPU layers are ignored (rebuild it with CMAKE_ARGS, see the README)")
            warnings.warn(f"this llama-cpp-python {why}", LlamaspecWarning, stacklevel=3)


def load(model: str, draft: Optional[str] = None, *, spec: str = "auto", lookup: Union[bool, LookupConfig] = False,
         lookahead: Union[bool, LookaheadConfig] = False, references: Sequence[str] = (),
         n_ctx: int = ModelConfig.n_ctx, n_threads: Optional[int] = None, n_gpu_layers: int = ModelConfig.n_gpu_layers,
         n_gpu_layers_draft: int = ModelConfig.n_gpu_layers, draft_max: int = DraftConfig.draft_max,
         draft_min: int = DraftConfig.draft_min, draft_p_min: float = DraftConfig.draft_p_min,
         cache_dir: Optional[Path] = None, progress: bool = True, rpc: Sequence[str] = (), rpc_draft: bool = False,
         tensor_split: Sequence[float] = (), rpc_timeout: float = ModelConfig.rpc_timeout) -> LlamaSpec:
    """Load a target model (a GGUF path or a models.txt name) and optionally a draft model.

    ``spec``: "auto" (every source the models allow), "none" (plain decoding) or a list such as
    "lookup,lookahead,draft". ``lookup=True`` / ``lookahead=True`` are shorthands that restrict
    the sources to those (plus the draft model when one is given); a LookupConfig or
    LookaheadConfig sets their parameters. ``references``: texts lookup and lookahead copy from.
    ``rpc``: llama.cpp RPC servers ("HOST:PORT", each running rpc-server) that hold the target's
    layers (all of them unless ``n_gpu_layers`` says how many; ``tensor_split``: each one's share);
    the draft model stays here unless ``rpc_draft``. A decode on them that takes longer than
    ``rpc_timeout`` seconds ends the generation with RemoteError.
    """
    spec_cfg = SpecConfig.parse(spec)
    chosen = [name for name, on in (("lookup", lookup), ("lookahead", lookahead)) if on is True]
    if chosen:
        if spec_cfg.sources is not None:
            raise ConfigError("give spec or the lookup=True / lookahead=True shorthands, not both")
        spec_cfg = SpecConfig(frozenset(chosen + (["draft"] if draft else [])))
    placed = dict(rpc=tuple(rpc), tensor_split=tuple(tensor_split), rpc_timeout=rpc_timeout)
    target = ModelConfig(model, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, **placed)
    draft_cfg = ModelConfig(draft, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers_draft,
                            **(placed if rpc_draft else {})) if draft else None
    lookup_cfg = lookup if isinstance(lookup, LookupConfig) else LookupConfig()
    lookahead_cfg = lookahead if isinstance(lookahead, LookaheadConfig) else LookaheadConfig()
    return LlamaSpec(target, draft_cfg, DraftConfig(draft_max, draft_min, draft_p_min), cache_dir, progress,
                     lookup_cfg, references, lookahead_cfg, spec_cfg)
