"""Shared fixtures. Real-model tests fetch the models through llamaspec's own fetch code
(into $LLAMASPEC_CACHE, which CI points outside the checkout); they never skip."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import List, Tuple

import numpy as np
import pytest
from click.testing import CliRunner

import llamaspec
from llamaspec import LlamaSpec, ModelConfig, SpecConfig
from llamaspec.constraints import GrammarVocabulary
from llamaspec.llama.binding import Context, Model, quantize
from llamaspec.llama.pool import ModelPool
from llamaspec.cli import cli

# A suite started as a background job inherits SIGINT ignored, and so would the programs the
# tests interrupt with it: give it back its default, which they inherit.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

QWEN = "qwen2.5-coder-1.5b-instruct"
QWEN_DRAFT = "qwen2.5-coder-0.5b-instruct"
SMOL = "smollm2-135m-instruct"
GEMMA = "gemma-3-270m"
THREADS = int(os.environ.get("LLAMASPEC_TEST_THREADS", "2"))  # scripts/gpu_check.sh: the machine's cores


ROOT = Path(__file__).resolve().parent.parent  # the checkout
DATA = ROOT / "tests" / "data"
# Greedy answers recorded from Qwen2.5-Coder-1.5B (the bench suite's, more, and some used in no fit).
ANSWERS = json.loads((DATA / "answers.json").read_text())
MORE_ANSWERS = json.loads((DATA / "more_answers.json").read_text())
HELD_OUT_ANSWERS = json.loads((DATA / "held_out_answers.json").read_text())


def chatml(user: str) -> str:
    return f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


# Three different prompts: open text, code, and a copy-heavy edit.
PROMPTS = [
    chatml("Write a short story about a lighthouse keeper who finds a message in a bottle."),
    chatml("Write a Python function that checks whether a string is a palindrome, with a docstring and tests."),
    chatml("Fix the spelling mistakes in this text and return the whole corrected text:\n\n"
           "The old lighthose stood on the edge of the cliff for more then two hundred years. Every nigth "
           "its lamp turned slowly, sending a beam of ligth across the dark water so that sailors could "
           "find there way home. The keeper, a quite man named Tomas, climbed the one hundred and twelve "
           "steps each evening to clean the lens and wind the clockwork. He kept a jurnal of every ship "
           "that passed, every storm that came, and every bird that rested on the railing. When the "
           "goverment finally replaced him with an automatic lamp, he refused to leave the island. "
           "He built a small house from drift wood behind the tower and planted potatos in the sandy "
           "soil. Vistors from the mainland somtimes brought him news, books and coffee, and he told "
           "them storys about the great storm of nineteen fifty-two, when the waves reached the lamp "
           "room and the whole tower shook like a tree in the wind."),
]


@pytest.fixture(scope="session")
def model_file():
    def get(name: str) -> Path:
        """A registry model's cached file (fetched once), or a file made by a test (a quantization)."""
        return Path(name) if Path(name).is_file() else llamaspec.fetch(name, progress=False)
    return get


@pytest.fixture(scope="session")
def qwen_vocab(model_file):
    """Qwen2.5's vocabulary (that of the recorded answers in tests/data)."""
    return Model(model_file(QWEN), vocab_only=True)


@pytest.fixture(scope="session")
def grammar_vocabulary():
    """A model's GrammarVocabulary, built once per model for the whole run."""
    made = {}

    def get(model) -> GrammarVocabulary:
        if id(model) not in made:
            made[id(model)] = GrammarVocabulary(model)
        return made[id(model)]
    yield get
    for vocab in made.values():
        vocab.close()


@pytest.fixture(scope="session")
def pool() -> ModelPool:
    """Every model file is mapped once for the whole suite, whatever uses it."""
    return ModelPool()


def _spec(model_file, pool, target: str, draft: str = None, n_ctx: int = 2048, spec: str = "auto", fixed=(),
          references=(), registry=None, ngl: int = 0, **settings) -> LlamaSpec:
    """``ngl``: layers of both models offloaded to the GPU; ``settings``: the sources' (by keyword,
    or a source's config by its name)."""
    tcfg = ModelConfig(str(model_file(target)), n_ctx=n_ctx, n_threads=THREADS, n_gpu_layers=ngl)
    dcfg = ModelConfig(str(model_file(draft)), n_ctx=n_ctx, n_threads=THREADS, n_gpu_layers=ngl) if draft else None
    return LlamaSpec(tcfg, dcfg, settings=settings, progress=False, references=references,
                     spec=SpecConfig.parse(spec).with_fixed(frozenset(fixed)), pool=pool, registry=registry)


