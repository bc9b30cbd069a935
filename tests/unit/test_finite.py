"""Whether a grammar allows some finite text (``constraints/finite.py``): every start rule whose
every alternative needs itself again is refused, a recursion with a way out is not, what the
reader does not understand is taken for productive, and a chain of many rules reads in one pass."""

from __future__ import annotations

import time

import pytest
from llguidance.gbnf_to_lark import gbnf_to_lark

from llamaspec.constraints import Grammar
from llamaspec.constraints.finite import finite
from llamaspec.constraints.json_schema import to_lark
from llamaspec.errors import GrammarError

GBNF = [
    ('root ::= "a" root', False),
    ('root ::= "a" | "a" root', True),
    ('root ::= x\nx ::= "b" x | y\ny ::= "c" y', False),
    ('root ::= x\nx ::= "b" x | y\ny ::= "c" y | "d"', True),
    ('root ::= "a"* root', False),
    ('root ::= ("a" root)?', True),
    ('root ::= ("a" root)+', False),
    ('root ::= ("a" | "b" root)+', True),
    ('root ::= [a-z]{2,5} "x" root', False),
    ('root ::= x{0,3}\nx ::= "a" x', True),
    ('root ::= x{1,3}\nx ::= "a" x', False),
    ('root ::= "//" root | "/" root', False),  # a string that looks like a comment
    ('root ::= "//" | "/" root', True),
    ('root ::= "{" root "}" | "[" "]"', True),
    ('root ::= "{" root "}"\n\n# a comment\nother ::= "x"', False),  # an unused rule that ends changes nothing
    ('root ::= "a" root | # a comment\n  "b"', True),
]

LARK = [
    ('start: "a" start\n// a comment between the alternatives\n    | "b"', True),
    ('start: x\nx[max_tokens=3]: "a" x', True),  # the engine may end a rule with attributes: not judged
    ('start: %json {"type": "object", "x": "}\\"{"} start', False),  # braces inside the JSON's strings
    ('start: "a" start | %json {"type": "object"}', True),
    ('start: "a".."z" start', False),
    ('start: <|eos|> | "a" start', True),
    ('start: A start\nA: "x"', False),
    ('start: A\nA: "x" A', True),  # terminals are not judged (the engine refuses a recursive one)
    ('start: ("a" start) ~ 2', False),
    ('start: ("a" start) ~ 0..2', True),
    ('start: "a" start -> named', False),
    ('x: "a"', True),  # no start rule: not judged
    ('start: ' + '(' * 5000 + '"a" start' + ')' * 5000, True),  # too deep to read: not judged
]

SCHEMAS = [
    ({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}, False),
    ({"type": "object", "properties": {"next": {"$ref": "#"}}}, True),
    ({"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}},
      "$ref": "#/$defs/a"}, False),
    ({"type": "array", "items": {"$ref": "#"}, "minItems": 1}, False),
    ({"type": "array", "items": {"$ref": "#"}}, True),
    ({"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}, "b": {"$ref": "#"}}, "required": ["b"]},
     False),
    ({"anyOf": [{"type": "string"}, {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}]}, True),
    ({"type": "object"}, True),
]


@pytest.mark.parametrize("gbnf, expected", GBNF)
def test_a_gbnf_grammar_s_conversion(gbnf, expected):
    assert finite(gbnf_to_lark(gbnf)) is expected


@pytest.mark.parametrize("lark, expected", LARK)
def test_lark(lark, expected):
    assert finite(lark) is expected


@pytest.mark.parametrize("schema, expected", SCHEMAS)
def test_a_json_schema_s_grammar(schema, expected):
    assert finite(to_lark(schema)) is expected


def test_a_chain_of_many_rules_in_the_worst_order_reads_in_one_pass():
    n = 50_000  # each rule productive only once the one after it is: a pass per rule would take hours
    chain = "start: r0\n" + "".join(f'r{i}: "a" r{i + 1}\n' for i in range(n))
    t0 = time.monotonic()
    assert finite(chain + f'r{n}: "b"\n') and not finite(chain + f'r{n}: "b" r0\n')
    assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("grammar, message", [
    (Grammar.gbnf('root ::= "a" root', "grammar"), "grammar: it allows no finite text"),
    (Grammar.gbnf('root ::= x\nx ::= "a" x', "--grammar"), "--grammar: it allows no finite text"),
    (Grammar.json_schema({"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]}, "json_schema"),
     "json_schema: it allows no finite text"),
])
def test_a_grammar_with_no_finite_text_is_one_line_naming_its_field(grammar, message):
    with pytest.raises(GrammarError) as e:
        grammar.check()
    assert str(e.value) == message
    assert Grammar.gbnf('root ::= "a" root | "b"').check()
