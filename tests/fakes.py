"""A fake target context: logits are a function of the prefix, the KV cache is cells with
sequence ids. Fast tests of the engine's bookkeeping drive it instead of a model."""

from __future__ import annotations

import collections
from typing import Iterator, List, Sequence, Set, Tuple

import numpy as np

from llamaspec.config import SamplingConfig
from llamaspec.constraints import GrammarVocabulary
from llamaspec.engine.engine import Engine, Step
from llamaspec.engine.generation import make_config
from llamaspec.engine.scheduler import Request, RequestStream, Scheduler, Stream
from llamaspec.planning.acceptance_model import AcceptanceModel
from llamaspec.planning.costs import CostCurve, CostModel
from llamaspec.planning.planner import Planner
from llamaspec.planning.speculator import Speculator
from llamaspec.sampling import Uniforms, sample, transform
from llamaspec.sources import default_registry
from llamaspec.sources.base import Candidate, Outcome, Proposal, Source
from llamaspec.sources.lookup import LookupSource

V = 16  # vocabulary
EOS = 15


class FakeModel:
    n_vocab = V
    eos = EOS
    bos = 0
    path = None
    eog_tokens = frozenset({EOS})

    def piece(self, token: int) -> bytes:
        return b"<eos>" if token == EOS else f"{chr(ord('a') + token)}".encode()

    def is_control(self, token: int) -> bool:
        return token == EOS

    def tokenize_bytes(self, data: bytes) -> List[int]:
        """One token per letter a..o (what a grammar's matcher asks of a tokenizer)."""
        return [ord(c) - ord("a") for c in data.decode()]


def logits_of(prefix: Sequence[int], sharp: bool = True) -> np.ndarray:
    """The fake model: its distribution after ``prefix`` depends on the last two tokens only (a
    second-order chain, so texts repeat and lookup has something to copy). ``sharp``: one token
    far ahead (greedy is obvious); else a softer random distribution, the same for the same pair."""
    a, b = (list(prefix[-2:]) + [0, 0])[:2] if len(prefix) < 2 else prefix[-2:]
    rng = np.random.default_rng(1000 + 31 * int(a) + int(b))
    row = rng.normal(0, 1.0, V).astype(np.float32)
    row[EOS] = -30.0  # never ends by itself
    if sharp:
        row[(3 * int(b) + int(a) + 1) % (V - 1)] += 8.0
    return row


class FakeContext:
    """Enough of ``llama.binding.Context`` for the engine: decode_rows, seq_rm, seq_cp, logits.

    The cache is a list of cells ``(position, token, sequence ids)``; ``cells(seq)`` reads a
    sequence back, so tests check the engine's KV bookkeeping like the real-model tests do."""

    def __init__(self, n_ctx: int = 256, n_batch: int = 64, n_seq_max: int = 16, sharp: bool = True) -> None:
        self.model = FakeModel()
        self.n_ctx, self.n_batch, self.n_seq_max = n_ctx, n_batch, n_seq_max
        self.threads = 1
        self.sharp = sharp
        self.t_llama = 0.0
        self.hidden_states = False  # no hidden states: a fake has no layers
        self._cells: List[Tuple[int, int, Set[int]]] = []
        self._out: np.ndarray = np.zeros((0, V), dtype=np.float32)
        self.decodes: List[int] = []  # rows per decode
        self.queued = False  # a decode not waited for (decode_rows' ``wait``): the cache waits for it
        self.n_queued = 0  # decodes queued so, all told

    # --- the cache ----------------------------------------------------------------------
    def cells(self, seq: int) -> List[int]:
        """Tokens of sequence ``seq`` by position (a gap or a duplicate fails)."""
        mine = sorted((pos, tok) for pos, tok, seqs in self._cells if seq in seqs)
        assert [p for p, _ in mine] == list(range(len(mine))), f"sequence {seq} is not contiguous: {mine}"
        return [t for _, t in mine]

    def used_seqs(self) -> Set[int]:
        return {s for _, _, seqs in self._cells for s in seqs}

    def _prefix(self, pos: int, seq: int) -> List[int]:
        row = {p: t for p, t, seqs in self._cells if seq in seqs and p < pos}
        assert sorted(row) == list(range(pos)), f"sequence {seq} lacks cells before {pos}"
        return [row[p] for p in range(pos)]

    # --- decoding -----------------------------------------------------------------------
    def _decode(self, rows: List[Tuple[int, int, Sequence[int], bool]]) -> None:
        if len(rows) > self.n_batch or len(self._cells) + len(rows) > self.n_ctx:
            raise AssertionError("batch or cache overflow")
        self.decodes.append(len(rows))
        out = []
        for token, pos, seqs, logits in rows:
            assert 0 <= token < V and pos < self.n_ctx
            self._cells.append((pos, token, set(seqs)))
        for token, pos, seqs, logits in rows:
            if logits:
                out.append(logits_of(self._prefix(pos + 1, seqs[0]), self.sharp))
        self._out = np.array(out, dtype=np.float32).reshape(-1, V)

    # --- sequences (engine.py) ------------------------------------------------------------
    def decode_rows(self, rows: Sequence[Tuple[int, int, Sequence[int], bool]], hidden: bool = False,
                    wait: bool = True) -> int:
        self._decode([(t, pos, tuple(ids), lg) for t, pos, ids, lg in rows])
        self.queued = not wait
        self.n_queued += not wait
        return len(self._out)

    def synchronize(self) -> None:
        self.queued = False

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self.synchronize()
        lo, hi = (p0 if p0 >= 0 else 0), (p1 if p1 >= 0 else 1 << 30)
        for _, _, seqs in [c for c in self._cells if lo <= c[0] < hi]:
            seqs.discard(seq)
        self._cells = [c for c in self._cells if c[2]]

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.synchronize()
        lo, hi = (p0 if p0 >= 0 else 0), (p1 if p1 >= 0 else 1 << 30)
        for p, _, seqs in self._cells:
            if src in seqs and lo <= p < hi:
                seqs.add(dst)

    def logits(self, n_rows: int) -> np.ndarray:
        self.synchronize()
        return self._out[:n_rows]

    def logits_ith(self, i: int) -> np.ndarray:
        return self._out[i]

    def pos_max(self, seq: int = 0) -> int:
        return max((p for p, _, seqs in self._cells if seq in seqs), default=-1)


