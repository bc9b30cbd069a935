"""Hostile heads files and training text: every bad heads file is one line (HeadsError) before
anything is allocated for what its headers declare, and a training file is read in bounded memory
(a block at a time, as far as the tokens wanted), a binary or non-UTF-8 one refused in one line."""

from __future__ import annotations

import io
import json
import re
import resource
import subprocess
import sys
import time
import tracemalloc
import zipfile
from pathlib import Path
from typing import Callable, Dict

import numpy as np
import pytest

from conftest import assert_one_line_error, run
from llamaspec.errors import ConfigError
from llamaspec.draft_heads import MAX_ARRAY_BYTES, Heads, HeadsError
from llamaspec.training import data
from llamaspec.training.data import blocks, check_text_file, file_tokens

from .test_heads import D, N, R, fake_heads


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=False)
    return buf.getvalue()


def header(descr: str, shape: tuple, body: bytes = b"\0" * 16) -> bytes:
    """A .npy member written by hand: a header declaring ``shape``, then a tiny ``body``."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue() + body


def members(path: Path) -> Dict[str, bytes]:
    """A good heads file's members, as ``Heads.save`` writes them (at ``path``)."""
    fake_heads().save(path)
    with zipfile.ZipFile(path) as z:
        return {name: z.read(name) for name in z.namelist()}


def write_zip(path: Path, files: Dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as z:
        for name, content in files.items():
            z.writestr(name, content)
    return path


def changed(**arrays: bytes) -> Callable[[Path], Path]:
    """A heads file whose members ``arrays`` (name without .npy: content) replace the good ones."""
    def make(path: Path) -> Path:
        files = members(path)
        files.update({f"{name}.npy": content for name, content in arrays.items()})
        return write_zip(path, files)
    return make


def with_values(**values: Callable[[Heads], None]) -> Callable[[Path], Path]:
    """A heads file saved from fake heads that ``values``' functions changed."""
    def make(path: Path) -> Path:
        heads = fake_heads()
        for change in values.values():
            change(heads)
        heads.save(path)
        return path
    return make


def meta(**fields) -> bytes:
    return npy(np.frombuffer(json.dumps(dict(fake_heads().meta, **fields)).encode(), dtype=np.uint8))


def set_at(name: str, value: float) -> Callable[[Heads], None]:
    def change(heads: Heads) -> None:
        getattr(heads, name).flat[3] = value
    return change


def damaged(path: Path) -> Path:
    """A good file with a byte of w's data changed: its CRC no longer matches."""
    fake_heads().save(path)
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("w.npy")
    at = info.header_offset + 30 + len(info.filename) + len(info.extra) + 200  # past the .npy header
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))
    return path


def cut_in_half(path: Path) -> Path:
    fake_heads().save(path)
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    return path


def without_u(path: Path) -> Path:
    files = members(path)
    del files["u.npy"]
    return write_zip(path, files)


def with_notes(path: Path) -> Path:
    return write_zip(path, dict(members(path), **{"notes.txt": b"hello"}))


def compressed(path: Path) -> Path:
    return write_zip(path, members(path), zipfile.ZIP_DEFLATED)


def not_a_zip(path: Path) -> Path:
    path.write_bytes(b"this is not a zip archive\n" * 10)
    return path


def a_directory(path: Path) -> Path:
    path.mkdir()
    return path


W_BYTES = npy(fake_heads().w.astype(np.float16))

