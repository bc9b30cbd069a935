"""`--spec none` is llama.cpp's own greedy decoding, byte for byte: the same text as
llama-completion and llama-simple for the same raw prompt.

The programs are built from the llama.cpp sources vendored in the installed llama-cpp-python
by scripts/build_llama_cpp.sh, which this module runs first when they are missing (about five
minutes on 2 cores, once: the build is kept in ~/.cache/llamaspec).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from llamaspec.engine.generation import make_config
from llamaspec.llama.binding import weight_repacking
from llamaspec.sampling import shape
from llamaspec.measure.compare import default_bin_dir, find_program, generated_text

from conftest import PROMPTS, QWEN, ROOT, SMOL, THREADS, chatml
from checks import N_TOKENS


N = N_TOKENS  # the greedy tests' length: plain decoding of a prompt is shared with them (plain_greedy)
RAW = [PROMPTS[0], chatml("Explain in detail how a hash table handles collisions."), "def fibonacci(n):"]


SCRIPT = ROOT / "scripts" / "build_llama_cpp.sh"
NEEDED = ("llama-completion", "llama-simple")


@pytest.fixture(scope="module", autouse=True)
def programs():
    if all(find_program(name, default_bin_dir()) for name in NEEDED):
        return
    print(f"building {' and '.join(NEEDED)} from llama-cpp-python's llama.cpp sources (once, ~5 minutes)")
    done = subprocess.run(["bash", str(SCRIPT)], env={**os.environ, "TARGETS": " ".join(NEEDED),
                                                       "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]


def program(name):
    path = find_program(name, default_bin_dir())
    assert path is not None, f"{name} is missing after `bash scripts/build_llama_cpp.sh`"
    return str(path)


def run(cmd):
    done = subprocess.run(cmd, capture_output=True, timeout=900)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode("utf-8", errors="replace")


# the default model on one prompt, SmolLM2 (the same code, ten times faster) on the others
CASES = pytest.mark.parametrize("name, i", [(QWEN, 0), (SMOL, 1), (SMOL, 2)], ids=["qwen-0", "smol-1", "smol-2"])
PLAIN = {QWEN: "qwen_plain", SMOL: "smol_plain"}


@CASES
def test_plain_is_llama_completion(request, plain_greedy, model_file, tmp_path, name, i):
    prompt = RAW[i]
    ours = plain_greedy(request.getfixturevalue(PLAIN[name]), prompt, N)  # from a fresh cache, as the program reads it
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(prompt + "\n")  # llama.cpp drops one trailing newline of -f
    out = run([program("llama-completion"), "-m", str(model_file(name)), "-f", str(prompt_file), "-n", str(N),
               "-c", "2048", "-t", str(THREADS), "--temp", "0", "-no-cnv", "--no-display-prompt", "-ngl", "0"]
              + ([] if weight_repacking() else ["--no-repack"]))
    theirs = generated_text(out, prompt, "plain")
    assert theirs == ours.text, (theirs, ours.text)


@pytest.mark.parametrize("name, i", [(SMOL, 1), (SMOL, 2)], ids=["smol-1", "smol-2"])  # the 1.5B: llama-completion's
def test_plain_is_llama_simple(request, plain_greedy, model_file, name, i):
    assert weight_repacking(), "llama-simple repacks weights: build llama-cpp-python as the README says (no AMX)"
    prompt, plain = RAW[i], request.getfixturevalue(PLAIN[name])
    ours = plain_greedy(plain, prompt, N)
    out = run([program("llama-simple"), "-m", str(model_file(name)), "-n", str(N), prompt])
    echo = plain.detokenize(plain.tokenize(prompt))  # it prints the prompt's tokens first
    assert out.startswith(echo) and out.endswith("\n")
    assert out[len(echo):-1] == ours.text


# Penalties, biases and typical-p as llama.cpp's flags and as llamaspec's options: the copy-heavy
# edit (where lookup's candidates are the prompt's text, which the penalties now discourage) and
# a chat answer, on SmolLM2 (the flags are the same code for every model). Greedy after typical-p:
# the best token it keeps.
PENALTIES = ["--repeat-penalty", "1.3", "--repeat-last-n", "64", "--presence-penalty", "0.3",
             "--frequency-penalty", "0.2", "-l", "28-inf", "--typical", "0.9"]  # 28: "," in SmolLM2's vocabulary
SHAPING = dict(repeat_penalty=1.3, penalty_last_n=64, presence_penalty=0.3, frequency_penalty=0.2,
               logit_bias={"28": float("-inf")}, typical_p=0.9)


@pytest.fixture(scope="module")
def smol_lookup(module_spec):
    """Lookup verified whole every step (as llama-lookup does): it drafts whatever this machine's
    costs say, which on a steep curve would leave auto plain on the penalized edit. At most 16
    tokens a step, as llama-lookup drafts by default (31 made batches of 30 rows, where the penalties
    leave little of the copy accepted)."""
    return module_spec(SMOL, spec="lookup", fixed=("lookup",), lookup_draft_max=16)


@pytest.mark.parametrize("prompt, copies", [(PROMPTS[2], True), (RAW[1], False)], ids=["edit", "chat"])
def test_penalties_and_biases_are_llama_completion_s(smol_plain, smol_lookup, model_file, reference, tmp_path, prompt,
                                                     copies):
    """Plain decoding with the penalties is llama-completion's text with the same flags, byte for
    byte; speculation (lookup, verified every step) gives the same tokens, or leaves them only at a
    near-tie of the penalized row (on the edit, with drafts accepted)."""
    smol_plain.reset()
    plain = smol_plain.generate(prompt, max_tokens=N, temperature=0, **SHAPING)
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(prompt + "\n")
    out = run([program("llama-completion"), "-m", str(model_file(SMOL)), "-f", str(prompt_file), "-n", str(N),
               "-c", "2048", "-t", str(THREADS), "--temp", "0", "-no-cnv", "--no-display-prompt", "-ngl", "0"]
              + PENALTIES + ([] if weight_repacking() else ["--no-repack"]))
    assert generated_text(out, prompt, "plain") == plain.text
    assert 28 not in plain.tokens and plain.text != smol_plain.generate(prompt, max_tokens=N, temperature=0).text
    spec = smol_lookup.generate(prompt, max_tokens=N, temperature=0, **SHAPING)
    assert spec.stats.n_accept > 0 or not copies
    if spec.tokens != plain.tokens:
        k = next(i for i, (x, y) in enumerate(zip(spec.tokens + [-1], plain.tokens + [-1])) if x != y)
        tokens = smol_plain.tokenize(prompt)
        text = tokens + plain.tokens[:k]
        ref = reference(SMOL)
        row = shape(ref.row_after(tokens, plain.tokens[:k]), make_config(**SHAPING).sampling, text)
        top = np.sort(row)[-2:]
        assert top[1] - top[0] < ref.near_tie, f"token {k} differs (gap {top[1] - top[0]:.3f})"
