"""Property-based tests (Hypothesis, a fixed seed, a bounded number of examples) of what parses
schemas and grammars: the server's body parsing and the grammar its request asks for, the CLI's
--json-schema and --grammar, and compiling any of them on SmolLM2's vocabulary. Whatever the
input: a result or a one-line error of at most 300 characters, never another exception, a crash
or an unbounded time."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, strategies as st

from llamaspec.constraints import Grammar, GrammarVocabulary
from llamaspec.constraints.compiler import COMPILE_SECONDS
from llamaspec.llama.binding import Model

from conftest import SMOL
from fuzzing import FUZZ, assert_refused_well, gbnf, schemas, values


@pytest.fixture(scope="module")
def vocab(model_file):
    vocab = GrammarVocabulary(Model(model_file(SMOL), vocab_only=True))
    yield vocab
    vocab.close()


# --- the properties ----------------------------------------------------------------------------

@FUZZ
@given(schema=st.one_of(schemas(), values))
def test_any_schema_compiles_or_is_one_line(vocab, schema):
    t0 = time.monotonic()
    try:
        vocab.constraint(Grammar.json_schema(schema, "json_schema"))
    except Exception as e:  # noqa: BLE001 - what it is, is the test
        assert_refused_well(e)
    assert time.monotonic() - t0 < 5 * COMPILE_SECONDS + 5


@FUZZ
@given(text=st.one_of(gbnf, st.text(max_size=40)))
def test_any_gbnf_text_compiles_or_is_one_line(vocab, text):
    t0 = time.monotonic()
    try:
        vocab.constraint(Grammar.gbnf(text, "grammar"))
    except Exception as e:  # noqa: BLE001
        assert_refused_well(e)
    assert time.monotonic() - t0 < 5 * COMPILE_SECONDS + 5
