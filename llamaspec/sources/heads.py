"""Draft heads trained on this machine from the target's own hidden states: one residual block,
as Medusa-1's heads are, applied again and again along the tokens it guesses, as EAGLE's draft
model is (each step reading the token before it, as Hydra's heads do).

The model and its file: ``llamaspec.draft_heads``.

Candidates form a sparse tree along the heads' best path: each head's best ``RANKS`` tokens after
the best tokens of the heads before it (a deeper head reads its predecessor's token, so it is
computed after that one only), keeping the nodes with the most expected accepted tokens. A
head's probability for a token is taken for what it was worth on held-out text (the file's
calibration: a head trained on a few ten thousand tokens is sure too often), and the acceptance
model learns, per head and decile of that, how often a head's token is accepted when the tokens
before it were (evidence ``Guess(head, decile)``). Head k+1 is computed only while the best path
through head k is estimated at least the budget's ``stop_below`` (a deeper token is estimated
lower: it would not be worth its row)::

    pending x[t+1]
      ├─ a  (head 1, best) ──┬─ c (head 2, best after a) ──┬─ f (head 3, best after a c)
      │                      └─ d (head 2, second)          └─ g (head 3, second)
      └─ b  (head 1, second)
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..config import ModelConfig, SamplingConfig, check
from ..draft_heads import MAX_HEADS, RANKS, At, Drafter, Heads, cached_path, largest, one_thread
from .base import Budget, Candidate, Outcome, Proposal, Source
from .registry import Hooks, Option, Plugin, Resources, Room, Target

NAME = "heads"


@dataclass(frozen=True)
class Guess:
    """A head's token: ``head`` (1: the token after the pending one), ``decile``: how often, in
    tenths, the head's tokens were the target's on held-out text where it gave them the
    probability it gives this one (``Heads.calibration``)."""

    head: int
    decile: int


@dataclass(frozen=True)
class HeadsConfig:
    """``file``: a heads file (None: the one trained for the target where it is cached, see
    ``beside``); ``tree``: the tree's nodes at most."""

    file: Optional[str] = None
    tree: int = 16

    def __post_init__(self) -> None:
        check(1 <= self.tree <= 64, f"the heads' tree takes 1 to 64 nodes, got {self.tree}")


def tree(guesses: Sequence[Sequence[Tuple[int, float]]], max_nodes: int, max_len: int) -> List[List[int]]:
    """The heads' sparse tree along their best path: the paths of ranks (0, .., 0, r) (r: the rank
    of the last head's token; a head's guesses follow the best tokens before it) with the
    highest value, ``guesses[i][r]`` = (token, its estimated acceptance) of head i+1's rank r, best
    first; a path's value is the product of its estimates. Returns the tree's leaves as rank
    paths, best first (each path's prefixes are in the tree: its value is at least theirs)."""
    depth = min(len(guesses), max_len)
    if depth == 0 or max_nodes <= 0:
        return []
    heap: List[Tuple[float, Tuple[int, ...]]] = [(-guesses[0][r][1], (r,)) for r in range(len(guesses[0]))]
    heapq.heapify(heap)
    chosen: List[Tuple[int, ...]] = []
    while heap and len(chosen) < max_nodes:
        value, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < depth and path[-1] == 0:
            for r, (_, p) in enumerate(guesses[len(path)]):
                heapq.heappush(heap, (value * p, path + (r,)))
    inner = {p[:-1] for p in chosen}
    return [list(p) for p in chosen if p not in inner]


