"""The verify loop: every step, one llama_decode carries every live lane's rows; one place rolls
caches back. One text is a lane of its own; several (the samples of one prompt, the requests a
server decodes together) are several lanes of one decode.

A lane is one text on its own KV-cache sequence, its *home* (lane i: sequence i). Between
steps a decoding lane's home holds exactly ``tokens[:-1]`` (its last token is pending), a lane
reading its prompt holds the part read so far, and the scratch sequences (numbered from the
lane count up) hold nothing; a lane's draft model, on sequence i of its own context, holds a
prefix of ``tokens[:-1]``. One step::

    a lane reading its prompt adds the next chunk of it
    for each decoding lane, in turn: ask its sources (Speculator.propose)
    the draft models asked draft, one draft decode a round for every lane (sources/rounds.py)
    for each decoding lane, in turn:
        plan = its speculator's choice, its rows costing what they add to the rows before them
    pad the rows to the last decode's count where changing it costs more (planning/shape.py)
    target.decode(every lane's rows)                       # ONE llama_decode (Engine._launch)
    for each lane: walk its trie, keep the accepted path on its home (Engine._land)
    empty the scratch sequences, trim every home and its  # Engine._trim, the only place
        sources' caches
    for each lane: record its step, its sources learn from its outcome

On a GPU (``overlap``) a step queues the next decode between its landing and its records, so
that the GPU decodes while the host records and the caller reads (Engine.step; a plain step's
record waits until then, or until the sources are next asked).

Three lanes in one batch: lane 0 verifies the trie ``I ─ a ─ b`` with the branch ``└ c`` (on
scratch sequence 3), lane 1 decodes its pending token ``J`` plainly, lane 2 reads the last
three tokens of its prompt (``n``, ``m``, ``k``: the positions of the pending tokens and of the
chunk's first token)::

    row      0    1    2    3    4    5    6    7
    lane     2    2    2    0    0    0    0    1
    token    p    q    r    I    a    b    c    J
    pos      k    k+1  k+2  n    n+1  n+2  n+1  m
    seq 0    .    .    .    x    x    x    .    .
    seq 1    .    .    .    .    .    .    .    x
    seq 2    x    x    x    .    .    .    .    .
    seq 3    .    .    .    x    .    .    x    .
    logits   .    .    x    x    x    x    x    x

A lane's plan may carry lookahead's Jacobi window (a Window, decoded beside the trie, not verified): its rows follow the lane's trie rows, on
scratch sequences after the branches', when the lanes planned before left enough of them free;
otherwise the window waits for a later step.

The samples of one prompt form a group: its first lane reads the prompt, then every other
lane's home shares those cells (seq_cp adds a sequence id to a cell; nothing is copied) and
each lane draws its first token from the same last row with its own random stream.

Each lane's step, in the paper's terms: the sources' candidates merged into a trie (a linear
draft is a one-branch trie, no candidate a plain step) are verified by walking the trie: at
each node the target's own choice (greedy: argmax; sampling: exact speculative sampling), down
the child holding it; the accepted path, then one token of the target's (the correction, or
the bonus token after a whole path). A lane whose text follows a grammar (its ``constraint``)
takes the constrained target's choice at every node: its row with the tokens the grammar forbids
there removed (``walk``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..config import SamplingConfig
from ..errors import DecodeError, PromptError
from ..constraints import Constraint
from ..llama.binding import Context
from ..planning.costs import CostModel
from ..planning.planner import MAX_LEAVES, Limits
from ..planning.shape import Shape, decode
from ..planning.speculator import Plan, Speculator
from ..planning.trie import Layout
from ..sampling import TokenLogprob, logprob_of
from ..sequences import BatchRow, common_prefix
from ..sources import rounds
from ..sources.base import Outcome
from .target import Processor, Target, walk

# Prompt tokens a lane reads per step while other lanes decode (so that a long prompt joining
# delays them by a fraction of a second, not by its whole evaluation).
PREFILL_CHUNK = 64
# The shortest text a lane leaves behind that is saved for a later prompt, and the fewest tokens
# of it no lane or saved text holds (Engine._save).
MIN_SAVED = 32
MIN_NEW = 8
# Prompt tokens read per decode with a row of logits each (echo with log-probabilities): 64 rows
# of a 152k vocabulary are 39 MB of logits.
ECHO_CHUNK = 64

Uniform = Callable[[int], float]
# llama-cpp-python's stopping criterion: (the text's tokens before a new token, the raw row it was
# drawn from) -> whether the text stops before that token.
Criterion = Callable[[np.ndarray, np.ndarray], bool]


@dataclass(frozen=True, kw_only=True)
class Step:
    """One target decode (or the prompt's, for the first token).

    ``tokens``: the new tokens, accepted candidate tokens first, then the target's own.
    ``drafted``: candidate tokens verified, per source (a token proposed by two sources counts
    for both); ``path_sources[i]``: the sources that proposed accepted token i; ``depth``: the
    deepest verified candidate token; ``t_draft``: time an expensive source spent drafting;
    ``branches``: the verified trie's leaves; ``logprobs``: each new token's, when its lane asks
    for them (from the row it was chosen at, shaped as it was); ``asked``: whether the step
    asked the draft sources (see planning.gate); ``echoed``: on a text's first step, when asked
    for, each prompt token's log-probability after the first (from the raw row that read the
    token before it); ``halt``: where the lane's stopping criterion stopped the text (the index
    of the first token not to emit), if it did.
    """

    tokens: List[int] = field(default_factory=list)
    n_drafted: int = 0
    drafted: Dict[str, int] = field(default_factory=dict)
    path_sources: Tuple[Tuple[str, ...], ...] = ()
    depth: int = 0
    t_plan: float = 0.0
    t_draft: float = 0.0
    idle: Dict[str, str] = field(default_factory=dict)
    branches: int = 0
    logprobs: Tuple[TokenLogprob, ...] = ()
    asked: bool = False
    echoed: Tuple[TokenLogprob, ...] = ()
    halt: Optional[int] = None

    @property
    def n_accepted(self) -> int:
        return max(len(self.tokens) - 1, 0)


def check_prompt(n_prompt: int, limit: int) -> None:
    """PromptError unless a prompt of ``n_prompt`` tokens leaves room to generate on a lane of ``limit``."""
    if n_prompt >= limit:
        raise PromptError(f"the prompt has {n_prompt} tokens and the context holds {limit} per sequence, which "
                          f"leaves no room to generate; raise the context size (-c) or shorten the prompt")


@dataclass(eq=False)
class Lane:
    """One text. ``cached``: what its home sequence holds; ``limit``: the positions it may use;
    ``left``: tokens it may still emit. ``state``: "idle", "prompt" (reading its prompt),
    "waiting" (a group's other lane, until the first has read the prompt), "decoding"."""

    home: int
    cached: List[int] = field(default_factory=list)
    tokens: List[int] = field(default_factory=list)
    state: str = "idle"
    group: List[int] = field(default_factory=list)  # the lanes that share this lane's prompt (the first reads it)
    speculator: Optional[Speculator] = None
    target: Target = field(default_factory=Target)  # how it chooses, and the state that carries
    rng: Optional[np.random.Generator] = None
    uniform: Optional[Uniform] = None
    left: int = 0
    limit: int = 0
    stopping: Optional[Criterion] = None
    logprobs: Optional[int] = None  # None: none; k: each token's log-probability and the k best tokens'
    echoed: Optional[List[TokenLogprob]] = None  # the prompt's, gathered while it is read (echo)

    @property
    def live(self) -> bool:
        return self.state == "decoding" and self.left > 0 and len(self.tokens) <= self.limit

    @property
    def sampling(self) -> SamplingConfig:
        return self.target.sampling

    @property
    def constraint(self) -> Optional[Constraint]:
        """Where its text is in its grammar, when it has one."""
        return self.target.constraint


@dataclass(eq=False, kw_only=True)
class LaneRows:
    """A decoding lane's part of one decode: its plan, the trie's layout, the KV-cache sequences
    its rows use (its home first), its batch rows, where its output rows start and how many are
    the pending token's and the trie's (``n_trie``) and the window's (``n_window``); ``text`` and
    ``n_tokens``: the lane's text (its list) and its length when its rows were laid out.
    ``share``: its part of the decode's cost, where other lanes' rows shared the decode (see
    Engine._shares); None where its rows were the decode's only ones."""

    lane: Lane
    plan: Plan
    layout: Layout
    seqs: List[int]
    rows: List[BatchRow]
    out: int
    n_trie: int
    n_window: int
    text: List[int]
    n_tokens: int
    t_plan: float = 0.0
    share: Optional[float] = None


@dataclass(frozen=True)
class PromptChunk:
    """Prompt tokens a lane reads in one decode: ``take`` tokens of ``text`` from position
    ``start``, their output rows from ``out`` on; ``last``: whether they end the prompt."""

    lane: Lane
    text: List[int]
    start: int
    take: int
    out: int
    last: bool


@dataclass(eq=False, kw_only=True)
class Flight:
    """A decode queued (and, unless the engine overlaps, done): every lane's rows, the prompt
    chunks read, the scratch sequences used and the lanes touched (emptied and trimmed when it lands),
    and what its landing needs: the target's ``t_llama`` before it, the decode's verify costs
    (``verify``, behind ``length``), whether its shape was warm, the plans' ``forgone`` score.
    ``error``: a decode that could not be queued, raised when it would have landed unless every
    text it was for (``texts``: lane, its text, its length) has stopped or changed since."""

    lanes_rows: List[LaneRows] = field(default_factory=list)
    chunks: List[PromptChunk] = field(default_factory=list)
    n_rows: int = 0
    n_out: int = 0
    read_hidden: bool = False
    used: List[int] = field(default_factory=list)
    touched: List[Lane] = field(default_factory=list)
    costs: Optional[CostModel] = None
    verify: Optional[Callable[[int], float]] = None
    length: Optional[int] = None
    warm: bool = False
    busy: float = 0.0
    forgone: float = 0.0
    error: Optional[Exception] = None
    texts: List[Tuple[Lane, List[int], int]] = field(default_factory=list)

    def current(self) -> bool:
        """Whether any of its rows still speaks for its lane's text."""
        return any(current(d.lane, d.text, d.n_tokens) for d in self.lanes_rows) or \
            any(reading(c.lane, c.text) for c in self.chunks) or \
            any(current(ln, text, n) for ln, text, n in self.texts)


@dataclass(frozen=True)
class Accepted:
    """What walking a lane's trie gave (Engine._accept): the accepted nodes, the target's own
    token, the window's tokens, the emitted tokens' log-probabilities, where the stopping
    criterion stops and the row read for the sources (hidden state, logits), if any."""

    path: List[int]
    token: int
    window_tokens: Optional[Tuple[int, ...]]
    logprobs: Tuple[TokenLogprob, ...]
    halt: Optional[int]
    read: Optional[Tuple[np.ndarray, np.ndarray]]


def current(lane: Lane, text: List[int], n_tokens: int) -> bool:
    """Whether rows laid out for ``lane`` when its text was ``text`` of ``n_tokens`` tokens still
    speak for it (no stop, cut or new text since)."""
    return lane.state == "decoding" and lane.tokens is text and len(text) == n_tokens


def reading(lane: Lane, text: List[int]) -> bool:
    """Whether a prompt chunk laid out for ``lane`` when its text was ``text`` still speaks for it."""
    return lane.state == "prompt" and lane.tokens is text


class Engine:
    """A target context whose first ``n_lanes`` sequences are lanes; the rest are scratch.
    ``overlap``: each step queues the next decode before it returns (see ``step``)."""

    def __init__(self, target: Context, n_lanes: int, max_leaves: int = MAX_LEAVES, overlap: bool = False,
                 n_saved: int = 0) -> None:
        if n_lanes + n_saved > target.n_seq_max:
            raise DecodeError(f"{n_lanes} lanes and {n_saved} saved texts need {n_lanes + n_saved} KV-cache "
                              f"sequences, the context has {target.n_seq_max}")
        self.target = target
        self.lanes = [Lane(i) for i in range(n_lanes)]
        self.scratch = list(range(n_lanes, target.n_seq_max - n_saved))
        # texts lanes left behind, kept on sequences of their own (the last ones) for a later prompt
        # that starts alike, least recently used first: (sequence, its tokens)
        self.saved: List[Tuple[int, List[int]]] = []
        self._unsaved = list(range(target.n_seq_max - n_saved, target.n_seq_max))
        self.max_leaves = max_leaves
        self._turn = 0  # which lane plans first (turns rotate, so no lane always gets the rows left over)
        self.shape = Shape()  # the last decode's row count, kept while that pays (a GPU's graphs)
        self.overlap = overlap
        self._flight: Optional[Flight] = None  # the next step's decode, queued by this one (overlap)
        self._unrecorded: List[Tuple[LaneRows, Accepted]] = []  # steps settled, their records not made yet
        self._recorded: List[Tuple[int, Step]] = []  # and made, not returned yet

    def vacate(self, keep: Optional[int] = None) -> None:
        """Empty every idle lane but lane ``keep``: its home and its sources' caches (a context
        that decodes one request at a time gives the next one every cell)."""
        for ln in self.lanes:
            if ln.home != keep and ln.state == "idle":
                self.target.seq_rm(ln.home, -1, -1)
                for ctx in ln.speculator.contexts() if ln.speculator is not None else ():
                    ctx.truncate(0)
                ln.cached, ln.tokens, ln.speculator = [], [], None

    def start(self, lanes: Sequence[int], prompt: Sequence[int], speculators: Sequence[Speculator],
              sampling: SamplingConfig, seeds: Sequence[Tuple[np.random.Generator, Uniform]], max_new: int,
              limit: int, constraints: Optional[Sequence[Optional[Constraint]]] = None,
              logprobs: Optional[int] = None, echo: bool = False, processor: Optional[Processor] = None,
              stopping: Optional[Criterion] = None) -> int:
        """Start one sample of ``prompt`` on each of ``lanes`` (idle). The first lane reads what of the
        prompt its home does not hold yet; returns how many tokens that is. ``limit``: the
        positions each lane may use; ``seeds``: each lane's (acceptance rng, uniforms);
        ``constraints``: each lane's grammar state, where its text is constrained; ``logprobs``:
        the best tokens' log-probabilities each step reports with its tokens' (None: none);
        ``echo``: the prompt's tokens' too, reported by the first step (the whole prompt is read
        again, with a row of logits per token); ``processor`` and ``stopping``: llama-cpp-python's
        logits processor (every row the target chooses from goes through it first) and stopping
        criterion (asked after each new token, ``Step.halt``)."""
        check_prompt(len(prompt), limit)
        first = self.lanes[lanes[0]]
        keep = 0 if echo else min(common_prefix(first.cached, prompt), len(prompt) - 1)
        held, n = self._held(first, prompt, keep) if not echo else (None, keep)
        if held is not None:
            self.saved.sort(key=lambda saved: saved[0] == held)  # used now: the last to go
        for i, index in enumerate(lanes):  # what their homes hold and would lose, kept for later prompts
            self._save(self.lanes[index], keep if i == 0 else 0, held)
        if held is not None:  # the cells of another lane's or a saved text's prefix, not read again
            self.target.seq_rm(first.home, -1, -1)
            self.target.seq_cp(held, first.home, 0, n)
            first.cached, keep = list(prompt[:n]), n
        for i, index in enumerate(lanes):
            lane = self.lanes[index]
            if lane.state != "idle":
                raise DecodeError(f"lane {index} is busy")
            lane.cached = lane.cached[:keep] if i == 0 else []
            self.target.seq_rm(lane.home, len(lane.cached), -1)
            lane.tokens = list(prompt)
            lane.state = "prompt" if i == 0 else "waiting"
            lane.group = list(lanes)
            lane.speculator = speculators[i]
            lane.target = Target.start(sampling, constraints[i] if constraints is not None else None, processor)
            lane.rng, lane.uniform = seeds[i]
            lane.left, lane.limit = max_new, limit
            lane.stopping = stopping
            lane.logprobs = logprobs
            lane.echoed = [] if echo and i == 0 else None
        return len(prompt) - keep

    def _held(self, first: Lane, prompt: Sequence[int], keep: int) -> Tuple[Optional[int], int]:
        """The sequence holding more of ``prompt`` than ``first``'s home (``keep`` tokens): another
        lane's home (busy or not: a prompt another client sent a moment ago) or a saved text's,
        and how much of it; (None, keep) where none does. The cache is unified: ``first``'s home
        may take those cells (seq_cp adds a sequence id to cells; nothing is copied or read again)."""
        best, n = None, keep
        for seq, text in [(ln.home, ln.cached) for ln in self.lanes if ln is not first] + self.saved:
            m = min(common_prefix(text, prompt), len(prompt) - 1)
            if m > n:
                best, n = seq, m
        return best, n

    def _save(self, ln: Lane, keep: int, spare: Optional[int]) -> None:
        """``ln``'s home is to keep only ``keep`` tokens of its text: the text is saved on a
        sequence of its own, unless what no lane or saved text holds of it already is too short
        to be worth one (two lanes' answers to one prompt that part a few tokens before their
        end). It takes the sequence of a saved text it goes on from, else a free one,
        else the least recently used saved text's but ``spare``'s. Saved texts give their cells
        back as lanes need them (``_room``)."""
        text = ln.cached
        if keep >= len(text) or len(text) < MIN_SAVED:
            return
        others = [o.cached for o in self.lanes if o is not ln] + [t for _, t in self.saved]
        if len(text) - max([keep] + [common_prefix(t, text) for t in others]) < MIN_NEW:
            return
        extended = [i for i, (s, t) in enumerate(self.saved) if s != spare and common_prefix(t, text) == len(t)]
        if extended:
            seq = self._evict(extended[0])
        elif self._unsaved:
            seq = self._unsaved.pop()
        elif any(s != spare for s, _ in self.saved):
            seq = self._evict(next(i for i, (s, _) in enumerate(self.saved) if s != spare))
        else:
            return
        self.target.seq_cp(ln.home, seq, 0, len(text))
        self.saved.append((seq, list(text)))

    def _evict(self, i: int = 0) -> int:
        """Drop saved text ``i`` (the least recently used by default); its sequence."""
        seq, _ = self.saved.pop(i)
        self.target.seq_rm(seq, -1, -1)
        return seq

    def _room(self, rows: int) -> None:
        """Saved texts give their cells back (least recently used first) until ``rows`` more fit
        in the cache however many of the cells lanes and saved texts share."""
        while self.saved and self._cells() + rows > self.target.n_ctx:
            self._unsaved.append(self._evict())

    def stop(self, lane: int, keep: Optional[int] = None) -> None:
        """Lane ``lane`` leaves the batch, its text cut to ``keep`` tokens (its home keeps what it
        holds of them, for a later prompt that starts alike)."""
        ln = self.lanes[lane]
        if keep is not None:
            del ln.tokens[keep:]
        if ln.state in ("prompt", "waiting"):
            for other in ln.group:  # a group whose prompt is not read stops together
                self.lanes[other].state = "idle"
        ln.state = "idle"
        f = self._flight
        if f is not None and not f.current():  # queued for texts that all stopped: it brings nothing
            self.drain()
        elif f is not None:  # its rows of this lane are dropped when it lands; their branches go now
            for d in f.lanes_rows:
                if d.lane is ln:
                    for seq in d.seqs[1:]:
                        self.target.seq_rm(seq, -1, -1)
        self._trim([ln])

    def step(self) -> List[Tuple[int, Step]]:
        """One decode for every lane with work; returns (lane, Step) for each lane that emitted
        tokens (the lanes of a group whose prompt was just read each emit their first).

        With ``overlap`` the step lays out and queues the next decode before it returns, so that
        a GPU decodes it while the caller reads these steps (and the engine's own bookkeeping of
        the step waits for the decode instead of the decode for it). Nothing else changes: the
        next step plans from what this one settled, exactly as it would have after the return.
        A lane the caller stops meanwhile (``stop``, which may cut its text) has its rows' cells
        dropped at once and their outputs when the decode lands (a decode left with no text to
        speak for lands at once); a request admitted meanwhile joins the decode after. Every
        change to the cache waits for a decode under way (the context's own)."""
        flight, self._flight = self._flight or self._launch(), None
        if flight is None:
            return []
        emitted, self._unrecorded = self._land(flight)
        if self.overlap:
            # the steps up to the last that asked are recorded now: the next step's asking depends
            # on what they teach; a plain step's teach nothing it does unless its sources are
            # asked, and are recorded then (before_asking) or once the decode is queued
            last = max((i for i, (d, _) in enumerate(self._unrecorded) if d.plan.asked), default=-1)
            self._record(last + 1)
            try:
                self._flight = self._launch()
            except Exception as e:  # these steps' tokens are their texts' already: the error waits for the next step
                self._flight = Flight(error=e, texts=[(ln, ln.tokens, len(ln.tokens)) for ln in self.lanes if ln.live])
        return emitted + self._records()

    def _records(self) -> List[Tuple[int, Step]]:
        """Every settled step recorded, and taken."""
        self._record_all()
        recorded, self._recorded = self._recorded, []
        return recorded

    def _record_all(self) -> None:
        self._record(len(self._unrecorded))

    def _record(self, n: int) -> None:
        """Record the first ``n`` steps settled and not recorded: each one's Step, and what every
        source learns from it."""
        for d, a in self._unrecorded[:n]:
            self._recorded.append((d.lane.home, self._steps(d, a)))
        del self._unrecorded[:n]

    @property
    def queued(self) -> bool:
        """Whether a step queued the next decode, not landed yet (``overlap``): until it lands,
        the lanes' homes hold its rows after their texts."""
        return self._flight is not None

    def drain(self) -> List[Tuple[int, Step]]:
        """Land the decode a step queued (``overlap``), queuing none: the steps it brings, after
        which every lane's home holds exactly its text before its pending token."""
        flight, self._flight = self._flight, None
        if flight is None:
            return []
        emitted, self._unrecorded = self._land(flight)
        return emitted + self._records()

    def _launch(self) -> Optional[Flight]:
        """Every lane's rows, laid out and queued in one decode (waited for unless ``overlap``):
        the prompt chunks of lanes reading theirs, then each decoding lane's pending token, trie
        and window, as its speculator plans them. None when no lane has work."""
        target = self.target
        rows: List[BatchRow] = []
        n_out = 0
        live = [ln for ln in self.lanes if ln.live]
        reading = [ln for ln in self.lanes if ln.state == "prompt"]
        committed = len(live)  # every live lane's pending token
        free = list(self.scratch)
        f = Flight(touched=live + reading)
        try:
            for ln in reading:
                room = target.n_batch - committed
                take = min(len(ln.tokens) - len(ln.cached), room if not live else min(room, PREFILL_CHUNK))
                echo = ln.echoed is not None
                if echo:
                    take = min(take, ECHO_CHUNK)
                if take <= 0:
                    continue
                start = len(ln.cached)
                last = start + take == len(ln.tokens)
                for i, token in enumerate(ln.tokens[start:start + take]):
                    rows.append(BatchRow(token, start + i, (ln.home,), echo or (last and i == take - 1)))
                f.chunks.append(PromptChunk(ln, ln.tokens, start, take, n_out, last))
                n_out += take if echo else last
                committed += take
            order = live[self._turn % len(live):] + live[:self._turn % len(live)] if live else []
            self._turn += 1
            f.costs = costs = order[0].speculator.costs if order else None
            if costs is not None:
                self.shape.switch = costs.switch
            asked, t_ask = [], []
            for ln in order:  # what is asked of the sources, before any lane's rows are laid out
                t0 = time.perf_counter()
                asked.append(ln.speculator.propose(ln.tokens, self._limits(ln, committed, len(free)), ln.sampling,
                                                   ln.rng, ln.constraint, before_asking=self._record_all))
                t_ask.append(time.perf_counter() - t0)
            drafted = iter(rounds.together([drafting for a in asked for _, drafting in a.drafting]))
            for ln, a, t in zip(order, asked, t_ask):
                t0 = time.perf_counter()
                own = [next(drafted) for _ in a.drafting]
                plan = ln.speculator.choose(a, own, self._limits(ln, committed, len(free)))
                f.forgone += plan.choice.forgone  # what the plans would score more, were a change of shape free
                mine = self._lay_out(ln, plan, free, n_out)
                mine.t_plan = t + time.perf_counter() - t0 + plan.t_draft
                f.used += mine.seqs[1:]
                rows += mine.rows
                f.lanes_rows.append(mine)
                n_out += mine.n_trie + mine.n_window
                committed += len(mine.rows) - 1
            if not rows:
                self._release(f)
                return None
            f.length = max(len(d.lane.tokens) for d in f.lanes_rows) if f.lanes_rows else None
            f.verify = (lambda n: costs.verify(n, f.length)) if costs is not None else None
            if f.lanes_rows and f.verify is not None:
                self._pad(rows, free, f.used, f.verify)
            f.warm = self.shape.warm(len(rows))
            f.busy = target.t_llama
            f.read_hidden = target.hidden_states and bool(f.lanes_rows)  # a source reads them: verified rows' only
            f.n_rows, f.n_out = len(rows), n_out
            self._room(len(rows))
            target.decode_rows(rows, hidden=f.read_hidden, wait=not self.overlap)
        except BaseException:
            self._release(f)
            raise
        return f

    def _land(self, f: Flight) -> Tuple[List[Tuple[int, Step]], List[Tuple["LaneRows", "Accepted"]]]:
        """Wait for the flight's decode; read each prompt chunk's outputs (the first tokens of the
        lanes whose prompt it ends: their steps), and walk each decoding lane's trie on its rows,
        keeping the accepted path on its home (what it accepted, to record); empty the scratch
        sequences and trim every lane it touched."""
        if f.error is not None:
            if f.current():
                raise f.error
            return [], []  # its lanes stopped since: nothing was lost
        target = self.target
        emitted: List[Tuple[int, Step]] = []
        settled: List[Tuple[LaneRows, Accepted]] = []
        try:
            target.synchronize()
            # a batch's rows attend to their own lane's text: priced behind the longest
            if f.costs is not None and f.warm:
                f.costs.observe(CostModel.TARGET, f.n_rows, target.t_llama - f.busy, f.length)
            logits = target.logits(f.n_out)
            hidden = target.hidden(f.n_out) if f.read_hidden else None
            for c in f.chunks:
                ln = c.lane
                if not reading(ln, c.text):
                    continue  # stopped while its chunk was decoded
                ln.cached += ln.tokens[c.start:c.start + c.take]
                if ln.echoed is not None:  # row i read token start + i; the next one is the prompt's
                    ln.echoed += [logprob_of(logits[c.out + i], ln.tokens[c.start + i + 1], ln.logprobs or 0)
                                  for i in range(c.take) if c.start + i + 1 < len(ln.tokens)]
                if c.last:  # the prompt's last row: every row has logits when echoing, else only it
                    emitted += self._first_tokens(ln, logits[c.out + c.take - 1 if ln.echoed is not None else c.out])
            accepted = 0
            for d in f.lanes_rows:
                if not current(d.lane, d.text, d.n_tokens):
                    continue  # stopped or cut while its rows were decoded: their cells went with its text
                window = logits[d.out + d.n_trie:d.out + d.n_trie + d.n_window]
                window_tokens = tuple(int(t) for t in window.argmax(axis=1)) if d.n_window else None
                a = self._accept(d, logits[d.out:], window_tokens, hidden[d.out:] if hidden is not None else None)
                accepted += len(a.path)
                settled.append((d, a))
            self.shape.decoded(f.n_rows, accepted, f.verify, f.forgone)
            self._shares(f)
        finally:
            self._release(f)
        return emitted, settled

    @staticmethod
    def _shares(f: Flight) -> None:
        """Each decoding lane's share of the decode (what its rows and the other lanes' cost
        together, in proportion to its rows) and its own drafting. A lane's plan prices its rows by what they add to the
        others' (Limits.base_rows); learnt as its cost, those marginal costs would add up to far
        less than the decode (on a CPU a row's marginal cost is near its average) and make a unit
        of cost look worth more tokens than the batch reaches, so that no draft would pay. The
        planner's exchange rate (Planner.rate) learns from these shares: tokens per unit of the
        whole batch's cost."""
        if f.verify is None or (len(f.lanes_rows) < 2 and not f.chunks):
            return
        rows = sum(len(d.rows) for d in f.lanes_rows)
        whole = f.verify(rows)
        for d in f.lanes_rows:
            d.share = whole * len(d.rows) / rows + d.plan.sunk

    def _release(self, f: Flight) -> None:
        """Empty the scratch sequences a decode used and trim the lanes it touched."""
        for s in f.used:
            self.target.seq_rm(s, -1, -1)
        self._trim(f.touched)

    def _limits(self, ln: Lane, committed: int, n_free: int) -> Limits:
        """What lane ``ln`` may plan after ``committed`` rows, with ``n_free`` scratch sequences left."""
        room = ln.limit - len(ln.tokens)
        return Limits(max_depth=min(ln.left - 1, room), max_rows=min(self.target.n_batch - committed + 1, room + 1),
                      room=room, max_leaves=min(self.max_leaves, n_free + 1), base_rows=committed - 1,
                      length=len(ln.tokens), shape=self.shape.kept, switch=self.shape.switch)

    def _pad(self, rows: List[BatchRow], free: List[int], used: List[int],
             verify: Callable[[int], float]) -> None:
        """Pad ``rows`` up to the last decode's count where that costs less than changing it
        (planning/shape.py; ``verify(n)``: a decode of n rows replayed): rows of a scratch
        sequence of their own (emptied after the decode), each with a row of logits as a
        verified row has, so that the decode has the last one's shape."""
        padding = decode(len(rows), self.shape.kept, self.shape.switch, verify)[0] - len(rows)
        if padding <= 0 or not free or self._cells() + len(rows) + padding > self.target.n_ctx:
            return
        seq = free.pop(0)
        used.append(seq)
        rows += [BatchRow(rows[-1].token, i, (seq,), True) for i in range(padding)]

    def _cells(self) -> int:
        """KV cells the lanes' homes and the saved texts hold at most (a cell they share counted
        for each)."""
        return sum(len(ln.cached) for ln in self.lanes) + sum(len(t) for _, t in self.saved)

    def _lay_out(self, ln: Lane, plan: Plan, free: List[int], out: int) -> "LaneRows":
        """A decoding lane's rows: its pending token, its trie and, when enough of the ``free``
        scratch sequences are left (those it takes are removed), its window; its output rows
        start at ``out``."""
        n = len(ln.tokens)
        layout = plan.trie.layout()
        local = list(layout.rows)
        n_seqs = layout.n_seqs
        n_trie = 1 + sum(1 for row in local if row.logits)  # the pending token's and the nodes'
        n_window = 0
        window = plan.window
        if window is not None and n_seqs - 1 + window.n_seqs > len(free):
            window = None  # the lanes before took the scratch sequences: the window waits
        if window is not None:  # its columns: sequences after the branches'
            local += window.after(n_seqs)
            n_seqs += window.n_seqs
            n_window = sum(1 for row in window.rows if row.logits)
        seqs = [ln.home] + free[:n_seqs - 1]
        del free[:n_seqs - 1]
        for s in seqs[1:]:
            self.target.seq_cp(ln.home, s, -1, -1)  # a branch or window column sees the whole text
        rows = [BatchRow(ln.tokens[-1], n - 1, tuple(seqs), True)]
        rows += [BatchRow(token, n - 1 + offset, tuple(seqs[s] for s in ids), logits) for token, offset, ids, logits in local]
        return LaneRows(lane=ln, plan=plan, layout=layout, seqs=seqs, rows=rows, out=out, n_trie=n_trie,
                        n_window=n_window, text=ln.tokens, n_tokens=n)

    def _first_tokens(self, first: Lane, row: np.ndarray) -> List[Tuple[int, Step]]:
        """The group's prompt is read: every lane of it shares the cells and draws its first token."""
        out = []
        n = len(first.tokens)
        echoed = tuple(first.echoed) if first.echoed is not None else ()
        first.echoed = None
        for index in first.group:
            ln = self.lanes[index]
            if ln is not first:
                if ln.state != "waiting":
                    continue
                self.target.seq_rm(ln.home, -1, -1)
                self.target.seq_cp(first.home, ln.home, -1, -1)
                ln.cached = list(first.cached)
            if ln.left <= 0:  # nothing to generate (max_tokens 0): a step of no tokens ends it
                ln.state = "decoding"
                out.append((ln.home, Step(echoed=echoed)))
                continue
            shaped = ln.target.row(row, ln.tokens)
            token = ln.target.choose(shaped, lambda: ln.uniform(n))
            logprobs = (logprob_of(shaped, token, ln.logprobs),) if ln.logprobs is not None else ()
            halt = halted(ln.stopping, ln.tokens, [token], [row])
            ln.tokens.append(token)
            ln.left -= 1
            ln.state = "decoding"
            out.append((ln.home, Step(tokens=[token], logprobs=logprobs, echoed=echoed, halt=halt)))
        return out

    def _accept(self, d: "LaneRows", logits: np.ndarray, window_tokens: Optional[Tuple[int, ...]],
                hidden: Optional[np.ndarray]) -> "Accepted":
        """Walk the lane's trie on its rows and keep the accepted path on its home: its text goes
        on. What the step's record needs of the decode's outputs is read now (the next decode
        writes over them): the emitted tokens' log-probabilities, where the stopping criterion
        stops, the hidden state and the logits of the row the target's own token came from."""
        ln, plan, seqs = d.lane, d.plan, d.seqs
        n = len(ln.tokens)
        trie = plan.trie
        path, token, rows = walk(trie, logits, ln.target, ln.rng, lambda depth: ln.uniform(n + depth), ln.tokens)
        accepted = [trie.token[v] for v in path]
        logprobs = () if ln.logprobs is None else tuple(
            logprob_of(row, x, ln.logprobs) for row, x in zip(rows, accepted + [token]))
        halt = halted(ln.stopping, ln.tokens, accepted + [token], [logits[v] for v in [0] + path])
        ln.cached.append(ln.tokens[-1])  # the pending token's row is on the home sequence
        if path:
            keep = seqs[d.layout.seq[path[-1]]]
            if keep != ln.home:
                m = len(ln.cached)
                self.target.seq_rm(ln.home, m, -1)
                self.target.seq_cp(keep, ln.home, m, m + len(accepted))
            ln.cached += accepted
        ln.tokens += accepted + [token]
        ln.left -= len(accepted) + 1
        last = path[-1] if path else 0  # the row of the target's own token
        read = (np.array(hidden[last]), np.array(logits[last])) if hidden is not None else None  # copies
        return Accepted(path, token, window_tokens, logprobs, halt, read)

    def _steps(self, d: "LaneRows", a: "Accepted") -> Step:
        """The step's record, and what every source learns from it (the window from the target's
        greedy tokens at its rows, when it rode; the hidden state and the logits, when read)."""
        outcome, step = settle(d.plan, a.path, a.token, a.window_tokens, d.lane.tokens, d.t_plan, a.logprobs, a.halt,
                               a.read)
        d.lane.speculator.learn(outcome, d.share)
        return step

    def _trim(self, lanes: Sequence[Lane]) -> None:
        # A lane's home, and its sources' caches (a draft model's sequence), must hold a prefix of
        # its text before the pending token; whatever lies past that is dropped here (rejected
        # rows, draft tokens, a decode that failed, a cut text).
        for ln in lanes:
            n = max(len(ln.tokens) - 1, 0)  # the text before the pending token: ln.tokens[:n]
            keep = min(common_prefix(ln.cached, ln.tokens), n)
            del ln.cached[keep:]
            self.target.seq_rm(ln.home, keep, -1)
            for ctx in ln.speculator.contexts() if ln.speculator is not None else ():
                ctx.truncate(min(common_prefix(ctx.tokens, ln.tokens), n))


def halted(stopping: Optional[Criterion], text: Sequence[int], new: Sequence[int],
           rows: Sequence[np.ndarray]) -> Optional[int]:
    """Where ``stopping`` stops a text that gains the tokens ``new`` after ``text``, each drawn
    from the raw row beside it: the index of the first new token it says not to emit, if any
    (asked once per token, in order, as llama-cpp-python asks it)."""
    if stopping is None:
        return None
    for j, row in enumerate(rows):
        if stopping(np.array([*text, *new[:j]], dtype=np.intc), row):
            return j
    return None


def settle(plan: Plan, path: Sequence[int], token: int, window_tokens: Optional[Tuple[int, ...]],
           tokens: Sequence[int], t_plan: float, logprobs: Tuple[TokenLogprob, ...] = (), halt: Optional[int] = None,
           read: Optional[Tuple[np.ndarray, np.ndarray]] = None) -> Tuple[Outcome, Step]:
    """What a verified step showed (for learning) and what it emitted (for the caller).
    ``tokens``: the text after the step; its cost is the plan's: what its rows (and drafting)
    add to the decode, in single-token decodes. ``logprobs`` and ``halt``: the step's (see
    Step); ``read``: the hidden state and the logits of the row of the target's own token, where
    the decode output hidden states."""
    trie, candidates = plan.trie, plan.candidates
    accepted = [trie.token[v] for v in path]
    path_sources = tuple(trie.sources(v, candidates) for v in path)
    outcome = Outcome(tokens=tokens, candidates=candidates, verified=plan.lengths, emitted=tuple(accepted + [token]),
                      path_sources=path_sources, window_tokens=window_tokens, cost=plan.choice.cost,
                      estimated=plan.choice.estimated, seconds=t_plan - plan.t_draft,
                      hidden=read[0] if read is not None else None, logits=read[1] if read is not None else None)
    drafted = trie.drafted(candidates)
    branches = sum(1 for v in range(1, len(trie)) if not trie.children[v])
    step = Step(tokens=accepted + [token], n_drafted=len(trie) - 1, drafted=drafted, path_sources=path_sources,
                depth=max(trie.depth), t_plan=t_plan, t_draft=plan.t_draft, idle=plan.idle, branches=branches,
                logprobs=logprobs, asked=plan.asked, halt=halt)
    return outcome, step
