"""Hostile JSON schemas and grammars without a model: a crash of the grammar engine is one line
and the next grammar compiles; the CLI's --json-schema refused before any model loads, with the
server's message (on a vocabulary: tests/real/test_grammar_limits.py)."""

from __future__ import annotations

import pytest

from llamaspec.constraints import Grammar
from llamaspec.constraints.compiler import Compiler
from llamaspec.errors import GrammarError

from conftest import run


def props(n: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}


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
