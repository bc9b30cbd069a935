"""What a generation may say: a JSON schema, any JSON object or a GBNF grammar, followed token
by token.

    grammar = Grammar.json_schema(schema)   # or Grammar.json(), Grammar.gbnf(text): checked for
                                            # what Python sees (JSON, the schema's shape and size)
    vocab = GrammarVocabulary(model)        # the model's tokens as the matcher reads them (built
                                            # once per model, on first use)
    state = vocab.constraint(grammar)       # one per text: where its text is in the grammar; the
                                            # grammar compiled on first use (GrammarError here)
    row = state.mask(logits)                # the target's row, every token the grammar forbids at -inf
    state.advance(token)                    # the text goes on
    state.forced()                          # the tokens the grammar allows alone from here

The constrained target is the target's logits with the forbidden tokens removed, then the
sampler chain (greedy: the argmax among allowed tokens), as llama.cpp's sampler with its grammar
first. Once the grammar is complete it allows only the tokens that end a generation.

A JSON schema allows the texts llama.cpp's conversion allows (``json_schema.py``). The matcher is
llguidance's (a mask and a step far faster than llama.cpp's grammar sampler on the same CPU;
see docs/design.md and docs/results.md, "Grammar limits and costs"). A grammar is compiled first in a worker
process, within a time limit (``compiler.py``), then here once per model: the start of each
grammar is kept (the last STARTS of them) and every text starts from a copy of it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field as dataclass_field
from functools import wraps
from typing import Any, Callable, FrozenSet, List, Mapping, Optional, Protocol, Sequence, TypeVar, Union

import numpy as np

from ..errors import GrammarError, joined
from .compiler import Compiler, Refused, limits, on_large_stack, problem
from .json_schema import to_lark, where

STARTS = 32  # grammars whose start a vocabulary keeps compiled


@dataclass(frozen=True)
class Grammar:
    """A constraint as asked, checked for what can be seen without compiling it, not yet
    compiled. ``kind``: "json_schema", "json", "gbnf", "lark" or "tools" (calls of a request's
    tools, ``tools.calls_grammar``); ``source``: what the user gave; ``text``: the grammar in
    ``syntax``, "lark" (llguidance's; a schema's conversion) or "gbnf" (converted when compiled);
    ``field``: where it came from (a request's field, a command-line option), the first words of
    its errors."""

    kind: str
    source: str
    syntax: str
    text: str
    field: str = dataclass_field(default="", compare=False)

    @staticmethod
    def json_schema(schema: Union[str, Mapping[str, Any]], field: str = "") -> "Grammar":
        """A JSON value that validates against ``schema`` (a dict or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise GrammarError(f"the JSON schema is not JSON: {e}", field) from None
            except RecursionError:
                raise GrammarError("the JSON schema is nested too deeply", field) from None
        if not isinstance(schema, Mapping):
            raise GrammarError(f"a JSON schema is an object, got {_kind(schema)}", field)
        try:
            lark = to_lark(schema)
            source = json.dumps(schema)
        except GrammarError as e:
            raise e.within(field) if field else e
        except (RecursionError, ValueError) as e:  # a value json.dumps cannot write (it came from Python)
            raise GrammarError(f"the JSON schema is not usable: {e}", field) from None
        return Grammar("json_schema", source, "lark", lark, field)

    @staticmethod
    def json(field: str = "") -> "Grammar":
        """Any JSON object (OpenAI's ``json_object`` response format)."""
        grammar = Grammar.json_schema({"type": "object"})
        return Grammar("json", "", grammar.syntax, grammar.text, field)

    @staticmethod
    def gbnf(text: str, field: str = "") -> "Grammar":
        """A grammar in llama.cpp's GBNF (its ``root`` rule), as ``--grammar`` takes it."""
        if not isinstance(text, str):
            raise GrammarError(f"a GBNF grammar is text, got {_kind(text)}", field)
        if not text.strip():
            raise GrammarError("the grammar is empty", field)
        return Grammar("gbnf", text, "gbnf", text, field)

    @staticmethod
    def lark(text: str, kind: str = "lark", source: str = "", field: str = "") -> "Grammar":
        """A grammar in llguidance's Lark (its ``start`` rule), built by llamaspec itself (tool calls)."""
        return Grammar(kind, source or text, "lark", text, field)

    @staticmethod
    def of(value: Any, field: str = "") -> "Grammar":
        """A Grammar, a GBNF text, or llama-cpp-python's ``LlamaGrammar`` (its GBNF text)."""
        if isinstance(value, Grammar):
            return value
        if isinstance(value, str):
            return Grammar.gbnf(value, field)
        text = getattr(value, "_grammar", None)  # llama_cpp.LlamaGrammar keeps its GBNF text there
        if isinstance(text, str):
            return Grammar.gbnf(text, field)
        raise GrammarError(f"a grammar is GBNF text or a llama_cpp.LlamaGrammar, got {type(value).__name__}", field)

    def compiled(self, compiler: Compiler) -> str:
        """llguidance's grammar, compiled by ``compiler``; GrammarError (at this grammar's field
        and place) if it does not compile."""
        try:
            return compiler.compile(self.syntax, self.text)
        except Refused as e:
            raise refused(self, e.message, e.stage) from None
        except GrammarError as e:
            raise e.within(self.field) if self.field else e

    def check(self) -> "Grammar":
        """This grammar, compiled once on its own (no vocabulary: what a command line checks
        before a model loads); GrammarError if it does not compile."""
        with Compiler() as compiler:
            self.compiled(compiler)
        return self


def refused(grammar: Grammar, text: str, stage: str) -> GrammarError:
    """The GrammarError of the engine's message ``text`` on ``grammar`` (``stage``: "gbnf": its
    conversion, "compile", "follow": a text it could not follow, "finite": no text ends)."""
    if stage == "finite":
        return GrammarError("it allows no finite text", grammar.field)
    said, line = problem(text)
    if stage == "gbnf":
        return GrammarError(f"the GBNF grammar does not parse: {said}", grammar.field)
    if stage == "follow":
        return GrammarError(f"the grammar cannot follow the text: {said}", grammar.field)
    if grammar.kind in ("json_schema", "tools"):  # the place in the schema (a tool's: tools[i]...)
        place = where(grammar.text, line) or ("tools" if grammar.kind == "tools" else "")
        return GrammarError(f"the JSON schema is not usable: {said}", joined(grammar.field, place))
    return GrammarError(f"the grammar is not usable: {said}", grammar.field)


def _kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), type(value).__name__)


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
    spells them), the tokens that end a generation and the model's tokenizer (built on first
    use); the compiler that compiles its grammars first, and the starts of the last STARTS
    grammars compiled (any thread may ask: a grammar compiles outside the lock, so a slow one
    holds up no other)."""

    def __init__(self, model: Vocabulary) -> None:
        self.model = model
        self.n_vocab = model.n_vocab
        self._tokens: Optional[_Tokens] = None
        self._tokenizer: Any = None
        self._compiler = Compiler(self._vocabulary)
        self._starts: "OrderedDict[Grammar, Constraint]" = OrderedDict()
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                from llguidance import LLTokenizer, TokenizerWrapper
                self._tokenizer = LLTokenizer(TokenizerWrapper(self._token_texts()),
                                              eos_token=sorted(self.model.eog_tokens))
            return self._tokenizer

    def _token_texts(self) -> "_Tokens":
        if self._tokens is None:
            self._tokens = _Tokens(self.model)
        return self._tokens

    def _vocabulary(self) -> Any:
        """What the compiler's worker needs of the model: its token texts and end tokens."""
        with self._lock:
            return self._token_texts().tokens, sorted(self.model.eog_tokens)

    def constraint(self, grammar: Grammar) -> "Constraint":
        """A text at the start of ``grammar``, compiled on first use (GrammarError if it does
        not compile, within its time limit, or allows nothing)."""
        return self.start(grammar).fork()

    def start(self, grammar: Grammar) -> "Constraint":
        """The start of ``grammar`` as kept (compiled now if it is not)."""
        with self._lock:
            if grammar in self._starts:
                self._starts.move_to_end(grammar)
                return self._starts[grammar]
        compiled = grammar.compiled(self._compiler)  # in the worker first: a failure ends it, not us
        tokenizer = self.tokenizer
        from llguidance import LLMatcher
        def compiled_here() -> Any:
            matcher = LLMatcher(tokenizer, compiled, log_level=0, limits=limits())
            if not matcher.is_error():
                matcher.compute_bitmask()  # a grammar that allows nothing says so now, not at the first step
            return matcher
        start = Constraint(self, grammar, on_large_stack(compiled_here))
        with self._lock:
            self._starts[grammar] = start
            while len(self._starts) > STARTS:
                self._starts.popitem(last=False)
        return start

    def close(self) -> None:
        """End the compiler's worker (a later grammar starts it again)."""
        self._compiler.close()


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

    def __init__(self, vocab: GrammarVocabulary, grammar: Grammar, matcher: Any) -> None:
        self.grammar, self.vocab = grammar, vocab
        self.seconds = 0.0
        self._forced: Optional[List[int]] = None  # forced() here, until the text moves on
        self._matcher = matcher  # llguidance's LLMatcher (GrammarVocabulary.start compiles it)
        self._check("compile")

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

    def _check(self, stage: str = "follow") -> None:
        if self._matcher.is_error():
            raise refused(self.grammar, self._matcher.get_error(), stage)


def constraint_of(vocab: Optional[GrammarVocabulary], grammar: Optional[Grammar]) -> Optional[Constraint]:
    """A fresh constraint for one text, or None where there is no grammar."""
    if grammar is None:
        return None
    if vocab is None:
        raise GrammarError("a grammar needs the model's vocabulary")
    return vocab.constraint(grammar)
