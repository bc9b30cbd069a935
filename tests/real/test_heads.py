"""Draft heads on a real model: `llamaspec heads train` as a user runs it, heads found beside the
model without --heads, the target's hidden states reproducing its logits, and heads refused for
another model. (Greedy equality and the KV invariant: tests/real/test_sources.py, as for every
source.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import llamaspec
from llamaspec.llama import models
from llamaspec.llama.binding import Model
from llamaspec.draft_heads import Heads, HeadsError, cached_path
from llamaspec.training.data import output_rows
from llamaspec.training.train import LARGE, SMALL_TARGET, defaults

from conftest import QWEN, QWEN_DRAFT, ROOT, SMOL, THREADS, assert_one_line_error, chatml, run


def test_the_default_training_text_and_time_are_less_for_targets_under_a_billion_parameters(model_file):
    sizes = {}
    for name in (SMOL, QWEN_DRAFT, QWEN):
        model = Model(model_file(name), vocab_only=True)
        sizes[name] = model.n_params
        model.close()
    assert sizes[SMOL] < sizes[QWEN_DRAFT] < 10**9 < sizes[QWEN]
    assert [defaults(sizes[n]) for n in (SMOL, QWEN_DRAFT, QWEN)] == [SMALL_TARGET, SMALL_TARGET, LARGE]
    assert SMALL_TARGET.tokens < LARGE.tokens and SMALL_TARGET.minutes <= 5 and LARGE.minutes <= 30


def test_heads_train_from_the_command_line_is_found_beside_the_model(model_file, tmp_path):
    """Trained into a cache directory by default, the heads are found there for that model with no
    flag (auto asks them), and their report says that one file leaves no text to measure them on. Whether the
    planner verifies what heads trained on 1024 tokens propose is its call by this machine's costs
    (CI's machine verified none); that they draft and keep the text: tests/real/test_sources.py.
    Both caches start with the suite's cost curves (keyed by file name and size: the copy keeps its
    name), so no load measures SmolLM2 again (a first measurement: tests/real/test_robustness.py)."""
    model = tmp_path / "models" / model_file(SMOL).name
    model.parent.mkdir()
    shutil.copy(model_file(SMOL), model)
    cache = tmp_path / "cache"
    for fresh in (cache, tmp_path / "empty"):  # no heads in either
        fresh.mkdir()
        if (models.cache_dir() / "costs.json").is_file():
            shutil.copy(models.cache_dir() / "costs.json", fresh / "costs.json")
    trained = subprocess.run([sys.executable, "-m", "llamaspec", "heads", "train", "-m", str(model), "-f",
                              str(ROOT / "README.md"), "--tokens", "1024", "--heads", "2", "--cache-dir", str(cache),
                              "-t", str(THREADS)], capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr
    where = cached_path(model, cache)
    assert where.is_file() and str(where) in trained.stderr
    # one file: nothing held out, and the report says so rather than "top-1 0.000 on 0 rows"
    assert "no text held out" in trained.stderr and "head 1: top-1" not in trained.stderr
    heads = Heads.read(where)
    assert heads.k == 2 and heads.meta["model"] == model.name and 0 <= heads.meta["report"]["top1"][0] <= 1
    assert np.allclose(heads.out, output_rows(model, heads.tokens), atol=2e-3)  # E_N kept: loading reads no GGUF
    spec = llamaspec.load(str(model), cache_dir=cache, n_threads=THREADS, progress=False)
    try:
        r = spec.generate(chatml("Write a Python function that adds two numbers."), max_tokens=24, temperature=0)
        assert "heads" in r.stats.sources  # every source auto asked is listed, verified or not
    finally:
        spec.close()
    spec = llamaspec.load(str(model), cache_dir=tmp_path / "empty", n_threads=THREADS, progress=False)
    try:  # no heads in that cache: auto asks none
        r = spec.generate(chatml("Write a Python function that adds two numbers."), max_tokens=4, temperature=0)
        assert r.stats.sources and "heads" not in r.stats.sources
    finally:
        spec.close()


def test_heads_train_ends_in_the_minutes_given(model_file, tmp_path):
    """--minutes bounds the reading and the training together: 1,000 epochs of 4,096 tokens would
    take minutes, 0.2 of a minute stops them (the heads written all the same); 0 is a one-line
    error, and so is a time too short to read any text."""
    out = tmp_path / "h.npz"
    args = ["heads", "train", "-m", str(model_file(SMOL)), "-f", str(ROOT / "README.md"), "--tokens", "4096",
            "--epochs", "1000", "-o", str(out), "-t", str(THREADS)]
    start = time.perf_counter()
    trained = run(*args, "--minutes", "0.2")
    assert trained.exit_code == 0, trained.output
    assert time.perf_counter() - start < 30 and "stopped at the time given, before 1000 epochs" in trained.stderr
    report = Heads.read(out).meta["report"]
    assert report["out_of_time"] and 0 < report["rows"] < 4096, report
    assert_one_line_error(run(*args, "--minutes", "0"), "minutes must be > 0")
    short = run(*args, "--minutes", "0.0001")  # its progress bar, cleared on a terminal, then the error
    assert short.exit_code != 0 and "Traceback" not in short.output
    assert short.stderr.strip().splitlines()[-1] == \
        "error: the training text gave 0 tokens in the 80% of 0.0001 minutes it may take; heads need at least 64"


def test_the_hidden_state_times_the_output_matrix_is_the_logits(model_file):
    path = model_file(SMOL)
    model = Model(path)
    ctx = model.context(512, THREADS, 64, 1)
    try:
        tokens = model.tokenize("def add(a, b):\n    return", add_special=True)
        ctx.decode_rows([(t, i, (0,), i >= len(tokens) - 2) for i, t in enumerate(tokens)], hidden=True)
        hidden, logits = np.array(ctx.hidden(2)), np.array(ctx.logits(2))
        ctx.seq_rm(0, -1, -1)
        ctx.decode_rows([(t, i, (0,), i >= len(tokens) - 2) for i, t in enumerate(tokens)])
        assert np.array_equal(np.array(ctx.logits(2)), logits)  # hidden states change no logit
        again = hidden @ output_rows(path, np.arange(model.n_vocab)).T
        for row in range(2):
            assert np.corrcoef(again[row], logits[row])[0, 1] > 0.999
            assert again[row].argmax() == logits[row].argmax()
    finally:
        ctx.close()
        model.close()


def test_the_heads_take_e_n_h_from_the_logits_of_the_row_of_their_hidden_state(make_spec, smol_heads):
    """The engine gives the heads, beside the hidden state of the row the target's own token
    came from, that row's logits: on the map they are E_N h (llama.cpp's, from the quantized
    matrix), so the heads spare that product."""
    spec = make_spec(SMOL, spec="heads", fixed=("heads",), heads=str(smol_heads))
    spec.generate(chatml("Write a sentence about rain."), max_tokens=12, temperature=0)
    (source,) = spec.engine.lanes[0].speculator.sources
    _, h, logits = source.at
    assert source.logits_are_base is True and logits is not None
    assert np.corrcoef(logits[source.heads.tokens], source.heads.base(h))[0, 1] > 0.999


def test_heads_of_another_model_are_one_line(smol_heads, smol_quant, tmp_path):
    other = smol_quant("Q2_K")
    with pytest.raises(HeadsError, match="trained for .* not smol.Q2_K.gguf") as e:
        llamaspec.load(str(other), spec="heads", heads=str(smol_heads), n_threads=THREADS, progress=False)
    assert "\n" not in str(e.value)
    with pytest.raises(llamaspec.ConfigError, match="which a model on RPC servers does not return"):
        llamaspec.load(str(other), spec="heads", heads=str(smol_heads), rpc=["127.0.0.1:9"], progress=False)
    cut = tmp_path / "cut.heads.npz"
    cut.write_bytes(smol_heads.read_bytes()[:1000])
    assert_one_line_error(run("generate", "-m", str(other), "--heads", str(cut), "-p", "hi", "-n", "4"), "cut short")
    assert_one_line_error(run("generate", "-m", str(other), "--spec", "heads", "-p", "hi", "-n", "4"),
                          "needs a heads file")


def test_a_training_file_s_tokens_are_its_text_s_read_a_block_at_a_time(model_file, monkeypatch):
    """A training file is tokenized a block at a time (bounded memory, whatever its size): a file
    within a block gives the tokens of its whole text, and smaller blocks, cut at lines' ends,
    the same text."""
    from llamaspec.training import data
    model = Model(model_file(SMOL), vocab_only=True)
    try:
        readme = ROOT / "docs" / "design.md"  # a text of more than 5,000 tokens
        text = readme.read_text(encoding="utf-8")
        whole = model.tokenize(text, add_special=True, parse_special=False)
        assert data.file_tokens(model, readme, 5000) == whole[:5000]
        monkeypatch.setattr(data, "BLOCK", 4096)
        small = data.file_tokens(model, readme, 5000)
        bos = len(model.tokenize("", add_special=True, parse_special=False))
        assert len(small) == 5000 and text.startswith(model.detokenize(small[bos:]))
    finally:
        model.close()


def test_the_default_mix_s_answers_are_the_target_s_greedy_text(model_file):
    """training.data.answers: three answers decoded two at a time (the third prompt read into the
    sequence of the first answer to end, after the prefix the prompts share), one row per
    generated token, labelled with the token plain decoding emits there (its best, first in the
    row's best tokens), the pending token the same; a decode of two rows may leave plain's text
    only at a near-tie."""
    from llamaspec.training.data import answers
    path = model_file(SMOL)
    model = Model(path)
    ctx = model.context(2 * 512, THREADS, 512, 2)
    asks = ["Write a Python function that adds two numbers.", "Name three rivers in Europe.", "What is a prime?"]
    try:
        prompts = [model.tokenize(chatml(a), add_special=False, parse_special=True) for a in asks]
        got, cut = answers(ctx, model, prompts, 12, [4, 5, 6])
        alone = model.context(512, THREADS, 512, 1)
        try:  # the hidden state of each prompt's last row, each prompt read alone
            first = [answers(alone, model, [p], 0, [0])[0][0].hidden[0] for p in prompts]
        finally:
            alone.close()
    finally:
        ctx.close()
        model.close()
    assert not cut and len(got) == 3
    for states, h in zip(got, first):  # the third prompt read after the prefix it shares with the others, kept
        assert np.abs(states.hidden[0] - h).max() <= 0.01 * np.abs(h).max()
    spec = llamaspec.load(str(path), spec="none", n_threads=THREADS, progress=False)
    try:
        plain = [spec.generate(p, max_tokens=13, temperature=0).tokens for p in prompts]
    finally:
        spec.close()
    for states, tokens, piece in zip(got, plain, (4, 5, 6)):
        assert len(states) == len(tokens) and set(states.piece) == {piece * 1_000_000}
        differ = np.flatnonzero(states.labels != np.array(tokens))
        if len(differ):  # the first place it left plain's text: the answer's own top two nearly tied
            assert states.top_p[differ[0], 0] - states.top_p[differ[0], 1] < 0.1, (piece, differ[0])
        assert np.array_equal(states.top[:, 0], states.labels) and np.array_equal(states.next, states.labels)
        assert (np.diff(states.top_p, axis=1) <= 0).all() and (states.top_p.sum(axis=1) <= 1 + 1e-5).all()


def test_the_reading_answers_prompts_in_groups_and_stops_at_its_size(model_file):
    """training.data.collect: consecutive prompts answered together, as many as the context has
    sequences, then texts, in the pieces' order, cut at max_tokens rows."""
    from llamaspec.training.data import Piece, collect
    model = Model(model_file(SMOL))
    ctx = model.context(2 * 512, THREADS, 512, 2)
    pieces = [Piece("answer", "Say hi."), Piece("answer", "Count to three."), Piece("answer", "Say bye."),
              Piece("text", (ROOT / "README.md").read_text()), Piece("answer", "Say yes.")]
    try:
        states, cut = collect(model, ctx, pieces, 100, 8)
    finally:
        ctx.close()
        model.close()
    assert not cut and len(states) == 100
    order = [int(p) // 1_000_000 for p in states.piece]
    assert order == sorted(order) and set(order) == {0, 1, 2, 3}  # the last answer is past the 100 rows
    answered = [order.count(i) for i in (0, 1, 2)]
    assert all(1 <= n <= 9 for n in answered) and order.count(3) == 100 - sum(answered)


def test_the_reading_answers_no_more_prompts_together_than_the_rows_left_need(model_file):
    """20 rows left, answers of up to 16 tokens (17 rows each): two answers are decoded together,
    not the context's four, and the reading stops there."""
    from llamaspec.training.data import Piece, collect
    model = Model(model_file(SMOL))
    ctx = model.context(4 * 256, THREADS, 256, 4)
    read = []
    try:
        asks = [Piece("answer", "Write a long story about a dragon and a knight.")] * 6
        states, cut = collect(model, ctx, asks, 20, 16, read.append)
    finally:
        ctx.close()
        model.close()
    assert not cut and len(states) == 20
    assert 20 <= sum(read) <= 2 * 17 and len(set(states.piece)) == 2


def test_the_reading_stops_at_its_deadline_and_keeps_what_it_read(model_file, monkeypatch):
    """A deadline reached while two answers are decoded together: no decode starts after it, the
    rows read are kept, and no further piece is read (the clock here ticks once a look)."""
    from llamaspec.training import data
    clock = iter(range(10**6))
    monkeypatch.setattr(data, "perf_counter", lambda: next(clock))
    model = Model(model_file(SMOL))
    ctx = model.context(2 * 512, THREADS, 512, 2)
    pieces = [data.Piece("answer", "Write a long story about a dragon."),
              data.Piece("answer", "Write a long poem about the sea."),
              data.Piece("text", (ROOT / "README.md").read_text())]
    read = []
    try:
        # the clock's looks: 0 the reading goes on, 1-5 a decode each, 6 the deadline
        states, cut = data.collect(model, ctx, pieces, 1000, 64, read.append, deadline=6)
    finally:
        ctx.close()
        model.close()
    assert not cut and len(states) == sum(read) == 10
    assert sorted(int(p) // 1_000_000 for p in states.piece) == [0] * 5 + [1] * 5


def test_the_heads_replay_script_replays_an_answer_on_the_recorded_gpu_curve(model_file, smol_heads):
    """benchmarks/heads_replay.py as docs/usage.md runs it: the target's answer decoded, then replayed
    through each set of sources, one line each with its speed-up before and after the host's time."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "heads_replay.py"), "-m", str(model_file(SMOL)),
                           "--heads", str(smol_heads), "--curve", str(ROOT / "tests" / "data" / "gpu_curve.json"),
                           "-n", "24", "--prompts", "open_chat", "-t", str(THREADS)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("open_chat")]
    assert [line.split()[1] for line in lines] == ["lookup+lookahead", "heads", "lookup+lookahead+heads"]
    assert all("x before the host's time" in line and "x after it" in line for line in lines)
