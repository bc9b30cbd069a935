"""llamaspec: faster local generation with llama.cpp models, same output.

    >>> import llamaspec
    >>> spec = llamaspec.load("qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct")
    >>> result = spec.generate("def fib(n):", max_tokens=64, temperature=0)
    >>> result.text, result.stats.accept

The package, layer by layer, from the ground up (a layer imports only those below it)::

    config, errors, sampling, sequences   settings, one-line errors, distributions, token lists
    llama/        llama.cpp through its low-level API: models, contexts, vocabularies, chat
                  templates, n-gram cache files
    constraints/  JSON schemas and grammars the text follows (llguidance's matcher)
    draft_heads.py  the draft heads' model and file format (training/ writes it, sources/ reads it)
    sources/      draft sources propose candidate tokens, each a plugin in one module (lookup,
                  n-gram caches, lookahead, a draft model, sibling samples, the grammar)
    planning/     acceptance estimates and measured costs choose the token trie worth verifying
    engine/       one llama_decode verifies it; exact acceptance; stops; many texts at once
    openai/       OpenAI's and llama-cpp-python's shapes (completions, tools)
    assembly.py   a LlamaSpec put together;  api.py: LlamaSpec, the public Python API
    server/       the OpenAI-compatible HTTP server
    measure/      bench, compare, agreement, replays of recorded answers
    training/     draft heads trained on the target's hidden states (llamaspec heads train)
    cli/          the llamaspec command and its terminal chat
"""

from .llama.pool import ModelPool
from .measure.agreement import AgreementReport, CandidateAgreement, agreement
from .api import LlamaSpec, load
from .engine.batcher import Batcher
from .engine.scheduler import RequestStream, Stream
from .engine.generation import Chunk, Result
from .config import GenerationConfig, ModelConfig, SamplingConfig, SpecConfig
from .sources import CacheConfig, DraftConfig, HeadsConfig, LookaheadConfig, LookupConfig, installed_registry
from .sources.registry import Hooks, Option, Plugin, Registry, Room, Setup, Target, TextContext
from .sources.base import Budget, Candidate, Outcome, Proposal, Source
from .errors import (
    CacheFormatError,
    ConfigError,
    DecodeError,
    FetchError,
    GrammarError,
    LlamaspecError,
    ModelError,
    PromptError,
    RemoteError,
    StreamClosedError,
    UnknownModelError,
    VocabMismatchError,
)
from .constraints import Grammar
from .llama.models import cache_dir, default_pair, fetch, load_model_list, resolve_model
from .engine.stats import SourceStats, Stats

__all__ = [
    "AgreementReport",
    "Budget",
    "CacheConfig",
    "Candidate",
    "Hooks",
    "Option",
    "Outcome",
    "Plugin",
    "Proposal",
    "Registry",
    "Room",
    "Setup",
    "Source",
    "Target",
    "TextContext",
    "installed_registry",
    "Batcher",
    "CandidateAgreement",
    "CacheFormatError",
    "Chunk",
    "ConfigError",
    "DecodeError",
    "DraftConfig",
    "FetchError",
    "Grammar",
    "GrammarError",
    "GenerationConfig",
    "HeadsConfig",
    "LlamaSpec",
    "LlamaspecError",
    "LookaheadConfig",
    "LookupConfig",
    "ModelConfig",
    "ModelError",
    "ModelPool",
    "PromptError",
    "RemoteError",
    "RequestStream",
    "Result",
    "SamplingConfig",
    "SpecConfig",
    "Stream",
    "StreamClosedError",
    "SourceStats",
    "Stats",
    "UnknownModelError",
    "VocabMismatchError",
    "agreement",
    "cache_dir",
    "default_pair",
    "fetch",
    "load",
    "load_model_list",
    "resolve_model",
]
