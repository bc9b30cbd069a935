"""A JSON schema as a grammar (llguidance's Lark), with the texts llama.cpp's own conversion
allows, so that constrained greedy text is llama.cpp's.

What llama.cpp's json-schema-to-grammar allows, and so this:

    whitespace (``sp``: nothing, a space, or one or two newlines then up to 20 spaces or tabs)
        after ``{``, ``[``, ``,`` and ``:``, between a listed key and its colon, and before
        ``}`` and ``]``; nowhere else (not after a value, not after the whole text)
    an object that lists its properties: its required ones in the schema's order, then any of
        its optional ones, in the schema's order; no others unless ``additionalProperties`` says
    strings of llama.cpp's characters (escapes ``\\" \\\\ \\b \\f \\n \\r \\t \\uXXXX``), numbers of at most
        16 integral and 16 fractional digits

    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    ->  "{" sp "\\"a\\"" sp ":" sp STRING sp "}"

Schemas whose every text this module does not spell out itself (numeric ranges, patterns,
formats, ``allOf``, objects with extra properties beside listed ones) are handed to llguidance's
own JSON compiler for that value (``%json``), with the same whitespace.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Sequence

from ..errors import GrammarError

SPACE = r"/ |\n{1,2}[ \t]{0,20}/"
STRING = r'/"(?:[^"\\\x7F\x00-\x1F]|\\(?:["\\bfnrt]|u[0-9a-fA-F]{4}))*"/'
INTEGER = r"/-?(?:0|[1-9][0-9]{0,15})/"
NUMBER = r"/-?(?:0|[1-9][0-9]{0,15})(?:\.[0-9]{1,16})?(?:[eE][-+]?(?:0|[1-9][0-9]{0,15}))?/"
CHAR = r'(?:[^"\\\x7F\x00-\x1F]|\\(?:["\\bfnrt]|u[0-9a-fA-F]{4}))'
# JSON's whitespace as llama.cpp places it, for values handed to llguidance's compiler
JSON_SPACE = r"(?:[ ]?|\n{1,2}[ \t]{0,20})"

# Any JSON value, as llama.cpp's primitive rules spell it (keys of a free object: no space before the colon).
GENERIC = """
value: object | array | STRING | NUMBER | "true" | "false" | "null"
object: "{" sp (STRING ":" sp value ("," sp STRING ":" sp value)*)? sp "}"
array: "[" sp (value ("," sp value)*)? sp "]"
"""
# Keywords that only describe (they allow every text they are found on).
DESCRIPTIVE = {"title", "description", "$schema", "$id", "$comment", "examples", "default", "name", "strict",
               "readOnly", "writeOnly", "deprecated", "$defs", "definitions"}


def to_lark(schema: Mapping[str, Any]) -> str:
    """The Lark grammar of the JSON texts ``schema`` allows (GrammarError for what it cannot say)."""
    return _Converter(schema).grammar()


class _Converter:
    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.root = schema
        self.rules: Dict[str, str] = {}
        self.refs: Dict[str, str] = {}  # "#/$defs/x" -> its rule's name
        self.generic = False

    def grammar(self) -> str:
        body = self.value(self.root)
        lines = ["start: " + body, f"sp: ({SPACE})?", f"STRING: {STRING}", f"NUMBER: {NUMBER}",
                 f"INTEGER: {INTEGER}"]
        lines += [f"{name}: {rule}" for name, rule in self.rules.items()]
        return "\n".join(lines) + "\n" + (GENERIC if self.generic else "")

    def rule(self, body: str) -> str:
        name = f"r{len(self.rules)}"
        self.rules[name] = body
        return name

    def value(self, schema: Any) -> str:
        """An expression of the texts ``schema`` allows."""
        if schema is True or schema == {}:
            return self.any()
        if schema is False:
            raise GrammarError("the JSON schema allows nothing (false)")
        if not isinstance(schema, Mapping):
            raise GrammarError(f"a JSON schema is an object or a boolean, got {json.dumps(schema)}")
        if "$ref" in schema:
            return self.ref(schema["$ref"])
        if "const" in schema:
            return _literal(schema["const"])
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise GrammarError("a JSON schema's enum is a non-empty list")
            return "(" + " | ".join(_literal(v) for v in values) + ")"
        for key in ("anyOf", "oneOf"):
            if key in schema:
                options = schema[key]
                if not isinstance(options, list) or not options:
                    raise GrammarError(f"a JSON schema's {key} is a non-empty list")
                return "(" + " | ".join(self.value(_merged(schema, key, o)) for o in options) + ")"
        kind = schema.get("type")
        if isinstance(kind, list):
            return "(" + " | ".join(self.value({**schema, "type": k}) for k in kind) + ")"
        if kind is None and ("properties" in schema or "additionalProperties" in schema):
            kind = "object"
        if kind is None and ("items" in schema or "prefixItems" in schema):
            kind = "array"
        if "allOf" in schema or "not" in schema or "if" in schema:
            return self.delegated(schema)
        if kind == "object":
            return self.object(schema)
        if kind == "array":
            return self.array(schema)
        if kind == "string":
            return self.string(schema)
        if kind in ("integer", "number"):
            if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
                return self.delegated(schema)
            return "INTEGER" if kind == "integer" else "NUMBER"
        if kind == "boolean":
            return '("true" | "false")'
        if kind == "null":
            return '"null"'
        if kind is None:
            return self.any()
        raise GrammarError(f"unknown type {kind!r} in the JSON schema")

    def any(self) -> str:
        self.generic = True
        return "value"

    def ref(self, ref: Any) -> str:
        if ref not in self.refs:
            if not isinstance(ref, str) or not ref.startswith("#"):
                raise GrammarError(f"only references within the schema (#/...) are supported, not {ref!r}")
            target: Any = self.root
            for part in [p for p in ref[1:].split("/") if p]:
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, Mapping) or part not in target:
                    raise GrammarError(f"the reference {ref} points to nothing in the JSON schema")
                target = target[part]
            name = self.refs[ref] = self.rule("")  # named first: a schema may refer to itself
            self.rules[name] = self.value(target)
        return self.refs[ref]

    def object(self, schema: Mapping[str, Any]) -> str:
        properties = schema.get("properties") or {}
        if not isinstance(properties, Mapping):
            raise GrammarError("a JSON schema's properties is an object")
        required = set(schema.get("required") or ())
        unknown = sorted(required - set(properties))
        extra = schema.get("additionalProperties", not properties)
        if unknown and extra is False:
            raise GrammarError(f"the JSON schema requires {unknown[0]!r}, which is not among its properties")
        if unknown:  # a required key among the others
            return self.delegated(schema)
        if not properties:
            if extra is False:
                return '"{" sp "}"'
            if extra is True or extra == {}:
                self.generic = True
                return "object"
            value = self.value(extra)  # a map: free keys, one schema for every value
            pair = f'STRING ":" sp {value}'
            return self.rule(f'"{{" sp ({pair} ("," sp {pair})*)? sp "}}"')
        if extra is not False:
            return self.delegated(schema)
        kv = {name: self.rule(f'{_literal(name)} sp ":" sp {self.value(sub)}') for name, sub in properties.items()}
        needed = [kv[n] for n in properties if n in required]
        optional = [kv[n] for n in properties if n not in required]
        body = ' "," sp '.join(needed)
        if optional:
            rest = self.optional(optional)
            body = f'{body} ("," sp ({rest}))?' if needed else f"({rest})?"
        return self.rule(f'"{{" sp {body} sp "}}"')

    def optional(self, kvs: Sequence[str]) -> str:
        """Any non-empty run of ``kvs`` in their order, comma-separated."""
        rests: List[str] = []
        tail = ""
        for kv in reversed(kvs[1:]):  # rest_i: the optional ones after kv_i
            tail = self.rule(f'("," sp {kv})?' + (f" {tail}" if tail else ""))
            rests.insert(0, tail)
        options = [f"{kv} {rests[i]}" if i < len(rests) else kv for i, kv in enumerate(kvs)]
        return " | ".join(options)

    def array(self, schema: Mapping[str, Any]) -> str:
        prefix = schema.get("prefixItems")
        if prefix is not None:
            if not isinstance(prefix, list):
                raise GrammarError("a JSON schema's prefixItems is a list")
            if schema.get("items", False) is not False:
                return self.delegated(schema)
            items = ' "," sp '.join(self.value(s) for s in prefix)
            return self.rule(f'"[" sp {items} sp "]"')
        item = self.value(schema.get("items", True))
        low = int(schema.get("minItems", 0))
        high = schema.get("maxItems")
        if high is not None and int(high) < low:
            raise GrammarError(f"the JSON schema's maxItems {high} is below its minItems {low}")
        return self.rule(f'"[" sp {_repeat(item, low, None if high is None else int(high))} sp "]"')

    def string(self, schema: Mapping[str, Any]) -> str:
        if "pattern" in schema or "format" in schema:
            return self.delegated(schema)
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        if low == 0 and high is None:
            return "STRING"
        if high is not None and int(high) < low:
            raise GrammarError(f"the JSON schema's maxLength {high} is below its minLength {low}")
        count = f"{{{low},}}" if high is None else f"{{{low},{int(high)}}}"
        name = f"S{len(self.rules)}"
        self.rules[name] = f'/"{CHAR}{count}"/'
        return name

    def delegated(self, schema: Mapping[str, Any]) -> str:
        """The value by llguidance's JSON compiler, with llama.cpp's whitespace."""
        guided = {**schema, "x-guidance": {"whitespace_pattern": JSON_SPACE}}
        for key in ("$defs", "definitions"):  # what its references point to
            if key in self.root and key not in guided:
                guided[key] = self.root[key]
        return self.rule(f"%json {json.dumps(guided)}")


def _repeat(item: str, low: int, high: "int | None") -> str:
    """``low`` to ``high`` (None: any number of) ``item``s, comma-separated."""
    if high == 0:
        return ""
    after = max(low - 1, 0)  # items after the first, at least
    if high is None:
        count = f"{{{after},}}" if after else "*"
    else:
        count = f"{{{after},{high - 1}}}" if high > 1 else ""
    run = item + (f' ("," sp {item}){count}' if count else "")
    return run if low > 0 else f"({run})?"


def _merged(parent: Mapping[str, Any], key: str, option: Any) -> Any:
    """An ``anyOf``/``oneOf`` option with what its parent says besides (its type, its properties)."""
    rest = {k: v for k, v in parent.items() if k != key and k not in DESCRIPTIVE}
    if not rest or not isinstance(option, Mapping):
        return option
    return {**rest, **option}


def _literal(value: Any) -> str:
    """A JSON value's compact text (as llama.cpp writes a const) as a Lark string literal."""
    return json.dumps(json.dumps(value, separators=(",", ":"), ensure_ascii=False), ensure_ascii=False)
