"""Hostile JSON schemas and grammars, on SmolLM2's vocabulary: none ends the process (the crash
that did is tried in a subprocess), compiling is bounded in time, each refusal is one line of at
most 300 characters that names the part of the request at fault and never the engine's
internals, and what llama-server accepts is accepted."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from llamaspec.constraints import Grammar, GrammarVocabulary
from llamaspec.constraints.compiler import COMPILE_SECONDS
from llamaspec.errors import GrammarError
from llamaspec.llama.binding import Model

from conftest import SMOL
from checks import console_script


@pytest.fixture(scope="module")
def vocab(model_file):
    vocab = GrammarVocabulary(Model(model_file(SMOL), vocab_only=True))
    yield vocab
    vocab.close()


def props(n: int, required: bool = False) -> dict:
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}
    return {**schema, "required": list(schema["properties"])} if required else schema


def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def objects(n: int) -> dict:
    return {"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "string"}}, "required": [f"k{i}"]}
                      for i in range(n)]}


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
ACCEPTED = [
    ("2,500 optional properties", Grammar.json_schema(props(2500)), '{"p3": "x", "p2499": "y"}',
     '{"p5": "x", "p3": "y"}'),
    ("5,000 required properties", Grammar.json_schema(props(5000, required=True)),
     json.dumps({f"p{i}": "x" for i in range(5000)}), '{"p0": "x"}'),
    ("an enum of 5,000 values", Grammar.json_schema({"enum": [f"v{i}" for i in range(5000)]}), '"v4321"', '"v5000"'),
    ("an enum of 50,000 values", Grammar.json_schema({"enum": list(range(50000))}), "49999", "50000"),
    ("an anyOf of 1,000 objects", Grammar.json_schema(objects(1000)), '{"k17": "x"}', '{"k1000": "x"}'),
    ("an anyOf of 5,000 constants", Grammar.json_schema({"anyOf": [{"const": f"c{i}"} for i in range(5000)]}),
     '"c4999"', '"c"'),
    ("a schema 200 levels deep", Grammar.json_schema(nested(200)), '{"a": ' * 200 + '"x"' + "}" * 200, '{"a": 1}'),
    ("a GBNF rule of 5,000 alternatives", Grammar.gbnf("root ::= " + " | ".join(f'"w{i}" [0-9]' for i in range(5000))),
     "w49991", "w50000"),
]


@pytest.mark.parametrize("name, grammar, good, bad", ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_schemas_llama_server_accepts_are_accepted(vocab, name, grammar, good, bad):
    assert allows(vocab, grammar, good)
    assert not allows(vocab, grammar, bad)


# (the field, what it holds, the message's start): every refusal, one line naming the place
REFUSED = [
    ("response_format.json_schema.schema", props(3500),
     "response_format.json_schema.schema.properties: 3500 optional properties; at most 2500 are supported"),
    ("json_schema", {"enum": list(range(60000))}, "json_schema.enum: an enum of 60000 values; at most 50000"),
    ("json_schema", objects(2001), "json_schema.anyOf: 2001 options; at most 2000 are supported"),
    ("json_schema", nested(300), "json_schema.properties.a.properties.a.properties...a.properties.a.properties.a."
                                 "properties.a: nested more than 200 levels deep; at most 200 are supported"),
    ("json_schema", {"$defs": {**{f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(5000)}, "d5000": {}},
                     "$ref": "#/$defs/d0"}, "json_schema.$defs.d200: nested more than 200 levels deep"),
    ("json_schema", {"properties": {"a": {"type": "string", "pattern": "a(b"}}},
     "json_schema.properties.a: the JSON schema is not usable: the regex 'a(b' does not parse: unclosed group"),
    ("json_schema", {"type": "integer", "minimum": 5, "maximum": 1}, "json_schema: the JSON schema is not usable: "),
    ("json_schema", {"type": "array", "minItems": "x"}, "json_schema.minItems: minItems is a whole number"),
    ("json_schema", {"required": [{"a": 1}], "properties": {}}, "json_schema.required: a JSON schema's required is"),
    ("json_schema", [1, 2], "json_schema: a JSON schema is an object, got list"),
    ("grammar", 'root ::= x\nx ::= x "a"', "grammar: the grammar is not usable: it allows no text at all"),
    ("grammar", "root ::= foo", "grammar: the GBNF grammar does not parse: Rule 'foo' not found"),
    ("grammar", "root ::= " + "(" * 3000 + '"a"' + ")" * 3000, "grammar: the GBNF grammar does not parse: nested too"),
]


@pytest.mark.parametrize("field, value, start", REFUSED, ids=[r[2][:60] for r in REFUSED])
def test_every_refusal_is_one_line_that_names_the_place_and_no_internals(vocab, field, value, start):
    t0 = time.monotonic()
    with pytest.raises(GrammarError) as e:
        vocab.constraint(Grammar.gbnf(value, field) if field == "grammar" else Grammar.json_schema(value, field))
    message = str(e.value)
    assert message.startswith(start) and len(message) <= 300 and "\n" not in message, message
    for internal in ("start:", "<state>", "Parser", "%json", "r0", "lark", "items;"):
        assert internal not in message, message
    assert e.value.where.startswith(field)
    assert time.monotonic() - t0 < 10 * COMPILE_SECONDS


def test_compiling_is_bounded_in_time_and_the_next_grammar_compiles(vocab):
    t0 = time.monotonic()
    with pytest.raises(GrammarError, match=r"^grammar: compiling it took more than 1 s \(the limit\); simplify it$"):
        vocab.constraint(Grammar.gbnf(chain(20000), "grammar"))  # converting it alone takes minutes
    assert time.monotonic() - t0 < COMPILE_SECONDS + 2
    assert allows(vocab, Grammar.gbnf('root ::= "yes" | "no"'), "yes")


def test_the_schema_that_crashed_the_process_is_refused_and_2500_optional_properties_generate(smol, tmp_path):
    """In a subprocess, as a user runs it: 3,500 optional properties ended `generate` with a
    segmentation fault (exit 139, nothing printed)."""
    for n, code in [(3500, 1), (2500, 0)]:
        path = tmp_path / f"props{n}.json"
        path.write_text(json.dumps(props(n)))
        done = subprocess.run([console_script(), "generate", "-m", smol, "-t", "2", "-n", "12", "--temp", "0",
                               "--json-schema", str(path), "-p", "A JSON object:"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == code, done.stderr
        if code:
            assert done.stderr.strip().splitlines() == [
                "error: --json-schema at properties: 3500 optional properties; at most 2500 are supported (list more "
                "of them in required, or split the object)"]
        else:
            assert done.stdout.startswith("{")
