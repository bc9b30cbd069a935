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

An ``enum`` (or an ``anyOf`` of constants) is one lexeme of its values' texts, not a rule of
alternatives the parser would track one by one: MAX_VALUES values compile fast and cost
nothing per token. What the grammar engine follows too slowly is refused with its place
in the schema and the limit: more than MAX_DEPTH levels of nesting, MAX_VALUES values in an enum,
MAX_OPTIONS options in an ``anyOf``, MAX_OPTIONAL optional properties in an object (the parser
tracks every property that may come next: a token's mask costs more than linearly in their
number; docs/results.md, "Grammar limits and costs", has the costs).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Sequence

from ..errors import GrammarError, shown

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
# The limits on a schema's size: what compiles fast and keeps a token's mask cheap on a 2-core
# CPU (docs/results.md, "Grammar limits and costs").
MAX_DEPTH = 200  # schemas nested in one another (each a level of recursion here)
MAX_VALUES = 50_000  # values in one enum
MAX_OPTIONS = 2_000  # options of one anyOf/oneOf that are not all constants
MAX_OPTIONAL = 2_500  # optional properties of one object
DESCRIPTIVE = {"title", "description", "$schema", "$id", "$comment", "examples", "default", "name", "strict",
               "readOnly", "writeOnly", "deprecated", "$defs", "definitions"}


def to_lark(schema: Mapping[str, Any]) -> str:
    """The Lark grammar of the JSON texts ``schema`` allows (GrammarError for what it cannot say;
    its ``where`` is the place in the schema, as ``properties.a.enum``)."""
    try:
        return _Converter(schema).grammar()
    except RecursionError:  # a guard: MAX_DEPTH stops nesting well before Python's limit
        raise GrammarError(f"the JSON schema is nested too deeply (at most {MAX_DEPTH} levels)") from None


def where(lark: str, line: int) -> str:
    """The place in the schema of the rule on ``line`` (1-based) of ``to_lark``'s grammar, as the
    grammar engine's errors name a line; "" where it is not one of a schema's own."""
    lines = lark.split("\n")
    if not 1 <= line <= len(lines):
        return ""
    head = lines[line - 1].split(":", 1)[0]
    marker = "// at "
    for text in lines:
        if text.startswith(marker) and text[len(marker):].startswith(head + " "):
            return text[len(marker) + len(head) + 1:]
    return ""