class HeadsSource(Source):
    """The heads' tree after the pending token, from the hidden state of the row that chose it
    (the last outcome's; nothing before the first step or after a text the engine changed). E_N
    h is that row's logits on the map (llama.cpp's, from the quantized matrix: a little apart
    from the product, well within ``Drafter.is_base``'s bound), checked the first time against the product:
    where a model scales or caps its logits they are not, and the product is computed each step."""

    name = NAME
    own_gate = True  # its products cost time of their own: asked while what it brings repays them

    def __init__(self, heads: Drafter, max_nodes: int) -> None:
        self.heads, self.max_nodes = heads, max_nodes
        self.max_len = heads.k
        # (text length, its hidden state h, the target's logits at h's row, where the decode gave them)
        self.at: Tuple[int, Optional[np.ndarray], Optional[np.ndarray]] = (-1, None, None)
        self.logits_are_base: Optional[bool] = None  # the target's logits on the map are E_N h: seen once

    def propose(self, tokens: Sequence[int], budget: Budget, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        n, h, logits = self.at
        if h is None or n != len(tokens) or budget.max_len < 1:
            return Proposal()
        with one_thread():
            return self._propose(tokens[-1], h, logits, budget)

    def _propose(self, pending: int, h: np.ndarray, logits: Optional[np.ndarray], budget: Budget) -> Proposal:
        at: Optional[At] = None  # where the block stands, once the first head is asked
        read = pending  # the token the next head reads: the pending one, then the best guess
        guesses = []  # per head: (token, evidence, estimated acceptance) of its best RANKS, best first
        best = 1.0  # the estimate of the best path so far: no token deeper is estimated higher
        for k in range(1, min(self.heads.k, budget.max_len) + 1):
            if best < budget.stop_below:  # no deeper token is worth a row: its head's products are spared
                break
            at = self.heads.head(self.heads.start(h, self._base(h, logits)) if at is None else at, read)
            row = at.logits
            top = largest(row, RANKS)
            p = np.exp(row[top] - row[top[0]])
            p /= np.exp(row - row[top[0]]).sum()
            seen = self.heads.calibration[k - 1, np.rint(10 * p).astype(np.int64)]
            keys = [Guess(k, int(np.rint(10 * q))) for q in seen]
            rates = [budget.rates.get(key, PRIORS[key]) for key in keys]
            ranked = sorted(range(RANKS), key=lambda i: (-rates[i], -p[i]))
            guesses.append([(int(self.heads.tokens[top[i]]), keys[i], rates[i]) for i in ranked])
            read, _, rate = guesses[-1][0]
            best *= rate
        paths = tree([[(t, rate) for t, _, rate in g] for g in guesses], self.max_nodes, budget.max_len)
        return Proposal(tuple(Candidate(tuple(guesses[i][r][0] for i, r in enumerate(path)), NAME,
                                        tuple(guesses[i][r][1] for i, r in enumerate(path)))
                              for path in paths[:budget.max_candidates]))

    def learn(self, outcome: Outcome) -> None:
        self.at = (len(outcome.tokens), outcome.hidden, outcome.logits)

    def _base(self, h: np.ndarray, logits: Optional[np.ndarray]) -> np.ndarray:
        """E_N h: the target's logits on the map where they are that (an N x d product spared),
        checked the first time."""
        if logits is None:
            return self.heads.base(h)
        row = logits[self.heads.tokens]
        if self.logits_are_base is None:
            self.logits_are_base = self.heads.is_base(h, row)
        return row if self.logits_are_base else self.heads.base(h)


def _priors() -> Dict[Guess, float]:
    # what the held-out text said (given the tokens before it, as a head's token is verified)
    return {Guess(k, d): min(0.95, max(0.02, 0.1 * d)) for k in range(1, MAX_HEADS + 1) for d in range(11)}


PRIORS = _priors()


class HeadsHooks(Hooks):
    """Heads trained for the target are found in the cache, read before any model loads,
    checked against the target once it is loaded; the target's decodes output hidden states."""

    loads = "a heads file (--heads; `llamaspec heads train` makes one)"

    def complete(self, config: HeadsConfig, model_file: str, cache: Path) -> HeadsConfig:
        found = cached_path(Path(model_file), cache)
        return HeadsConfig(str(found), config.tree) if config.file is None and found.is_file() else config

    def check(self, config: HeadsConfig) -> Optional[Heads]:
        return Heads.read(Path(config.file).expanduser()) if config.file is not None else None

    def available(self, config: HeadsConfig, draft: Optional[ModelConfig]) -> bool:
        return config.file is not None

    def load(self, config: HeadsConfig, resources: Resources, heads: Heads) -> Drafter:
        target = resources.target
        heads.check_model(target.path, target.n_vocab, target.n_embd, Path(str(config.file)))
        return heads.drafter()

    def room(self, config: HeadsConfig, target: Target) -> Room:
        return Room(target.leaves, hidden=True)


PLUGIN = Plugin(
    name=NAME, describe="draft heads trained on this machine (llamaspec heads train)",
    config=HeadsConfig(), options=(
        Option("heads", "file", "Draft heads trained for the model (`llamaspec heads train`); default: the "
               "heads cached for it, if any.", flag="--heads", path=True),
        Option("heads_tree", "tree", "The heads' candidate tree: nodes at most.", flag="--heads-tree")),
    hooks=HeadsHooks(),
    # where lookup copies a token the heads guess too, lookup's estimate counts: the heads' own,
    # higher, made the 1.5B's steps verify copies too far (docs/results.md, "Lookup's priors")
    shadowed_by="lookup",
    build=lambda setup, text: HeadsSource(setup.loaded, setup.config.tree),
    priors=PRIORS, overall=0.3)
