"""A draft source of one's own, examples/custom_source.py, without touching the package: from the
command line (``--source FILE`` and its own option), from Python (``sources=[...]``) and as an
installed package's entry point; its text is the target's own, and its bad input one line.

Installed packages are real: built here (a pyproject.toml, an entry point) and pip-installed,
each into a folder of its own that the commands run find on PYTHONPATH (and this process on
sys.path), not into the virtual environment that other test sessions may be using at the same
time; the folders are removed after. A broken one (an ImportError, a sys.exit at import) is one
warning line and everything else works; LLAMASPEC_DISABLE_PLUGINS turns them off; a name clash
is one warning; ``llamaspec sources`` lists where each source comes from."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Dict

import pytest

import llamaspec
from llamaspec import ConfigError
from llamaspec.errors import LlamaspecWarning
from llamaspec.sources import installed_registry
from llamaspec.sources.registry import DISABLE, forget_installed

from conftest import DATA, ROOT, SMOL, THREADS, run
from checks import Server, check_greedy, console_script

EXAMPLE = ROOT / "examples" / "custom_source.py"
FAULTY = DATA / "faulty_source.py"
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


# --- installed packages --------------------------------------------------------------------------

CLASH = """from llamaspec import Plugin, Proposal, Source


class Nothing(Source):
    def propose(self, tokens, budget, sampling, rng):
        return Proposal()


PHRASES = Plugin(name="phrases", build=lambda setup, text: Nothing(), priors={"x": 0.5}, overall=0.5)
LOOKUP = Plugin(name="lookup", build=lambda setup, text: Nothing(), priors={"x": 0.5}, overall=0.5)
"""


def pip_installed(root: Path, name: str, version: str, modules: Dict[str, str], points: Dict[str, str]) -> Path:
    """The folder package ``name`` is pip-installed into, built from a pyproject.toml declaring
    ``points`` in the entry-point group llamaspec.sources and the ``modules`` (file -> text)."""
    src, site = root / f"{name}-src", root / f"{name}-site"
    src.mkdir()
    shutil.copy(DATA / "plugin_backend.py", src / "backend.py")
    for file, text in modules.items():
        (src / file).write_text(text)
    entries = "".join(f'{key} = "{value}"\n' for key, value in points.items())
    (src / "pyproject.toml").write_text(
        f'[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\n\n[project.entry-points."llamaspec.sources"]\n{entries}')
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet", "--target",
                           str(site), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return site


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """Four packages: one whose module fails to import, one that calls sys.exit at import, the
    example as a package, and one whose sources are named like the example's and a built-in."""
    root = tmp_path_factory.mktemp("packages")
    sites = {
        "broken": pip_installed(root, "llamaspec-test-broken", "1.0",
                                {"llamaspec_test_broken.py": "import no_such_module_for_llamaspec\n"},
                                {"broken": "llamaspec_test_broken"}),
        "exits": pip_installed(root, "llamaspec-test-exits", "1.0",
                               {"llamaspec_test_exits.py": "import sys\nsys.exit(3)\n"}, {"exits": "llamaspec_test_exits"}),
        "phrases": pip_installed(root, "llamaspec-test-phrases", "1.0",
                                 {"llamaspec_test_phrases.py": EXAMPLE.read_text()}, {"phrases": "llamaspec_test_phrases"}),
        "clash": pip_installed(root, "llamaspec-test-clash", "2.0", {"llamaspec_test_clash.py": CLASH},
                               {"phrases": "llamaspec_test_clash:PHRASES", "lookup": "llamaspec_test_clash:LOOKUP"}),
    }
    yield sites
    shutil.rmtree(root)  # (pip uninstall knows no --target: the folder is the installation)


def env_with(*sites: Path, **variables: str) -> Dict[str, str]:
    """This process's environment with the packages of ``sites`` installed, and ``variables``."""
    env = {k: v for k, v in os.environ.items() if k != DISABLE}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, sites), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**env, **variables}