def _factory(model_file, pool):
    made: List[LlamaSpec] = []

    def make(target: str, draft: str = None, n_ctx: int = 2048, **options) -> LlamaSpec:
        spec = _spec(model_file, pool, target, draft, n_ctx, **options)
        made.append(spec)
        return spec
    return make, made


@pytest.fixture
def make_spec(model_file, pool):
    """LlamaSpecs for one test, closed after it."""
    make, made = _factory(model_file, pool)
    yield make
    for spec in made:
        spec.close()


@pytest.fixture(scope="module")
def module_spec(model_file, pool):
    """LlamaSpecs for one test module, closed after it: the suite holds few at a time."""
    make, made = _factory(model_file, pool)
    yield make
    for spec in made:
        spec.close()


@pytest.fixture(scope="module")
def qwen_plain(module_spec) -> LlamaSpec:
    return module_spec(QWEN, spec="none")


@pytest.fixture(scope="module")
def qwen_pair(module_spec) -> LlamaSpec:
    """The draft model verified every step (as llama-speculative-simple does), so that its path runs
    on a CPU where the planner would leave it idle."""
    return module_spec(QWEN, QWEN_DRAFT, spec="draft", fixed=("draft",), draft_max=8, draft_p_min=0.5)


@pytest.fixture(scope="module")
def qwen_auto(module_spec) -> LlamaSpec:
    """What `llamaspec chat` runs: every source, the draft model included."""
    return module_spec(QWEN, QWEN_DRAFT)


@pytest.fixture(scope="module")
def qwen_small_plain(module_spec) -> LlamaSpec:
    """Qwen2.5-Coder-0.5B: Qwen's template (tools) and fill-in-the-middle tokens, at a third of the
    1.5B's time, for tests of what requests ask rather than of the default pair."""
    return module_spec(QWEN_DRAFT, spec="none")


@pytest.fixture(scope="module")
def qwen_small_auto(module_spec) -> LlamaSpec:
    """The 0.5B with every source it can run alone (no draft model: it is the smallest Qwen)."""
    return module_spec(QWEN_DRAFT)


@pytest.fixture(scope="session")
def plain_greedy():
    """Plain greedy decoding's result, each (model, prompt, length) decoded once for the whole
    suite from an empty cache (the prompt read in one batch, as llama.cpp's programs read it):
    the reference that many tests compare with. ``plain``: a ``spec="none"`` LlamaSpec."""
    done = {}

    def get(plain: LlamaSpec, prompt: str, max_tokens: int):
        assert plain.spec_name == "plain", plain.spec_name
        key = (plain.model.path, prompt, max_tokens)
        if key not in done:
            plain.reset()
            done[key] = plain.generate(prompt, max_tokens=max_tokens, temperature=0)
        return done[key]
    return get


@pytest.fixture(scope="module")
def smol_plain(module_spec) -> LlamaSpec:
    return module_spec(SMOL, spec="none")


@pytest.fixture(scope="module")
def smol_self(module_spec) -> LlamaSpec:
    return module_spec(SMOL, SMOL, spec="draft", fixed=("draft",), draft_max=6, draft_p_min=0.0)


@pytest.fixture(scope="module")
def smol_auto(module_spec) -> LlamaSpec:
    return module_spec(SMOL)


# A greedy token may leave plain decoding's only where plain's two best logits are closer than
# this: a row of a verify batch is not bit for bit the row decoded alone, and moves that gap by up
# to 1.54 logits for SmolLM2 (Q4_1), 0.34 for Qwen2.5-Coder-0.5B and 0.37 for the 1.5B (Q4_K_M)
# on an AVX2 EPYC (360-1440 rows each, among other sequences' rows: docs/results.md, "Near ties").
NEAR_TIES = {SMOL: 2.0}
NEAR_TIE = 0.5  # every other model


def near_tie(name: str) -> float:
    return NEAR_TIES.get(name, NEAR_TIE)


