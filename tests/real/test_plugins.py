"""A draft source of one's own, examples/custom_source.py, without touching the package: from the
command line (``--source FILE`` and its own option), from Python (``sources=[...]``) and as an
installed package's entry point; its text is the target's own, and its bad input one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import llamaspec
from llamaspec import ConfigError

from conftest import ROOT, SMOL, THREADS, run
from checks import check_greedy, console_script

EXAMPLE = ROOT / "examples" / "custom_source.py"
PHRASE = "the lighthouse keeper climbed the one hundred and twelve steps to wind the clockwork of the great lamp"
PROMPT = f"Repeat after me: {PHRASE}.\nMe: the lighthouse keeper climbed"  # SmolLM2 goes on with the phrase


@pytest.fixture(scope="module")
def phrases(tmp_path_factory):
    path = tmp_path_factory.mktemp("phrases") / "phrases.txt"
    path.write_text(PHRASE + "\nanother phrase that never comes up\n")
    return path


def test_from_python_it_proposes_its_phrase_and_the_text_stays_the_target_s(smol, phrases, smol_plain, reference):
    spec = llamaspec.load(smol, sources=[str(EXAMPLE)], spec="phrases", phrases_file=str(phrases),
                          phrases_min_match=2, n_threads=THREADS, progress=False)
    try:
        assert spec.spec_name == "phrases"
        ours = spec.generate(PROMPT, max_tokens=40, temperature=0)
        plain = smol_plain.generate(PROMPT, max_tokens=40, temperature=0)
        assert ours.stats.sources["phrases"].accepted > 0, ours.stats.sources
        check_greedy(reference(SMOL), spec.tokenize(PROMPT), plain.tokens, ours.tokens, "phrases", n=40)
    finally:
        spec.close()


def test_from_the_command_line_with_its_own_option(smol, phrases, smol_plain):
    result = run("generate", "-m", smol, "-t", str(THREADS), "-n", "24", "--temp", "0", "--json", "--spec",
                 "phrases", "--source", str(EXAMPLE), "--phrases", str(phrases), "-p", PROMPT)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["stats"]["sources"]["phrases"]["accepted"] > 0 and out["stats"]["strategy"] == "phrases"
    assert out["tokens"] == smol_plain.generate(PROMPT, max_tokens=24, temperature=0).tokens[:len(out["tokens"])]


def test_its_bad_input_is_one_line(smol, tmp_path):
    cases = [(["--source", str(EXAMPLE), "--phrases", str(tmp_path / "none.txt")], "phrase file"),
             (["--source", str(EXAMPLE), "--phrases-min-match", "0", "--phrases", str(EXAMPLE)],
              "--phrases-min-match must be >= 1"),
             (["--source", str(tmp_path / "no_such_source.py")], "no such source file"),
             (["--source", "os"], "declares no draft source"),
             (["--phrases", "x.txt"], "no such option: --phrases"),
             (["--source", str(EXAMPLE), "--spec", "phrases"], "the phrases source needs a phrase file (--phrases)")]
    for args, fragment in cases:
        result = run("generate", "-m", str(tmp_path / "not-loaded.gguf"), "-p", "hi", *args)
        assert result.exit_code != 0 and "Traceback" not in result.output, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], (args, result.stderr)
    with pytest.raises(ConfigError, match="no draft source has the setting 'phrase_file'"):
        llamaspec.load(str(tmp_path / "not-loaded.gguf"), sources=[str(EXAMPLE)], phrase_file="x")


def test_an_installed_package_s_source_is_found_by_its_entry_point(smol, phrases, tmp_path):
    """A package (here a module on the path and its dist-info) declaring the source in the entry
    points ``llamaspec.sources``: its options are flags of generate without --source."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "phrases_plugin.py").write_text(EXAMPLE.read_text())
    info = site / "phrases_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: phrases-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[llamaspec.sources]\nphrases = phrases_plugin\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    shown = subprocess.run([console_script(), "generate", "--help"], capture_output=True, text=True, env=env)
    assert shown.returncode == 0 and "--phrases" in shown.stdout and "phrases" in shown.stdout
    done = subprocess.run([console_script(), "generate", "-m", smol, "-t", str(THREADS), "-n", "16", "--temp", "0",
                           "--json", "--spec", "phrases", "--phrases", str(phrases), "-p", PROMPT],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stats"]["sources"]["phrases"]["drafted"] > 0
    assert sys.modules.get("phrases_plugin") is None  # this process is untouched
