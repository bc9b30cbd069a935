"""Hostile JSON schemas and grammars, on SmolLM2's vocabulary: none ends the process (the crash
that did is tried in a subprocess), compiling is bounded in time, each refusal is one line of at
most 300 characters that names the part of the request at fault and never the engine's
internals, and what llama-server accepts is accepted."""

from __future__ import annotations


import pytest

from llamaspec.constraints import Grammar, GrammarVocabulary
from llamaspec.constraints.compiler import Compiler
from llamaspec.errors import GrammarError
from llamaspec.llama.binding import Model

from conftest import SMOL, run


@pytest.fixture(scope="module")
def vocab(model_file):
    vocab = GrammarVocabulary(Model(model_file(SMOL), vocab_only=True))
    yield vocab
    vocab.close()


def props(n: int, required: bool = False) -> dict:
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}
    return {**schema, "required": list(schema["properties"])} if required else schema


def chain(n: int) -> str:
    """A GBNF grammar of ``n`` rules, each calling the next (converting it takes seconds)."""
    return "root ::= r0\n" + "\n".join(f'r{i} ::= "a" r{i + 1}' for i in range(n)) + f'\nr{n} ::= "b"'


def allows(vocab: GrammarVocabulary, grammar: Grammar, text: str) -> bool:
    state = vocab.constraint(grammar)
    tokens = vocab.model.tokenize_bytes(text.encode())
    if state.valid(tokens) != len(tokens):
        return False
    for token in tokens:
        state.advance(token)
    return state.complete


# What llama-server's json_schema field accepts (and a GBNF rule of 5,000 alternatives): each with a
# text it allows and one it does not.


# (the field, what it holds, the message's start): every refusal, one line naming the place


def test_a_crash_of_the_grammar_engine_is_one_line_and_the_next_grammar_compiles():
    """A worker on a 1 MB stack overflows it on 2,500 optional properties (their chain of rules),
    as the server's own process did on 3,500 with 8 MB: a GrammarError, and the next grammar
    is compiled by a new worker."""
    with Compiler(stack_mb=1) as compiler:
        with pytest.raises(GrammarError, match=r"^json_schema: the grammar engine crashed compiling it \(SIG"):
            Grammar.json_schema(props(2500), "json_schema").compiled(compiler)
        assert Grammar.json_schema(props(3)).compiled(compiler)


def test_the_cli_takes_inline_json_of_any_type_and_says_what_the_server_says(tmp_path):
    for value, message in [("[1,2]", "--json-schema: a JSON schema is an object, got list"),
                           ("true", "--json-schema: a JSON schema is an object, got boolean"),
                           ('{"type": "string", "pattern": "(?<=a)b"}',
                            "--json-schema: the JSON schema is not usable: the regex '(?<=a)b' does not parse: "
                            "look-around, including look-ahead and look-behind, is not supported"),
                           (str(tmp_path / "none.json"), "none.json")]:
        result = run("generate", "-m", str(tmp_path / "no-such-model.gguf"), "-p", "hi", "--json-schema", value)
        assert result.exit_code != 0 and "Traceback" not in result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
        assert "no-such-model" not in result.output  # refused before any model loads
