"""Whether a grammar (llguidance's Lark) allows any finite text at all.

    finite('start: "a" start')         # False: every text goes on with another "a"
    finite('start: "a" start | "b"')   # True

The grammar engine compiles ``root ::= "a" root`` and follows it: every step allows another "a"
and none allows the end, so a generation fails only once the text forced grows past its limits,
mid-stream. A grammar is refused up front when its start rule is not *productive*: a rule is
productive when one of its alternatives is made only of terminals, optional parts and productive
rules. The rules are read into an and/or graph and the productive ones found by propagation
from the terminals, each node once, so a chain of many thousands of rules takes no longer than
reading it.

The text read is what the engine has just compiled (a GBNF grammar's conversion, a JSON
schema's, the tool calls'), read by the compiler after its worker compiled it (``compiler.py``):
what this reader does not understand in a rule (llguidance's parametric rules, a rule with
``stop`` or ``max_tokens``, a group nested too deeply to read) makes that rule productive, so the
check refuses a grammar only when it is sure.
"""

from __future__ import annotations

import re
from typing import Dict, Iterator, List, Optional, Tuple

TRUE, AND, OR = "true", "and", "or"

_TOKENS = re.compile(r"""
    (?P<space>\s+|//[^\n]*)
  | (?P<string>"(?:\\.|[^"\\\n])*"i?)
  | (?P<regex>/(?!/)(?:\\.|[^/\\\n])+/[imslux]*)
  | (?P<special><[^<>\n]*>)
  | (?P<directive>%\w+)
  | (?P<ref>@\w+)
  | (?P<name>[?!]?\w+)
  | (?P<punct>\.\.|->|::|[:|()\[\]?*+~{},.=&\#-])
""", re.VERBOSE)

Token = Tuple[str, str]  # (kind, text); kind "block": a directive with its JSON ("%json {...}")


class _Unreadable(Exception):
    """A rule this reader does not understand (it is then taken for productive)."""


def finite(lark: str) -> bool:
    """Whether ``lark`` (a grammar the engine compiled, its start rule ``start``) allows some
    finite text; True where it cannot tell (no ``start`` rule, syntax it does not read)."""
    graph = _Graph()
    for statement in _rules(lark):
        _read(_tokens(statement), graph)
    if "start" not in graph.rules:
        return True
    return graph.productive()[graph.rules["start"]]


_RULE_HEAD = re.compile(r"[?!]?_*[a-z]\w*\s*[.:\[{]")


def _rules(lark: str) -> Iterator[str]:
    """The text of each rule: a line that starts with a rule's name, and the lines after it that
    go on with ``|`` (more alternatives; Lark allows a newline nowhere else in a rule, and what
    is cut short there reads as unreadable, so productive). Terminals and directives are left
    out unread: most of a big grammar's text is its terminals."""
    rule: List[str] = []
    for line in lark.split("\n"):
        stripped = line.lstrip()
        if not stripped or stripped.startswith("//"):
            continue
        if stripped.startswith("|"):
            if rule:
                rule.append(line)
            continue
        if rule:
            yield "\n".join(rule)
        rule = [line] if _RULE_HEAD.match(stripped) else []
    if rule:
        yield "\n".join(rule)


def _tokens(text: str) -> List[Token]:
    """``text``'s tokens, spaces and comments left out; a ``%directive {json}`` is one block token
    and a character nothing else reads is an ``other`` token."""
    tokens: List[Token] = []
    at = 0
    while at < len(text):
        found = _TOKENS.match(text, at)
        if found is None:
            tokens.append(("other", text[at]))
            at += 1
            continue
        kind, at = found.lastgroup or "other", found.end()
        if kind == "directive":
            start = _skip_spaces(text, at)
            if start < len(text) and text[start] == "{":
                at = _after_braces(text, start)
                kind = "block"
        if kind != "space":
            tokens.append((kind, found.group()))
    return tokens