class Reference:
    """A model evaluated one token at a time: what plain greedy decoding would choose next.
    ``near_tie``: the gap below which a verify batch's rows may choose otherwise (NEAR_TIES)."""

    def __init__(self, model: Model, near_tie: float = NEAR_TIE) -> None:
        self.model, self.near_tie = model, near_tie
        self.ctx = Context(self.model, 2048, THREADS)

    def top2(self, prompt: List[int], continuation: List[int]) -> Tuple[np.ndarray, np.ndarray]:
        """For each position of ``continuation``: the argmax and the top-1/top-2 logit gap."""
        self.ctx.clear()
        self.ctx.eval(prompt[:-1])
        argmax, gap = [], []
        for token in [prompt[-1], *continuation[:-1]]:
            self.ctx.eval([token], logits="last")
            row = self.ctx.logits_ith(-1)
            two = np.partition(row, -2)[-2:]
            argmax.append(int(row.argmax()))
            gap.append(float(two[1] - two[0]))
        return np.array(argmax), np.array(gap)

    def prompt_logprobs(self, tokens: List[int]) -> np.ndarray:
        """Each token's log-probability after the first, the text read in one batch."""
        self.ctx.clear()
        self.ctx.eval(tokens, logits="all")
        rows = self.ctx.logits(len(tokens))[:-1].astype(np.float64)
        norm = rows.max(axis=1) + np.log(np.exp(rows - rows.max(axis=1, keepdims=True)).sum(axis=1))
        return rows[np.arange(len(tokens) - 1), tokens[1:]] - norm

    def row_after(self, prompt: List[int], continuation: List[int]) -> np.ndarray:
        """The logits after ``continuation``: the prompt read in one batch, as generation reads
        it, then one token at a time."""
        self.ctx.clear()
        self.ctx.eval(prompt, logits="last")
        for token in continuation:
            self.ctx.eval([token], logits="last")
        return self.ctx.logits_ith(-1).copy()

    def greedy(self, prompt: List[int], n: int) -> Tuple[List[int], List[float]]:
        """Plain greedy decoding: up to ``n`` tokens (ending at an end-of-generation token, not
        included) and, for each, its top-1/top-2 logit gap."""
        self.ctx.clear()
        self.ctx.eval(prompt[:-1])
        tokens, gaps, token = [], [], prompt[-1]
        while len(tokens) < n:
            self.ctx.eval([token], logits="last")
            row = self.ctx.logits_ith(-1)
            two = np.partition(row, -2)[-2:]
            token = int(row.argmax())
            if self.model.is_eog(token):
                break
            tokens.append(token)
            gaps.append(float(two[1] - two[0]))
        return tokens, gaps


@pytest.fixture(scope="module")
def reference(model_file, pool):
    cache = {}

    def get(name: str, ngl: int = 0) -> Reference:
        """Model ``name``'s reference, ``ngl`` of its layers offloaded to the GPU."""
        if (name, ngl) not in cache:
            cache[(name, ngl)] = Reference(pool.get(model_file(name), ngl), near_tie(name))
        return cache[(name, ngl)]
    yield get
    for ref in cache.values():
        ref.ctx.close()
        pool.release(ref.model)


@pytest.fixture(scope="session")
def smol_quant(model_file, tmp_path_factory):
    """SmolLM2 quantized anew by llama.cpp's quantizer (``kind``: Q2_K, Q8_0...): a model with
    SmolLM2's vocabulary and other weights, a draft that disagrees with it; made once a run."""
    made = {}

    def get(kind: str) -> Path:
        if kind not in made:
            made[kind] = tmp_path_factory.mktemp("quant") / f"smol.{kind}.gguf"
            quantize(model_file(SMOL), made[kind], kind, THREADS)
        return made[kind]
    return get


@pytest.fixture(scope="session")
def smol(model_file) -> str:
    """SmolLM2's GGUF path, for CLI tests."""
    return str(model_file(SMOL))


def run(*args, input=None):
    """The llamaspec command, in process."""
    return CliRunner().invoke(cli, list(args), input=input)


def assert_one_line_error(result, fragment):
    assert result.exit_code != 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and fragment in lines[0], lines[0]
    assert "Traceback" not in result.output


def pytest_terminal_summary(terminalreporter):
    """The peak resident memory of the test process, for CI's log (the suite must stay under 8 GB)."""
    try:
        with open("/proc/self/status") as f:
            peak_kb = int(next(line for line in f if line.startswith("VmHWM:")).split()[1])
    except (OSError, StopIteration):
        import resource
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    terminalreporter.write_line(f"peak resident memory of the test process: {peak_kb / 2**20:.1f} GB")


@pytest.fixture(scope="session")
def smol_heads(model_file, tmp_path_factory) -> Path:
    """Draft heads for SmolLM2, trained once for the suite on a little of the README (seconds)."""
    from llamaspec.training import TrainConfig, train_heads
    out = tmp_path_factory.mktemp("heads") / "smol.heads.npz"
    path, _ = train_heads(str(model_file(SMOL)), [str(ROOT / "README.md")], TrainConfig(epochs=3), out, tokens=1536,
                          threads=THREADS, progress=False)
    return path
