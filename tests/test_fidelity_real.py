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
from pathlib import Path

import pytest

from llamaspec.llama.binding import weight_repacking
from llamaspec.measure.compare import default_bin_dir, find_program, generated_text

from conftest import PROMPTS, QWEN, THREADS, chatml

N = 160
RAW = [PROMPTS[0], chatml("Explain in detail how a hash table handles collisions."), "def fibonacci(n):"]


SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "build_llama_cpp.sh"
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


@pytest.mark.parametrize("i", range(len(RAW)))
def test_plain_is_llama_completion(qwen_plain, model_file, tmp_path, i):
    prompt = RAW[i]
    qwen_plain.reset()  # a fresh cache: the prompt in one batch, as the program evaluates it
    ours = qwen_plain.generate(prompt, max_tokens=N, temperature=0)
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(prompt + "\n")  # llama.cpp drops one trailing newline of -f
    out = run([program("llama-completion"), "-m", str(model_file(QWEN)), "-f", str(prompt_file), "-n", str(N),
               "-c", "2048", "-t", str(THREADS), "--temp", "0", "-no-cnv", "--no-display-prompt", "-ngl", "0"]
              + ([] if weight_repacking() else ["--no-repack"]))
    theirs = generated_text(out, prompt, "plain")
    assert theirs == ours.text, (theirs, ours.text)


@pytest.mark.parametrize("i", range(len(RAW)))
def test_plain_is_llama_simple(qwen_plain, model_file, i):
    assert weight_repacking(), "llama-simple repacks weights: build llama-cpp-python as the README says (no AMX)"
    prompt = RAW[i]
    qwen_plain.reset()
    ours = qwen_plain.generate(prompt, max_tokens=N, temperature=0)
    out = run([program("llama-simple"), "-m", str(model_file(QWEN)), "-n", str(N), prompt])
    echo = qwen_plain.detokenize(qwen_plain.tokenize(prompt))  # it prints the prompt's tokens first
    assert out.startswith(echo) and out.endswith("\n")
    assert out[len(echo):-1] == ours.text
