"""A draft source that fails is dropped, not the answer: one that raises in propose or learn
mid-generation, proposes garbage (a list, a token that is no token id, evidence it declares no
prior for) or takes seconds an ask is turned off for the rest of the text with one warning
naming it and the error, and the greedy text is the plain one, through Python, the command
line and the server (tests/data/faulty_source.py goes wrong on purpose). One that calls
sys.exit at import is one line of error."""

from __future__ import annotations

import json
import re

import pytest

import llamaspec
from llamaspec import ConfigError
from llamaspec.errors import LlamaspecWarning
from llamaspec.sources import installed_registry

from conftest import DATA, SMOL, THREADS, run
from checks import Server, check_greedy

FAULTY = DATA / "faulty_source.py"
PROMPT = "Count on: one two three four, one two three four, one two three four, one two"
N = 16
TURNED_OFF = "the faulty draft source is turned off for this text: "


@pytest.fixture(scope="module")
def plain(smol_plain):
    return smol_plain.generate(PROMPT, max_tokens=N, temperature=0)


@pytest.mark.parametrize("mode, error", [
    ("raise", "RuntimeError: the faulty source broke"),
    ("list", "ValueError: proposed a list, not a Proposal"),
    ("token", "ValueError: proposed -7, which is no token id"),
    ("vocab", "ValueError: proposed 10000000, which is no token id"),
    ("evidence", "UnknownEvidence: \"the faulty source gave evidence 'undeclared', which it declares no prior for\""),
    ("learn", "KeyError: \"the faulty source's learning broke\""),
    ("slow", "one ask took 3.0 s, over 100 decodes of the target"),  # (or 3.1 s: a busy machine)
])
def test_in_python_a_failing_source_is_one_warning_and_the_text_is_plain(make_spec, plain, reference, mode, error):
    spec = make_spec(SMOL, spec="faulty", registry=installed_registry([FAULTY]), faulty_mode=mode,
                     faulty_after=0 if mode == "slow" else 2)
    with pytest.warns(LlamaspecWarning) as caught:
        result = spec.generate(PROMPT, max_tokens=N, temperature=0)
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and re.fullmatch(re.escape(TURNED_OFF + error).replace("3\\.0", r"3\.\d"), said[0]), said
    check_greedy(reference(SMOL), spec.tokenize(PROMPT), plain.tokens, result.tokens, f"faulty, {mode}", n=N)
    if mode != "slow":  # it drafted before it failed
        assert result.stats.sources["faulty"].drafted > 0


@pytest.mark.parametrize("mode, error", [("raise", "RuntimeError: the faulty source broke"),
                                         ("list", "ValueError: proposed a list, not a Proposal")])
def test_from_the_command_line_the_text_is_plain_with_one_warning_line(smol, plain, mode, error):
    result = run("generate", "-m", smol, "-t", str(THREADS), "-n", str(N), "--temp", "0", "--json", "--spec", "faulty",
                 "--source", str(FAULTY), "--faulty-mode", mode, "-p", PROMPT)
    assert result.exit_code == 0, result.output
    assert [line for line in result.stderr.splitlines() if "faulty" in line] == [f"warning: {TURNED_OFF}{error}"]
    tokens = json.loads(result.stdout)["tokens"]
    assert tokens == plain.tokens[:len(tokens)] and len(tokens) == N


@pytest.mark.parametrize("mode, error", [("raise", "RuntimeError: the faulty source broke"),
                                         ("token", "ValueError: proposed -7, which is no token id")])
def test_the_server_answers_200_with_the_plain_text_and_logs_the_source(smol, plain, mode, error):
    server = Server("-m", smol, "-t", str(THREADS), "--spec", "faulty", "--source", str(FAULTY), "--faulty-mode", mode)
    try:
        status, body = server.request("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": N, "temperature": 0})
    finally:
        err = server.stop()
    assert status == 200, body
    assert body["choices"][0]["text"] == plain.text
    assert f"warning: {TURNED_OFF}{error}" in err.splitlines() and "Traceback" not in err, err


def test_a_source_that_exits_at_import_is_one_line_of_error(smol, tmp_path):
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(3)\n")
    result = run("generate", "-m", smol, "-p", "hi", "--source", str(exits))
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [f"error: cannot load a source from {exits}: SystemExit: 3"]
    with pytest.raises(ConfigError, match="cannot load a source from .*exits.py: SystemExit: 3"):
        llamaspec.load(smol, sources=[str(exits)])