def _skip_spaces(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


def _after_braces(text: str, start: int) -> int:
    """The end of the JSON object at ``start`` (its strings may hold braces), or of the text."""
    depth, in_string, at = 0, False, start
    while at < len(text):
        c = text[at]
        if in_string:
            if c == "\\":
                at += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return at + 1
        at += 1
    return at


def _read(statement: List[Token], graph: "_Graph") -> None:
    """A rule's alternatives into ``graph`` (terminals add none: they cannot be recursive, and
    one allows some text unless its regex allows none, which the engine refuses itself)."""
    kind, name = statement[0]
    if kind != "name" or not _is_rule(name):
        return
    name = name.lstrip("?!")
    head = 1
    if statement[head:head + 2] and statement[head] == ("punct", ".") and statement[head + 1][0] == "name":
        head += 2  # a priority: name.2
    if statement[head:head + 1] != [("punct", ":")]:
        graph.define(name, graph.node(TRUE))  # attributes ([stop=..., max_tokens=...]) or parameters
        return
    reader = _Reader(statement[head + 1:], graph)
    try:
        node = reader.alternatives()
        if not reader.done():
            raise _Unreadable
    except (_Unreadable, RecursionError):
        node = graph.node(TRUE)
    graph.define(name, node)


def _is_rule(name: str) -> bool:
    """A rule's name is lower case (``_inlined``, ``?inlined``), a terminal's upper case."""
    bare = name.lstrip("?!_")
    return bool(bare) and bare[0].isalpha() and bare[0].islower()


class _Graph:
    """An and/or graph: a rule is the OR of its alternatives, an alternative the AND of its parts,
    a terminal or an optional part TRUE."""

    def __init__(self) -> None:
        self.kinds: List[str] = []
        self.children: List[List[int]] = []
        self.rules: Dict[str, int] = {}
        self.defined: Dict[str, bool] = {}

    def node(self, kind: str, children: Optional[List[int]] = None) -> int:
        self.kinds.append(kind)
        self.children.append(children or [])
        return len(self.kinds) - 1

    def rule(self, name: str) -> int:
        """The node of the rule ``name`` (an OR of its definitions, made at its first mention)."""
        if name not in self.rules:
            self.rules[name] = self.node(OR)
        return self.rules[name]

    def define(self, name: str, node: int) -> None:
        self.children[self.rule(name)].append(node)
        self.defined[name] = True

    def productive(self) -> List[bool]:
        """Each node's productivity: found from the TRUE nodes (and rules never defined, which the
        engine refuses itself) up through their parents."""
        for name, node in self.rules.items():
            if name not in self.defined:
                self.kinds[node] = TRUE
        parents: List[List[int]] = [[] for _ in self.kinds]
        missing = [0] * len(self.kinds)
        for node, children in enumerate(self.children):
            for child in children:
                parents[child].append(node)
            missing[node] = len(children) if self.kinds[node] == AND else 1
        good = [kind == TRUE or (kind == AND and not missing[n]) for n, kind in enumerate(self.kinds)]
        queue = [n for n, g in enumerate(good) if g]
        while queue:
            for parent in parents[queue.pop()]:
                if good[parent]:
                    continue
                missing[parent] -= 1
                if missing[parent] <= 0:
                    good[parent] = True
                    queue.append(parent)
        return good


class _Reader:
    """A rule's body, read into the graph by recursive descent."""

    def __init__(self, tokens: List[Token], graph: _Graph) -> None:
        self.tokens, self.graph, self.at = tokens, graph, 0

    def done(self) -> bool:
        return self.at == len(self.tokens)

    def peek(self) -> Token:
        return self.tokens[self.at] if self.at < len(self.tokens) else ("end", "")

    def take(self, expected: Optional[str] = None) -> Token:
        token = self.peek()
        if token[0] == "end" or (expected is not None and token[1] != expected):
            raise _Unreadable
        self.at += 1
        return token

    def alternatives(self) -> int:
        options = [self.sequence()]
        while self.peek() == ("punct", "|"):
            self.take()
            options.append(self.sequence())
        return self.graph.node(OR, options)

    def sequence(self) -> int:
        parts = []
        while self.peek()[0] != "end" and self.peek()[1] not in ("|", ")", "]"):
            if self.peek() == ("punct", "->"):  # an alias names the alternative
                self.take()
                self.take()
                continue
            parts.append(self.item())
        return self.graph.node(AND, parts)

    def item(self) -> int:
        node = self.atom()
        while True:
            kind, text = self.peek()
            if kind != "punct" or text not in ("?", "*", "+", "~", "{"):
                return node
            self.take()
            if text in ("?", "*"):
                node = self.graph.node(TRUE)
            elif text in ("~", "{"):
                node = node if self.repeats_at_least_once(text) else self.graph.node(TRUE)

    def repeats_at_least_once(self, opened: str) -> bool:
        """Reads ``~ n``, ``~ n..m``, ``{n}`` or ``{n,m}``: whether n > 0."""
        kind, low = self.take()
        if kind != "name" or not low.isdigit():
            raise _Unreadable
        while opened == "{" and self.take()[1] != "}":
            pass
        if opened == "~" and self.peek() == ("punct", ".."):
            self.take()
            self.take()
        return int(low) > 0

    def atom(self) -> int:
        kind, text = self.take()
        if (kind, text) == ("punct", "("):
            node = self.alternatives()
            self.take(")")
            return node
        if (kind, text) == ("punct", "["):
            self.alternatives()
            self.take("]")
            return self.graph.node(TRUE)
        if kind in ("string", "regex", "special", "block", "ref"):
            if kind == "string" and self.peek() == ("punct", ".."):  # a range: "a".."z"
                self.take()
                self.take()
            return self.graph.node(TRUE)
        if kind == "name" and text[0] not in "?!" and not text[0].isdigit():
            return self.graph.rule(text) if _is_rule(text) else self.graph.node(TRUE)
        raise _Unreadable
