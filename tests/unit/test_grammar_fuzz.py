"""Property-based tests (Hypothesis, a fixed seed, a bounded number of examples) of what parses
schemas and grammars: the server's body parsing and the grammar its request asks for, the CLI's
--json-schema and --grammar, and compiling any of them on SmolLM2's vocabulary. Whatever the
input: a result or a one-line error of at most 300 characters, never another exception, a crash
or an unbounded time."""

from __future__ import annotations

import json
import string

from hypothesis import given, settings, strategies as st

from llamaspec.openai import completions
from llamaspec.server.app import BadRequest, parse
from llamaspec.server.schemas import ChatRequest, CompletionRequest

from conftest import run
from fuzzing import FUZZ, assert_refused_well, gbnf, schemas, values


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
