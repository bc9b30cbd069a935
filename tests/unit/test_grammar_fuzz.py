"""Property-based tests (Hypothesis, a fixed seed, a bounded number of examples) of what parses
schemas and grammars: the server's body parsing and the grammar its request asks for, the CLI's
--json-schema and --grammar, and compiling any of them on SmolLM2's vocabulary. Whatever the
input: a result or a one-line error of at most 300 characters, never another exception, a crash
or an unbounded time."""

from __future__ import annotations

import json
import os
import string

from hypothesis import HealthCheck, given, settings, strategies as st

from llamaspec.openai import completions
from llamaspec.errors import LlamaspecError
from llamaspec.server.app import BadRequest, parse
from llamaspec.server.schemas import ChatRequest, CompletionRequest

from conftest import run

# A fixed seed and 120 examples a property; LLAMASPEC_FUZZ=N runs N examples a property from a random seed.
EXAMPLES = int(os.environ.get("LLAMASPEC_FUZZ", "0"))
FUZZ = settings(derandomize=not EXAMPLES, database=None, deadline=None, max_examples=EXAMPLES or 120,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# --- strategies ------------------------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=False),
                    st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                      max_leaves=12)
names = st.sampled_from(["a", "b", "c", "name", "x y", "é", ""])
regexes = st.text(alphabet="ab()[]{}*+?|^$.\\-0123456789,", max_size=12)
numbers = st.one_of(st.integers(-3, 10**10), st.floats(-3, 1e6, allow_nan=False), st.text(max_size=3))
TYPES = ["object", "array", "string", "integer", "number", "boolean", "null", "objec", 7]
# a value of the wrong shape for any keyword
junk = st.sampled_from([5, -1, 10**30, 1.5, "a", True, None, [], [1], [["a"]], [None], {}, {"a": 1}, [{"a": 1}]])


def schemas() -> st.SearchStrategy:
    """JSON schemas, mostly valid, with every keyword the conversion reads, in shapes and sizes it
    may not expect."""
    def keywords(inner: st.SearchStrategy) -> st.SearchStrategy:
        optional = {
            "type": st.one_of(st.sampled_from(TYPES), st.lists(st.sampled_from(TYPES), max_size=3)),
            "properties": st.dictionaries(names, inner, max_size=4),
            "required": st.lists(names, max_size=3),
            "additionalProperties": st.one_of(st.booleans(), inner),
            "items": st.one_of(st.booleans(), inner), "prefixItems": st.lists(inner, max_size=3),
            "minItems": numbers, "maxItems": numbers, "minLength": numbers, "maxLength": numbers,
            "minimum": numbers, "maximum": numbers, "pattern": regexes,
            "format": st.sampled_from(["date", "date-time", "email", "uuid", "bogus"]),
            "enum": st.lists(values, max_size=5), "const": values,
            "anyOf": st.lists(inner, max_size=3), "oneOf": st.lists(inner, max_size=3),
            "allOf": st.lists(inner, max_size=2), "not": inner,
            "$ref": st.sampled_from(["#", "#/$defs/d", "#/$defs/missing", "#/properties/a", "other.json#", "#/~1"]),
            "$defs": st.fixed_dictionaries({"d": inner}),
        }
        return st.fixed_dictionaries({}, optional={key: st.one_of(shape, junk) for key, shape in optional.items()})
    return st.recursive(st.one_of(st.booleans(), st.just({}), st.sampled_from([{"type": t} for t in TYPES])),
                        keywords, max_leaves=8)


RULE = st.sampled_from(["root", "x", "y", "item", "ws", "a-b", "9"])
ATOM = st.one_of(RULE, st.sampled_from(['"a"', '"\\n"', "[a-z]", "[^\"]", "[]", '"', "(", ")", "x*", "y+", "ws?",
                                        "{2,3}", "{0,}", "{5}", "|", ".", "\\x41", "[\\u00e9]", "# note\n", "::=",
                                        '"é"', "[a-\\z]"]))
gbnf = st.lists(st.tuples(RULE, st.lists(ATOM, min_size=0, max_size=6)), min_size=0, max_size=5).map(
    lambda rules: "\n".join(f"{name} ::= {' '.join(body)}" for name, body in rules))


def assert_refused_well(error: Exception) -> None:
    assert isinstance(error, LlamaspecError), repr(error)
    message = str(error)
    assert message and "\n" not in message and len(message) <= 300, message


# --- the properties ----------------------------------------------------------------------------


@FUZZ
@given(body=st.one_of(
    st.fixed_dictionaries({"messages": st.just([{"role": "user", "content": "hi"}])}, optional={
        "response_format": st.one_of(values, st.fixed_dictionaries({
            "type": st.sampled_from(["json_schema", "json_object", "text", "xml"]),
            "json_schema": st.fixed_dictionaries({"name": st.just("x"), "schema": st.one_of(schemas(), values)})})),
        "json_schema": st.one_of(schemas(), values), "grammar": st.one_of(gbnf, values),
        "logit_bias": values, "stop": values, "tools": values, "tool_choice": values,
        "n": values, "temperature": values}),
    values))
def test_any_chat_body_parses_to_its_grammar_or_is_a_400(body):
    try:
        request = parse(json.dumps(body).encode(), ChatRequest)
        grammar = completions.grammar_asked(request.arguments(), chat=True)
        if grammar is not None:
            grammar.check()
    except BadRequest as e:
        assert "\n" not in str(e) and str(e)
    except Exception as e:  # noqa: BLE001
        assert_refused_well(e)


@FUZZ
@given(raw=st.one_of(st.binary(max_size=60), st.text(max_size=60).map(str.encode),
                     st.integers(0, 3000).map(lambda n: b'{"prompt": "x", "x": ' + b"[" * n + b"]" * n + b"}")))
def test_any_bytes_are_a_completion_request_or_a_400(raw):
    try:
        parse(raw, CompletionRequest)
    except BadRequest as e:
        assert "\n" not in str(e) and str(e)


@settings(derandomize=True, database=None, deadline=None, max_examples=25)
@given(value=st.one_of(st.text(alphabet=string.printable, max_size=30), schemas().map(json.dumps)),
       option=st.sampled_from(["--json-schema", "--grammar"]))
def test_the_cli_s_grammar_options_are_checked_or_one_line(tmp_path_factory, value, option):
    missing = tmp_path_factory.getbasetemp() / "no-such-model.gguf"
    result = run("generate", "-m", str(missing), "-p", "hi", option, value)
    assert result.exit_code != 0 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) <= 300 + len("error: "), result.stderr