class _Converter:
    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.root = schema
        self.rules: Dict[str, str] = {}
        self.places: Dict[str, str] = {}  # a delegated rule -> its place in the schema
        self.refs: Dict[str, str] = {}  # "#/$defs/x" -> its rule's name
        self.generic = False

    def grammar(self) -> str:
        body = self.value(self.root, "", 0)
        lines = ["start: " + body, f"sp: ({SPACE})?", f"STRING: {STRING}", f"NUMBER: {NUMBER}",
                 f"INTEGER: {INTEGER}"]
        lines += [f"{name}: {rule}" for name, rule in self.rules.items()]
        lines += [f"// at {name} {place}" for name, place in self.places.items()]
        return "\n".join(lines) + "\n" + (GENERIC if self.generic else "")

    def rule(self, body: str) -> str:
        name = f"r{len(self.rules)}"
        self.rules[name] = body
        return name

    def value(self, schema: Any, at: str, depth: int) -> str:
        """An expression of the texts ``schema`` allows; ``at``: its place in the root schema,
        ``depth``: how many schemas it is nested in."""
        if depth > MAX_DEPTH:
            raise GrammarError(f"nested more than {MAX_DEPTH} levels deep; at most {MAX_DEPTH} are supported", at)
        if schema is True or schema == {}:
            return self.any()
        if schema is False:
            raise GrammarError("the JSON schema allows nothing (false)", at)
        if not isinstance(schema, Mapping):
            raise GrammarError(f"a JSON schema is an object or a boolean, got {shown(schema)}", at)
        if "$ref" in schema:
            return self.ref(schema["$ref"], at, depth)
        if "const" in schema:
            return _literal(schema["const"])
        if "enum" in schema:
            return self.literals(_values(schema["enum"], at), _join(at, "enum"), "an enum")
        for key in ("anyOf", "oneOf"):
            if key in schema:
                options = schema[key]
                if not isinstance(options, list) or not options:
                    raise GrammarError(f"a JSON schema's {key} is a non-empty list", at)
                merged = [_merged(schema, key, o) for o in options]
                values = _constants(merged)
                if values is not None:  # every option a constant: one lexeme of them all
                    return self.literals(values, _join(at, key), f"an {key} of constants")
                if len(options) > MAX_OPTIONS:
                    raise GrammarError(f"{len(options)} options; at most {MAX_OPTIONS} are supported "
                                       f"(or {MAX_VALUES} when every option is a const or enum)", _join(at, key))
                return "(" + " | ".join(self.value(o, f"{_join(at, key)}[{i}]", depth + 1)
                                        for i, o in enumerate(merged)) + ")"
        kind = schema.get("type")
        if isinstance(kind, list):
            return "(" + " | ".join(self.value({**schema, "type": k}, at, depth + 1) for k in kind) + ")"
        if kind is None and ("properties" in schema or "additionalProperties" in schema):
            kind = "object"
        if kind is None and ("items" in schema or "prefixItems" in schema):
            kind = "array"
        if "allOf" in schema or "not" in schema or "if" in schema:
            return self.delegated(schema, at)
        if kind == "object":
            return self.object(schema, at, depth)
        if kind == "array":
            return self.array(schema, at, depth)
        if kind == "string":
            return self.string(schema, at)
        if kind in ("integer", "number"):
            if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
                return self.delegated(schema, at)
            return "INTEGER" if kind == "integer" else "NUMBER"
        if kind == "boolean":
            return '("true" | "false")'
        if kind == "null":
            return '"null"'
        if kind is None:
            return self.any()
        raise GrammarError(f"unknown type {shown(kind)}", _join(at, "type"))

    def any(self) -> str:
        self.generic = True
        return "value"

    def literals(self, values: Sequence[Any], at: str, what: str) -> str:
        """Any of ``values`` (their compact texts): a lexeme of them all, which the parser reads as
        one token of the grammar however many there are."""
        if len(values) > MAX_VALUES:
            raise GrammarError(f"{what} of {len(values)} values; at most {MAX_VALUES} are supported", at)
        texts = list(dict.fromkeys(_literal(v) for v in values))
        if len(texts) == 1:
            return texts[0]
        name = f"L{len(self.rules)}"
        self.rules[name] = " | ".join(texts)
        return name

    def ref(self, ref: Any, at: str, depth: int) -> str:
        if not isinstance(ref, str) or ref not in self.refs:
            if not isinstance(ref, str) or not ref.startswith("#"):
                raise GrammarError(f"only references within the schema (#/...) are supported, not {shown(ref)}",
                                   _join(at, "$ref"))
            target: Any = self.root
            for part in [p for p in ref[1:].split("/") if p]:
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, Mapping) or part not in target:
                    raise GrammarError(f"the reference {shown(ref)} points to nothing in the JSON schema",
                                       _join(at, "$ref"))
                target = target[part]
            name = self.refs[ref] = self.rule("")  # named first: a schema may refer to itself
            self.rules[name] = self.value(target, ref[1:].strip("/").replace("/", "."), depth + 1)
        return self.refs[ref]

    def object(self, schema: Mapping[str, Any], at: str, depth: int) -> str:
        properties = schema.get("properties") or {}
        if not isinstance(properties, Mapping):
            raise GrammarError("a JSON schema's properties is an object", _join(at, "properties"))
        required = schema.get("required") or []
        if not isinstance(required, list) or not all(isinstance(n, str) for n in required):
            raise GrammarError("a JSON schema's required is a list of property names", _join(at, "required"))
        required = set(required)
        n_optional = sum(1 for n in properties if n not in required)
        if n_optional > MAX_OPTIONAL:
            raise GrammarError(f"{n_optional} optional properties; at most {MAX_OPTIONAL} are supported (list "
                               f"more of them in required, or split the object)", _join(at, "properties"))
        unknown = sorted(required - set(properties))
        extra = schema.get("additionalProperties", not properties)
        if unknown and extra is False:
            raise GrammarError(f"the JSON schema requires {shown(unknown[0])}, which is not among its properties",
                               _join(at, "required"))
        if unknown:  # a required key among the others
            return self.delegated(schema, at)
        if not properties:
            if extra is False:
                return '"{" sp "}"'
            if extra is True or extra == {}:
                self.generic = True
                return "object"
            value = self.value(extra, _join(at, "additionalProperties"), depth + 1)  # a map: one schema for every value
            pair = f'STRING ":" sp {value}'
            return self.rule(f'"{{" sp ({pair} ("," sp {pair})*)? sp "}}"')
        if extra is not False:
            return self.delegated(schema, at)
        inside = _join(at, "properties")
        kv = {name: self.rule(f'{_literal(name)} sp ":" sp {self.value(sub, _join(inside, name), depth + 1)}')
              for name, sub in properties.items()}
        needed = [kv[n] for n in properties if n in required]
        optional = [kv[n] for n in properties if n not in required]
        body = ' "," sp '.join(needed)
        if optional:
            rest = self.optional(optional)
            body = f'{body} ("," sp ({rest}))?' if needed else f"({rest})?"
        return self.rule(f'"{{" sp {body} sp "}}"')

    def optional(self, kvs: Sequence[str]) -> str:
        """Any non-empty run of ``kvs`` in their order, comma-separated (llama.cpp's rules: each
        one's rest is a chain of the ones after it)."""
        rests: List[str] = []
        tail = ""
        for kv in reversed(kvs[1:]):  # rest_i: the optional ones after kv_i
            tail = self.rule(f'("," sp {kv})?' + (f" {tail}" if tail else ""))
            rests.insert(0, tail)
        options = [f"{kv} {rests[i]}" if i < len(rests) else kv for i, kv in enumerate(kvs)]
        return " | ".join(options)

    def array(self, schema: Mapping[str, Any], at: str, depth: int) -> str:
        prefix = schema.get("prefixItems")
        if prefix is not None:
            if not isinstance(prefix, list):
                raise GrammarError("a JSON schema's prefixItems is a list", _join(at, "prefixItems"))
            if schema.get("items", False) is not False:
                return self.delegated(schema, at)
            items = ' "," sp '.join(self.value(s, f"{_join(at, 'prefixItems')}[{i}]", depth + 1)
                                    for i, s in enumerate(prefix))
            return self.rule(f'"[" sp {items} sp "]"')
        item = self.value(schema.get("items", True), _join(at, "items"), depth + 1)
        low = _count(schema, "minItems", 0, at)
        high = _count(schema, "maxItems", None, at)
        if high is not None and high < low:
            raise GrammarError(f"maxItems {high} is below minItems {low}", at)
        return self.rule(f'"[" sp {_repeat(item, low, high)} sp "]"')

    def string(self, schema: Mapping[str, Any], at: str) -> str:
        if "pattern" in schema or "format" in schema:
            return self.delegated(schema, at)
        low = _count(schema, "minLength", 0, at)
        high = _count(schema, "maxLength", None, at)
        if low == 0 and high is None:
            return "STRING"
        if high is not None and high < low:
            raise GrammarError(f"maxLength {high} is below minLength {low}", at)
        count = f"{{{low},}}" if high is None else f"{{{low},{high}}}"
        name = f"S{len(self.rules)}"
        self.rules[name] = f'/"{CHAR}{count}"/'
        return name

    def delegated(self, schema: Mapping[str, Any], at: str) -> str:
        """The value by llguidance's JSON compiler, with llama.cpp's whitespace."""
        guided = {**schema, "x-guidance": {"whitespace_pattern": JSON_SPACE}}
        for key in ("$defs", "definitions"):  # what its references point to
            if key in self.root and key not in guided:
                guided[key] = self.root[key]
        name = self.rule(f"%json {json.dumps(guided)}")
        self.places[name] = at
        return name


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