def greedy_text(prompt: Sequence[int], n: int) -> List[int]:
    """What plain greedy decoding of the fake model emits after ``prompt``."""
    text = list(prompt)
    for _ in range(n):
        text.append(int(logits_of(text).argmax()))
    return text[len(prompt):]


def fake_prompt(n: int = 40, seed: int = 0) -> List[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, V - 1, n)]


def copying_prompt() -> List[int]:
    """A prompt whose greedy continuation repeats text of the prompt (the fake chain loops)."""
    start = [1, 2]
    return start + greedy_text(start, 60)


def check_kv(ctx: FakeContext, tokens: Sequence[int], queued: bool = False) -> None:
    """Between steps: sequence 0 holds exactly tokens[:-1], no other sequence holds anything.
    ``queued``: a decode of the next step's rows is under way (an engine that overlaps): sequence 0
    holds tokens[:-1] and then that decode's rows (of the pending token and the trie's first
    branch: at most the rest of a batch), and scratch sequences its other branches."""
    if not queued:
        assert ctx.cells(0) == list(tokens[:-1])
        assert ctx.used_seqs() <= {0}, f"stale sequences {ctx.used_seqs()}"
        return
    cells = ctx.cells(0)
    assert cells[:len(tokens) - 1] == list(tokens[:-1]) and len(tokens) - 1 < len(cells) <= len(tokens) - 1 + ctx.n_batch


# --- engines and sources of fake targets, for the engine's and the lanes' tests ---------------------

GREEDY = SamplingConfig(temperature=0)


class OneText:
    """One text at a time on a one-lane engine over a fake target, as a LlamaSpec runs it: the
    scheduler cuts a text at its stop and goes on with its speculator for the next text."""

    def __init__(self, sources, curve=CostCurve.flat(), ctx=None, overlap=False, **ctx_options) -> None:
        self.ctx = ctx if ctx is not None else FakeContext(**ctx_options)
        self.sources = list(sources)
        self.engine = Engine(self.ctx, 1, overlap=overlap)
        self.scheduler = Scheduler(self.engine, FakeModel(), lambda text: self.sources,
                                   Planner(CostModel(curve)), self.ctx.n_ctx, self.ctx.n_ctx, with_oracle(),
                                   exclusive=True, grammars=GrammarVocabulary(FakeModel()))

    @property
    def tokens(self) -> List[int]:
        return self.engine.lanes[0].tokens

    @property
    def speculator(self) -> Speculator:
        return self.engine.lanes[0].speculator

    def generate(self, prompt, **options):
        """(chunks, result) of one generation, read as a LlamaSpec's caller reads it."""
        request = Request(list(prompt), make_config(**options))
        self.scheduler.submit(request)
        chunks = list(Stream(RequestStream(request, self.scheduler.cancel, self.scheduler.step)))
        return chunks, chunks[-1].result

    def steps(self, prompt, sampling=GREEDY, seed=0, max_new=100, constraint=None) -> Iterator[Step]:
        """The engine's steps for ``prompt`` (the first: the prompt's decode, its first token),
        its text following ``constraint`` where given; closing the generator stops the text, its
        caches trimmed."""
        if self.speculator is None:
            self.engine.lanes[0].speculator = Speculator(self.sources, self.scheduler.model, self.scheduler.planner)
        lane = self.engine.lanes[0]
        self.engine.start([0], list(prompt), [lane.speculator], sampling,
                          [(np.random.default_rng(seed), Uniforms(seed))], max_new, self.ctx.n_ctx, [constraint])
        try:
            while lane.state == "prompt" or lane.live:
                for _, step in self.engine.step():
                    yield step
        finally:
            self.engine.stop(0)


