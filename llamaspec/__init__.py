"""llamaspec: faster local generation with llama.cpp models, same output.

    >>> import llamaspec
    >>> spec = llamaspec.load("qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct")
    >>> result = spec.generate("def fib(n):", max_tokens=64, temperature=0)
    >>> result.text, result.stats.accept
"""

from ._llama import ModelPool
from .agreement import AgreementReport, CandidateAgreement, agreement
from .api import LlamaSpec, load
from .batcher import Batcher
from .scheduler import RequestStream
from .generation import Chunk, Result, Stream
from .config import (DraftConfig, GenerationConfig, LookaheadConfig, LookupConfig, ModelConfig, SamplingConfig,
                     SpecConfig)
from .errors import (
    CacheFormatError,
    ConfigError,
    DecodeError,
    FetchError,
    LlamaspecError,
    ModelError,
    PromptError,
    StreamClosedError,
    UnknownModelError,
    VocabMismatchError,
)
from .models import cache_dir, default_pair, fetch, load_registry, resolve_model
from .stats import SourceStats, Stats

__all__ = [
    "AgreementReport",
    "Batcher",
    "CandidateAgreement",
    "CacheFormatError",
    "Chunk",
    "ConfigError",
    "DecodeError",
    "DraftConfig",
    "FetchError",
    "GenerationConfig",
    "LlamaSpec",
    "LlamaspecError",
    "LookaheadConfig",
    "LookupConfig",
    "ModelConfig",
    "ModelError",
    "ModelPool",
    "PromptError",
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
    "load_registry",
    "resolve_model",
]