HOSTILE = {
    "NaN weights": (with_values(w=set_at("w", np.nan)), "its array w holds NaN or infinite values"),
    "inf weights": (with_values(out=set_at("out", np.inf)), "its array out holds NaN or infinite values"),
    "inf in c": (with_values(b=set_at("b", -np.inf)), "its array b holds NaN or infinite values"),
    "NaN calibration": (with_values(c=set_at("calibration", np.nan)), "its array calibration holds NaN"),
    "rates above 1": (with_values(c=set_at("calibration", 1.5)), "calibration holds rates outside 0 to 1"),
    "a header of (10**7, 10**7)": (changed(calibration=header("<f4", (10**7, 10**7))),
                                   f"calibration declares (10000000, 10000000) float32: 400,000,000,000,000 bytes, "
                                   f"where an array has at most {MAX_ARRAY_BYTES:,}"),
    "a header larger than its body": (changed(out=header("<f2", (N, D * 1000))),
                                      f"its array out holds 16 bytes of data where its header declares ({N}, "
                                      f"{D * 1000}) float16, {N * D * 2000:,} bytes (cut short?)"),
    "a member cut short": (changed(w=W_BYTES[:len(W_BYTES) // 2]), "its array w holds"),
    "a damaged member": (damaged, "its array w is cut short or damaged (BadZipFile: Bad CRC-32"),
    "a map longer than the record's": (changed(out=npy(np.zeros((N + 1, D), np.float16)),
                                               tokens=npy(np.arange(N + 1, dtype=np.int32))),
                                       f"its array tokens is ({N + 1},), where the record's sizes (d {D}, N {N}, "
                                       f"K 3, r {R}) make it ({N},)"),
    "another hidden size in the record": (changed(meta=meta(n_embd=D + 1)),
                                          f"its array w is ({R}, {2 * D}), where the record's sizes (d {D + 1}"),
    "a rank above d": (changed(b=npy(np.zeros(D + 1, np.float32))),
                       f"its array b is ({D + 1},), where it is one row of the block's inner units, 1 to d {D}"),
    "more heads than the calibration's": (changed(meta=meta(heads=4)), "its array calibration is (3, 11)"),
    "a record declaring a huge d": (changed(meta=meta(n_embd=10**9)),
                                    "its array meta declares n_embd 1000000000, where it is a whole number from 1 to "
                                    "65,536"),
    "a record declaring d true": (changed(meta=meta(n_embd=True)), "its array meta declares n_embd true"),
    "a map over the vocabulary": (changed(meta=meta(n_tokens=10**6)), "declares n_tokens 1000000, where it is a "
                                                                      "whole number from 1 to 40"),
    "a record of 10**12 bytes": (changed(meta=header("|u1", (10**12,))), "its array meta declares (1000000000000,) "
                                                                         "uint8: 1,000,000,000,000 bytes, where"),
    "a record of 2 MiB": (changed(meta=header("|u1", (2 << 20,), b" " * (2 << 20))),
                          "its array meta is (2097152,), where a record is one row of at most 1,048,576 bytes"),
    "a record that is not JSON": (changed(meta=npy(np.frombuffer(b"{not json", np.uint8))),
                                  "its array meta is not a JSON record"),
    "weights in float64": (changed(w=npy(fake_heads().w.astype(np.float64))),
                           "its array w is float64, where a heads file holds it in float16"),
    "an object array": (changed(w=header("|O", (R, 2 * D))), "its array w is object"),
    "tokens out of order": (changed(tokens=npy(np.arange(N, dtype=np.int32)[::-1].copy())),
                            "its array tokens is not increasing token ids from 0 to n_vocab - 1 (39)"),
    "a member that is not .npy": (changed(w=b"hello, not an array"), "its array w is not a .npy array"),
    "a member that is no array": (with_notes, "holds 'notes.txt', which is not one of a heads file's arrays"),
    "a missing array": (without_u, "has no array u;"),
    "a compressed member": (compressed, "is compressed or encrypted"),
    "a file cut in half": (cut_in_half, "is not a heads file or is cut short (not a zip archive)"),
    "not a zip": (not_a_zip, "is not a heads file or is cut short (not a zip archive)"),
    "a directory": (a_directory, "is not a regular file"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_heads_file_is_one_line_before_anything_large_is_allocated(case, tmp_path):
    make, words = HOSTILE[case]
    path = make(tmp_path / "bad.heads.npz")
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(HeadsError) as e:
            Heads.read(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(e.value)
    assert words in message and str(path) in message and "\n" not in message, message
    assert peak < 4 << 20 and time.perf_counter() - start < 5, (peak, case)


def test_a_good_heads_file_still_reads_after_its_checks(tmp_path):
    path = tmp_path / "good.heads.npz"
    fake_heads().save(path)
    heads = Heads.read(path)
    assert heads.k == 3 and heads.out.shape == (N, D) and heads.w.shape == (R, 2 * D)


def test_a_hostile_heads_file_is_one_line_from_the_command_line(tmp_path):
    bad = with_values(w=set_at("w", np.nan))(tmp_path / "nan.heads.npz")
    assert_one_line_error(run("generate", "-m", str(tmp_path / "none.gguf"), "--heads", str(bad), "-p", "hi"),
                          "its array w holds NaN or infinite values")


class WordModel:
    """A tokenizer of words, counting the characters it was given."""

    def __init__(self) -> None:
        self.read = 0

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list:
        self.read += len(text)
        return ([0] if add_special else []) + [len(w) for w in text.split()]


def test_a_training_file_is_read_a_block_at_a_time_as_far_as_the_tokens_go(tmp_path, monkeypatch):
    path = tmp_path / "long.txt"
    path.write_text("some words on a line of the text\n" * 100_000, encoding="utf-8")  # 3.3 MB
    model = WordModel()
    tokens = file_tokens(model, path, 1000)
    assert len(tokens) == 1000 and tokens[0] == 0 and model.read <= data.BLOCK
    monkeypatch.setattr(data, "BLOCK", 100)
    model = WordModel()
    assert file_tokens(model, path, 1000) == tokens and model.read < 5000  # the same tokens, 100 bytes at a time


def test_blocks_end_at_lines_or_between_characters_and_keep_the_text(tmp_path):
    text = "héllo wörld, ünïcode\n" * 5 + "ж" * 50 + "\nend"  # a line longer than a block, characters cut
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    for size in (1, 2, 3, 7, 64, 1 << 20):
        pieces = list(blocks(path, size))
        assert "".join(pieces) == text, size
        assert all(p.endswith("\n") or len(p.encode()) <= 2 * size + 3 for p in pieces[:-1])


@pytest.mark.parametrize("content, words", [
    (b"some text\n\0\0\0", "is not text: a NUL byte at offset 10"),
    (b"caf\xc3\xa9 ok\nbad \xff byte\n", "is not UTF-8 text (byte 0xff at offset 13)"),
    (b"cut at its end \xc3", "is not UTF-8 text (byte 0xc3 at offset 15)"),
])
def test_a_binary_or_non_utf8_training_file_is_one_line(content, words, tmp_path):
    path = tmp_path / "t.bin"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=re.escape(words)) as e:
        check_text_file(path)
    assert str(path) in str(e.value)


def test_bad_bytes_past_the_first_block_are_one_line_where_they_are_read(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"fine text\n" * 200_000 + b"then \xfe")  # 2 MB of text, then a byte no UTF-8 has
    check_text_file(path)  # the first block is text: taken, and refused only if read that far
    assert len(file_tokens(WordModel(), path, 100)) == 100
    with pytest.raises(ConfigError, match="is not UTF-8 text \\(byte 0xfe at offset 2,000,005\\)"):
        file_tokens(WordModel(), path, 10**9)


def test_heads_train_refuses_binary_and_non_utf8_text_before_loading_the_target(tmp_path):
    model = str(tmp_path / "no-such-model.gguf")  # never looked at: the text is refused first
    for content, words in ((b"text\0binary", "is not text: a NUL byte at offset 4"),
                           (b"\x89PNG\r\n\x1a\n", "is not UTF-8 text (byte 0x89 at offset 0)")):
        path = tmp_path / "t.dat"
        path.write_bytes(content)
        assert_one_line_error(run("heads", "train", "-m", model, "-f", str(path)), f"training file {path} {words}")
    assert_one_line_error(run("heads", "train", "-m", model, "-f", str(tmp_path)), "is not a regular file")
    assert_one_line_error(run("heads", "train", "-m", model, "-f", str(tmp_path / "none.txt")),
                          "no such training file")


# Runs a command, then prints the largest resident memory of its processes (KiB): the wrapper's
# only child, so no other test's process counts.
PEAK = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
sys.stderr.write(done.stderr)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(done.returncode)
"""


def test_heads_train_on_a_2_gb_file_stays_small(tmp_path):
    """A sparse 2 GB file (a few lines, then zeros) through the real command under a 2 GiB
    address-space limit: one line at once, never read whole (llamaspec used to read it whole and
    grow past 12 GB)."""
    path = tmp_path / "big.txt"
    with open(path, "wb") as f:
        f.write(b"Some text to train on.\n" * 4)
        f.truncate(2 * 2**30)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PEAK, sys.executable, "-m", "llamaspec", "heads", "train", "-m",
                           str(tmp_path / "no-such-model.gguf"), "-f", str(path)],
                          capture_output=True, text=True, timeout=60, preexec_fn=limit)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [f"error: training file {path} is not text: a NUL byte at offset 92"]
    assert int(done.stdout) * 1024 < 2 * 10**9 and time.perf_counter() - start < 30
