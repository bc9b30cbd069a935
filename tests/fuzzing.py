"""What the grammar fuzz tests (tests/unit and tests/real) generate: JSON values, JSON schemas
with every keyword the conversion reads, GBNF texts; their Hypothesis settings; and the check
that a refusal is one line of at most 300 characters."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings, strategies as st

from llamaspec.errors import LlamaspecError

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