def _join(at: str, key: str) -> str:
    return f"{at}.{key}" if at else key


def _count(schema: Mapping[str, Any], key: str, default: "int | None", at: str) -> "int | None":
    value = schema.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
        raise GrammarError(f"{key} is a whole number of at least 0, got {shown(value)}", _join(at, key))
    return int(value)


def _values(values: Any, at: str) -> List[Any]:
    if not isinstance(values, list) or not values:
        raise GrammarError("a JSON schema's enum is a non-empty list", _join(at, "enum"))
    return values


def _constants(options: Sequence[Any]) -> "List[Any] | None":
    """The values of options that are all constants (``const`` or ``enum`` with nothing else
    that constrains), or None."""
    values: List[Any] = []
    for option in options:
        if not isinstance(option, Mapping):
            return None
        rest = set(option) - DESCRIPTIVE - {"const", "enum", "type"}
        if rest or ("const" in option) == ("enum" in option):
            return None
        found = [option["const"]] if "const" in option else option["enum"]
        if not isinstance(found, list) or not found:
            return None
        values += found
    return values


def _merged(parent: Mapping[str, Any], key: str, option: Any) -> Any:
    """An ``anyOf``/``oneOf`` option with what its parent says besides (its type, its properties)."""
    rest = {k: v for k, v in parent.items() if k != key and k not in DESCRIPTIVE}
    if not rest or not isinstance(option, Mapping):
        return option
    return {**rest, **option}


def _literal(value: Any) -> str:
    """A JSON value's compact text (as llama.cpp writes a const) as a Lark string literal."""
    return json.dumps(json.dumps(value, separators=(",", ":"), ensure_ascii=False), ensure_ascii=False)