def command(*args: str, env: Dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([console_script(), *args], capture_output=True, text=True, env=env, timeout=300)


def warned(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("warning: ")]


BROKEN = ("warning: the draft source 'broken' of llamaspec-test-broken 1.0 is not loaded: ModuleNotFoundError: "
          "No module named 'no_such_module_for_llamaspec'")
EXITS = "warning: the draft source 'exits' of llamaspec-test-exits 1.0 is not loaded: SystemExit: 3"


def test_import_and_version_run_no_installed_package_s_code(packages):
    """A package that exits at import would end either at once with its code 3."""
    env = env_with(packages["exits"], packages["broken"])
    version = command("--version", env=env)
    assert version.returncode == 0 and version.stderr == "" and "version" in version.stdout, version
    imported = subprocess.run([sys.executable, "-c", "import llamaspec, llamaspec.cli; print('ok')"],
                              capture_output=True, text=True, env=env, timeout=120)
    assert imported.returncode == 0 and imported.stdout == "ok\n", imported


def test_a_broken_package_is_one_warning_line_and_generate_works(packages, smol, phrases, smol_plain):
    """Beside two broken packages, the example's package drafts through its entry point: its
    options are flags of generate without --source, its text the target's."""
    env = env_with(packages["broken"], packages["exits"], packages["phrases"])
    shown = command("generate", "--help", env=env)
    assert shown.returncode == 0 and "--phrases" in shown.stdout and sorted(warned(shown.stderr)) == [BROKEN, EXITS]
    done = command("generate", "-m", smol, "-t", str(THREADS), "-n", "16", "--temp", "0", "--json", "--spec", "phrases",
                   "--phrases", str(phrases), "-p", PROMPT, env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert sorted(warned(done.stderr)) == [BROKEN, EXITS], done.stderr
    out = json.loads(done.stdout)
    assert out["stats"]["sources"]["phrases"]["drafted"] > 0
    assert out["tokens"] == smol_plain.generate(PROMPT, max_tokens=16, temperature=0).tokens[:len(out["tokens"])]
    assert sys.modules.get("llamaspec_test_phrases") is None  # this process is untouched


def test_serve_works_beside_a_broken_package(packages, smol, smol_plain, monkeypatch):
    for key, value in env_with(packages["broken"], packages["exits"]).items():
        monkeypatch.setenv(key, value)
    server = Server("-m", smol, "-t", str(THREADS))
    try:
        status, body = server.request("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    finally:
        err = server.stop()
    assert status == 200, body
    assert body["choices"][0]["text"] == smol_plain.generate(PROMPT, max_tokens=8, temperature=0).text
    assert sorted(warned(err)) == [BROKEN, EXITS] and "Traceback" not in err, err


def listed(done: subprocess.CompletedProcess) -> Dict[str, str]:
    assert done.returncode == 0, done.stderr
    return {s["name"]: s["origin"] for s in json.loads(done.stdout)}


def test_llamaspec_sources_lists_each_with_its_origin_and_the_switch_turns_packages_off(packages):
    env = env_with(packages["broken"], packages["phrases"])
    shown = command("sources", "--source", str(FAULTY), env=env)
    assert shown.returncode == 0 and warned(shown.stderr) == [BROKEN], shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("lookup  (built-in)")
    assert any(line.startswith("phrases  (llamaspec-test-phrases 1.0)") for line in lines), shown.stdout
    assert any(line.startswith(f"faulty  ({FAULTY})") for line in lines), shown.stdout
    assert "    --phrases (default None)  A file of phrases, one a line, the text may go on with." in lines, shown.stdout
    assert "    runs with: a draft model (-md)" in lines
    everything = listed(command("sources", "--json", env=env))
    assert everything["phrases"] == "llamaspec-test-phrases 1.0" and everything["draft"] == "built-in"
    for setting, present, warning in [("1", False, []), ("broken", True, []), ("llamaspec-test-broken", True, []),
                                      ("phrases", False, [BROKEN]), ("exits, phrases ,broken", False, [])]:
        done = command("sources", "--json", env={**env, DISABLE: setting})
        assert warned(done.stderr) == warning, (setting, done.stderr)
        assert ("phrases" in listed(done)) == present, setting
        assert set(everything) - {"phrases"} <= set(listed(done))


def test_a_name_clash_is_one_warning_naming_both_and_the_one_kept(packages):
    """A built-in always wins; of two packages, the first by name."""
    done = command("sources", "--json", env=env_with(packages["phrases"], packages["clash"]))
    assert sorted(warned(done.stderr)) == [
        "warning: two draft sources are named 'lookup': the built-in one and llamaspec-test-clash 2.0; the built-in "
        "one's is kept",
        "warning: two draft sources are named 'phrases': llamaspec-test-clash 2.0 and llamaspec-test-phrases 1.0; "
        "llamaspec-test-clash 2.0's is kept"], done.stderr
    origins = listed(done)
    assert origins["lookup"] == "built-in" and origins["phrases"] == "llamaspec-test-clash 2.0"
    # a source the user names wins over a package's, with one warning; over a built-in it is an error
    done = command("sources", "--json", "--source", str(EXAMPLE), env=env_with(packages["phrases"]))
    assert warned(done.stderr) == [f"warning: two draft sources are named 'phrases': llamaspec-test-phrases 1.0 and "
                                   f"{EXAMPLE}; {EXAMPLE}'s is kept"], done.stderr
    assert listed(done)["phrases"] == str(EXAMPLE)


@pytest.fixture
def on_path(packages):
    """The packages on this process's path for one test, then off it (and their modules gone)."""
    added = []

    def put(*names: str) -> None:
        for name in names:
            sys.path.insert(0, str(packages[name]))
            added.append(str(packages[name]))
        forget_installed()
    yield put
    for path in added:
        sys.path.remove(path)
    for module in [m for m in sys.modules if m.startswith("llamaspec_test_")]:
        del sys.modules[module]
    forget_installed()


def test_in_python_packages_load_once_when_first_needed(on_path, monkeypatch):
    monkeypatch.delenv(DISABLE, raising=False)
    on_path("broken", "phrases")
    with pytest.warns(LlamaspecWarning) as caught:
        registry = installed_registry()
    assert [str(w.message) for w in caught] == [BROKEN[len("warning: "):]]
    assert registry["phrases"].origin == "llamaspec-test-phrases 1.0" and registry.names[:2] == ("lookup", "cache")
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert installed_registry().names == registry.names
    assert again == []  # loaded once: no second warning, no second import
    monkeypatch.setenv(DISABLE, "1")
    assert "phrases" not in installed_registry().names
