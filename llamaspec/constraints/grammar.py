"""What a generation may say: a JSON schema, any JSON object or a GBNF grammar, followed token
by token.

    grammar = Grammar.json_schema(schema)   # or Grammar.json(), Grammar.gbnf(text): GrammarError here,
                                            # before anything is decoded
    vocab = GrammarVocabulary(model)        # the model's tokens as the matcher reads them (built
                                            # once per model, on first use: about 1 s for 150k tokens)
    state = Constraint(vocab, grammar)      # one per text: where its text is in the grammar
    row = state.mask(logits)                # the target's row, every token the grammar forbids at -inf
    state.advance(token)                    # the text goes on
    state.forced()                          # the tokens the grammar allows alone from here

The constrained target is the target's logits with the forbidden tokens removed, then the
sampler chain (greedy: the argmax among allowed tokens), as llama.cpp's sampler with its grammar
first. Once the grammar is complete it allows only the tokens that end a generation.

A JSON schema allows the texts llama.cpp's conversion allows (``json_schema.py``). The matcher is
llguidance's (a mask over 151,936 tokens and a step in 0.17 ms where llama.cpp's grammar sampler
takes 12.4 ms on the same CPU; see docs/design.md).
"""

from __future__ import annotations

import json
import re
import time
from functools import wraps
from dataclasses import dataclass
from typing import Any, Callable, FrozenSet, List, Mapping, Optional, Protocol, Sequence, TypeVar, Union

import numpy as np

from ..errors import GrammarError
from .json_schema import to_lark