class QDraft(Source):
    """A draft model stand-in: samples a two-token chain from q, a blurred copy of the target's p."""

    name = "draft"

    def propose(self, tokens, budget, sampling, rng):
        if budget.max_len < 1:
            return Proposal()
        text, toks, qs = list(tokens), [], []
        for _ in range(min(2, budget.max_len)):
            q = transform(logits_of(text, sharp=False) * 0.5 + 0.3, sampling)
            x = sample(q, rng)
            toks.append(x)
            qs.append(q)
            text.append(x)
        return Proposal((Candidate(tuple(toks), self.name, (5,) * len(toks), tuple(qs)),))


class Oracle(Source):
    """A source that knows what the fake target will say: proposes ``k`` tokens of it, and a
    wrong second candidate sharing its first tokens (a trie with a shared prefix)."""

    name = "oracle"

    def __init__(self, k: int = 6, wrong_after: int = 2) -> None:
        self.k, self.wrong_after = k, wrong_after

    def propose(self, tokens, budget, sampling, rng):
        right = tuple(greedy_text(tokens, min(self.k, budget.max_len)))
        if not right:
            return Proposal()
        wrong = right[:self.wrong_after] + ((right[self.wrong_after] + 1) % (V - 1),) if len(right) > self.wrong_after else ()
        cands = [Candidate(right, self.name, (1,) * len(right))]
        if wrong:
            cands.append(Candidate(wrong, self.name, (1,) * len(wrong)))
        return Proposal(tuple(cands))


class StepLog(Source):
    """A source that records what the engine tells it, to check the outcome it learns from."""

    name = "log"

    def __init__(self):
        self.outcomes: List[Outcome] = []

    def propose(self, tokens, budget, sampling, rng):
        return Proposal()

    def learn(self, outcome):
        self.outcomes.append(outcome)


def with_oracle() -> AcceptanceModel:
    """The oracle's priors (it knows the fake target), and every built-in source's keys at 0.1:
    they know nothing of the fake target's text."""
    registry = default_registry()
    priors = {name: dict.fromkeys(keys, 0.1) for name, keys in registry.priors().items()}
    return AcceptanceModel({**priors, "oracle": {1: 0.9}}, {**dict.fromkeys(priors, 0.1), "oracle": 0.9})


def engine(sources, curve=CostCurve.flat(), **ctx_options):
    eng = OneText(sources, curve, **ctx_options)
    return eng, eng.ctx


def second_and_third_tokens(prompt_of, sampling, n, constraint_of=lambda: None) -> collections.Counter:
    """How often each pair of the 2nd and 3rd tokens comes, over ``n`` seeds (prompt_of(seed)),
    through the engine with lookup and a sampled draft, the KV cache checked after each text."""
    eng, ctx = engine([LookupSource(), QDraft()], sharp=False)
    counts = collections.Counter()
    for seed in range(n):
        got = []
        steps = eng.steps(prompt_of(seed), sampling, seed, 3, constraint=constraint_of())
        for step in steps:
            got += step.tokens
            if len(got) >= 3:
                break
        steps.close()
        counts[tuple(got[1:3])] += 1
        check_kv(ctx, eng.tokens)
    return counts


class BlurredContext(FakeContext):
    """A draft model that is not the target: the fake target's logits, blurred."""

    def logits_ith(self, i: int) -> np.ndarray:
        return super().logits_ith(i) * 0.5 + 0.3


def cheap_draft() -> CostModel:
    """A draft model that costs a tenth of the target per token, on a flat curve: worth asking
    every step. A new one per scheduler: a cost model learns from the decodes it sees, and one
    shared by several tests carried what one test's fakes measured into the next."""
    return CostModel(CostCurve([1.0] * 32, 10.0, 1, "ideal"), {"draft": CostCurve([1.0] * 32, 1.0, 1, "ideal")})