@dataclass(frozen=True)
class Grammar:
    """A constraint checked and compiled (llguidance's grammar text), not yet bound to a
    vocabulary. ``kind``: "json_schema", "json", "gbnf" or "tools" (calls of a request's tools,
    ``tools.calls_grammar``); ``source``: what the user gave."""

    kind: str
    source: str
    compiled: str

    @staticmethod
    def json_schema(schema: Union[str, Mapping[str, Any]]) -> "Grammar":
        """A JSON value that validates against ``schema`` (a dict or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise GrammarError(f"the JSON schema is not JSON: {e}") from None
        if not isinstance(schema, Mapping):
            raise GrammarError(f"a JSON schema is an object, got {type(schema).__name__}")
        return Grammar._checked("json_schema", json.dumps(schema), _lark(to_lark(schema)))

    @staticmethod
    def json() -> "Grammar":
        """Any JSON object (OpenAI's ``json_object`` response format)."""
        grammar = Grammar.json_schema({"type": "object"})
        return Grammar("json", "", grammar.compiled)

    @staticmethod
    def gbnf(text: str) -> "Grammar":
        """A grammar in llama.cpp's GBNF (its ``root`` rule), as ``--grammar`` takes it."""
        from llguidance.gbnf_to_lark import gbnf_to_lark
        if not text.strip():
            raise GrammarError("the grammar is empty")
        try:
            lark = gbnf_to_lark(text)
        except Exception as e:  # the converter's errors name the line and the place
            raise GrammarError(f"the GBNF grammar does not parse: {_line(e)}") from None
        return Grammar._checked("gbnf", text, _lark(lark))

    @staticmethod
    def lark(text: str, kind: str = "lark", source: str = "") -> "Grammar":
        """A grammar in llguidance's Lark (its ``start`` rule), built by llamaspec itself (tool calls)."""
        return Grammar._checked(kind, source or text, _lark(text))

    @staticmethod
    def of(value: Any) -> "Grammar":
        """A Grammar, a GBNF text, or llama-cpp-python's ``LlamaGrammar`` (its GBNF text)."""
        if isinstance(value, Grammar):
            return value
        if isinstance(value, str):
            return Grammar.gbnf(value)
        text = getattr(value, "_grammar", None)  # llama_cpp.LlamaGrammar keeps its GBNF text there
        if isinstance(text, str):
            return Grammar.gbnf(text)
        raise GrammarError(f"a grammar is GBNF text or a llama_cpp.LlamaGrammar, got {type(value).__name__}")

    @staticmethod
    def _checked(kind: str, source: str, compiled: str) -> "Grammar":
        from llguidance import LLMatcher
        problem = LLMatcher.validate_grammar(compiled)
        if problem and not problem.startswith("WARNING"):
            if kind == "json_schema":  # the schema's own problem, not the place in the grammar wrapping it
                problem = re.sub(r"^at \d+\(\d+\): (failed to compile JSON schema: )?", "", problem.splitlines()[0])
                raise GrammarError(f"the JSON schema is not usable: {problem}")
            raise GrammarError(f"the grammar is not usable: {_line(problem)}")
        return Grammar(kind, source, compiled)


def _lark(text: str) -> str:
    from llguidance import LLMatcher
    try:
        return LLMatcher.grammar_from_lark(text)
    except Exception as e:
        raise GrammarError(f"the grammar is not usable: {_line(e)}") from None


def _line(problem: Any) -> str:
    """An error's message on one line."""
    return " ".join(str(problem).split())


class Vocabulary(Protocol):
    """What a model tells of its tokens (``llama.binding.Model``)."""

    n_vocab: int

    @property
    def eog_tokens(self) -> FrozenSet[int]: ...

    def piece(self, token: int) -> bytes: ...

    def is_control(self, token: int) -> bool: ...

    def tokenize_bytes(self, data: bytes) -> List[int]: ...


class GrammarVocabulary:
    """A model's tokens as the matcher reads them: their bytes (control tokens marked, so no text
    spells them), the tokens that end a generation and the model's tokenizer. Built on first use."""

    def __init__(self, model: Vocabulary) -> None:
        self.model = model
        self.n_vocab = model.n_vocab
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from llguidance import LLTokenizer, TokenizerWrapper
            self._tokenizer = LLTokenizer(TokenizerWrapper(_Tokens(self.model)), eos_token=sorted(self.model.eog_tokens))
        return self._tokenizer


class _Tokens:
    """The model as llguidance's TokenizerWrapper reads a tokenizer."""

    def __init__(self, model: Vocabulary) -> None:
        self.model = model
        self.eos_token_id = min(model.eog_tokens) if model.eog_tokens else 0
        self.bos_token_id = None
        self.tokens = [b"\xff" + model.piece(t) if model.is_control(t) else model.piece(t)
                       for t in range(model.n_vocab)]
        self.special_token_ids: List[int] = []

    def __call__(self, data: bytes) -> List[int]:
        return self.model.tokenize_bytes(data)


F = TypeVar("F", bound=Callable[..., Any])


def _timed(method: F) -> F:
    """The method's wall time counts in its constraint's ``seconds``."""
    @wraps(method)
    def timed(self: "Constraint", *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return method(self, *args)
        finally:
            self.seconds += time.perf_counter() - t0
    return timed  # type: ignore[return-value]


class Constraint:
    """One text's place in a grammar: which tokens may come next, and the text so far.
    ``seconds``: the time spent following it (masks, checks, advancing, forced tokens)."""

    def __init__(self, vocab: GrammarVocabulary, grammar: Grammar, _matcher: Any = None) -> None:
        from llguidance import LLMatcher
        self.grammar, self.vocab = grammar, vocab
        self.seconds = 0.0
        self._forced: Optional[List[int]] = None  # forced() here, until the text moves on
        self._matcher = _matcher if _matcher is not None else LLMatcher(vocab.tokenizer, grammar.compiled, log_level=0)
        self._check()

    def fork(self) -> "Constraint":
        """A copy at the same place that moves on alone (a draft looking ahead); this one stays."""
        return Constraint(self.vocab, self.grammar, self._matcher.deep_copy())

    @_timed
    def allowed(self) -> np.ndarray:
        """A bool per token of the vocabulary: whether the grammar allows it next."""
        return self._allowed()

    def _allowed(self) -> np.ndarray:
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[:self.vocab.n_vocab].astype(bool)

    @_timed
    def allows(self, token: int) -> bool:
        return self._matcher.validate_tokens([token]) == 1

    @_timed
    def mask(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` (one row, not modified) with every forbidden token at -inf."""
        return np.where(self._allowed(), logits, -np.inf).astype(logits.dtype, copy=False)

    def argmax(self, logits: np.ndarray) -> int:
        """The allowed token of the largest logit (the first on ties, as an argmax over the
        masked row): the unconstrained argmax where the grammar allows it, which it mostly does."""
        token = int(logits.argmax())
        return token if self.allows(token) else int(self.mask(logits).argmax())

    @_timed
    def valid(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` the grammar allows in a row from here (the state is unchanged)."""
        return self._matcher.validate_tokens(list(tokens))

    @_timed
    def advance(self, token: int) -> None:
        """The text goes on with ``token`` (which the grammar must allow)."""
        self._matcher.consume_token(token)
        self._forced = None
        self._check()

    @_timed
    def forced(self) -> List[int]:
        """The tokens that must come next whatever the model says (empty where there is a choice).
        Found once per place in the text: the speculator and the grammar source both ask."""
        if self._forced is None:
            self._forced = list(self._matcher.compute_ff_tokens())
        return list(self._forced)

    @_timed
    def spelled(self, forced: Sequence[int]) -> List[int]:
        """The rest of the text that must come next, after the ``forced`` tokens, in the model's
        own tokenization (the model may split it otherwise: likely, not certain)."""
        rest = self._matcher.compute_ff_bytes()[sum(len(self.vocab.model.piece(t)) for t in forced):]
        return self.vocab.model.tokenize_bytes(rest) if rest else []

    @property
    def complete(self) -> bool:
        """The text so far is a whole sentence of the grammar (it may end here)."""
        return self._matcher.is_accepting()

    def _check(self) -> None:
        if self._matcher.is_error():
            raise GrammarError(f"the grammar cannot follow the text: {_line(self._matcher.get_error())}")


def constraint_of(vocab: Optional[GrammarVocabulary], grammar: Optional[Grammar]) -> Optional[Constraint]:
    """A fresh constraint for one text, or None where there is no grammar."""
    if grammar is None:
        return None
    if vocab is None:
        raise GrammarError("a grammar needs the model's vocabulary")
    return Constraint(vocab, grammar)
