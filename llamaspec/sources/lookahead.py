"""Lookahead decoding (Fu et al., 2024): Jacobi iteration and an n-gram pool, no draft model.

Two parts, both offered to the planner every step by ``LookaheadSource``:

- the pool: N-grams seen so far (in the prompt, the references, the output, and those the
  window produced), keyed by their first token. The N-grams that start with the pending token
  are candidates, verified in the trie like every other source's (see ``trie.py``);
- the window: W columns by N - 1 levels of Jacobi guesses ``L``. Column i is a little
  sequence (level 0 up to column i, then its own levels); the output of its last level is a
  fresh guess one position further, so each ride refines the guesses, and every column yields
  an N-gram for the pool. The window rides along in the verify batch, after the trie's rows,
  when the planner finds its value (future tokens from its N-grams, learned) worth its rows.

The window's rows for W = 4, N = 4 (``x``: the row belongs to that column's KV-cache sequence;
offsets count from the pending token ``I``, whose row is the trie's root, shared by every
sequence)::

    row      0 |  1  2  3  4  5  6  7  8  9 10 11
    level    I |  0  0  0  1  1  1  1  2  2  2  2
    column   0 |  1  2  3  0  1  2  3  0  1  2  3
    offset   0 |  1  2  3  1  2  3  4  2  3  4  5
    logits   . |  0  0  0  0  0  0  0  1  1  1  1
    column 0 x |  .  .  .  x  .  .  .  x  .  .  .
    column 1 x |  x  .  .  .  x  .  .  .  x  .  .
    column 2 x |  x  x  .  .  .  x  .  .  .  x  .
    column 3 x |  x  x  x  .  .  .  x  .  .  .  x

Column i reads, position by position: I, level 0 of columns 1..i, then its own levels
1..N-2; its last level's output guesses the next position. After the decode each column's
N-gram (its level-0 token, its levels 1..N-2, the new guess) goes into the pool; the levels
move up by one and the new guesses become the last level; each further accepted token moves
them up once more, so every guess stays at its position. The window's sequences are emptied
after every step, like the trie's (it is decoded anew each ride, as in llama.cpp).

With ``SpecConfig(fixed={"lookahead"})`` every step verifies all G candidates and the window
always rides, as llama.cpp's ``llama-lookahead`` does.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..llama.binding import max_sequences
from .base import LENGTH_BUCKETS, Budget, Candidate, Outcome, Proposal, Window, Source, length_bucket
from .registry import Hooks, Option, Plugin, Room, Target
from ..config import SamplingConfig, check
from ..errors import ConfigError
from ..sequences import BatchRow, appended, common_prefix


@dataclass(frozen=True)
class LookaheadConfig:
    """Lookahead decoding: a window of ``w`` columns by ``n - 1`` levels of Jacobi guesses,
    n-grams of ``n`` tokens, up to ``g`` pool candidates per step."""

    w: int = 4
    n: int = 4
    g: int = 4

    def __post_init__(self) -> None:
        check(self.w >= 0, f"lookahead W must be >= 0, got {self.w}")
        check(self.n >= 2, f"lookahead N must be >= 2, got {self.n}")
        check(self.g >= 0, f"lookahead G must be >= 0, got {self.g}")
        check(self.w + self.g >= 1, "lookahead needs a window (W >= 1) or candidates (G >= 1)")


@dataclass(frozen=True)
class Pooled:
    """A token of a pool n-gram: ``length`` the length bucket of its match with the text, up
    to that token; ``window``: the Jacobi window produced the n-gram, not the text."""

    length: int
    window: bool = False

# What one window ride is worth before any evidence (future accepted tokens), its weight in
# rides, and how fast evidence decays (per step).
WINDOW_PRIOR = 0.1
WINDOW_WEIGHT = 4.0
WINDOW_DECAY = 0.98


class NgramPool:
    """N-grams seen so far, keyed by their first token: the candidates to verify.

    Each n-gram also remembers the ``CONTEXT`` tokens before it. Candidates whose context
    matches the text's come first, longest match first (a match of several tokens is better
    evidence that the text is repeating), then the most recent. At most ``per_key``
    continuations are kept per first token; the oldest go.
    """

    CONTEXT = 3

    def __init__(self, n: int, per_key: int = 16) -> None:
        if n < 2:
            raise ConfigError(f"lookahead n-grams need N >= 2, got {n}")
        self.n, self.per_key = n, per_key
        # first token -> continuation (n - 1 tokens) -> (the tokens before the n-gram, from the window?)
        self._grams: Dict[int, "OrderedDict[Tuple[int, ...], Tuple[Tuple[int, ...], bool]]"] = {}

    def __len__(self) -> int:
        return sum(len(c) for c in self._grams.values())

    def add(self, ngram: Sequence[int], before: Sequence[int] = (), window: bool = False) -> None:
        """Remember ``ngram`` (``n`` tokens), seen after the tokens ``before``; ``window``: the
        Jacobi window produced it (the text did not, yet)."""
        if len(ngram) != self.n:
            raise ValueError(f"expected {self.n} tokens, got {len(ngram)}")
        conts = self._grams.setdefault(int(ngram[0]), OrderedDict())
        cont = tuple(int(t) for t in ngram[1:])
        old = conts.pop(cont, None)
        window = window and (old is None or old[1])  # seen in the text once: a text n-gram
        conts[cont] = (tuple(int(t) for t in before[-self.CONTEXT:]), window)  # most recent last
        if len(conts) > self.per_key:
            conts.popitem(last=False)

    def add_text(self, tokens: Sequence[int], start: int = 0) -> None:
        """Add every n-gram of ``tokens`` that ends at or after index ``start``."""
        for i in range(max(0, start - self.n + 1), len(tokens) - self.n + 1):
            self.add(tokens[i:i + self.n], tokens[max(0, i - self.CONTEXT):i])

    def candidates(self, before: Sequence[int], key: int, g: int) -> List[Tuple[List[int], int, bool]]:
        """Up to ``g`` continuations of ``key``, best first, each with how many of the tokens
        before it match the end of ``before`` and whether the window produced it."""
        conts = self._grams.get(int(key))
        if not conts:
            return []
        scored = [(list(cont), _suffix_match(ctx, before), window) for cont, (ctx, window) in reversed(conts.items())]
        scored.sort(key=lambda item: -item[1])  # stable: the most recent first among equals
        return scored[:g]


def _suffix_match(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens at the end of ``a`` equal those at the end of ``b``."""
    n = 0
    while n < len(a) and n < len(b) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


class JacobiWindow:
    """The Jacobi guesses: ``levels[j, i]`` guesses the token at n_past + i + j (level 0,
    column 0 is the pending token itself)."""

    def __init__(self, w: int, n: int, seed_tokens: Sequence[int]) -> None:
        self.w, self.n = w, n
        rng = np.random.default_rng(0)  # guesses only change speed, never the output
        pool = np.asarray(seed_tokens if len(seed_tokens) else [0], dtype=np.int64)
        self.levels = rng.choice(pool, size=(n - 1, w))

    def rows(self) -> List[BatchRow]:
        """The window's batch rows, column i on local sequence i; logits on the last level."""
        w, last = self.w, self.n - 2
        rows = [BatchRow(int(self.levels[0, i]), i, tuple(range(i, w)), last == 0) for i in range(1, w)]
        for j in range(1, self.n - 1):
            rows += [BatchRow(int(self.levels[j, i]), i + j, (i,), j == last) for i in range(w)]
        return rows

    def advance(self, before: Sequence[int], guesses: np.ndarray,
                moves: int) -> List[Tuple[List[int], List[int]]]:
        """Take the new guesses (one per column), return each column's n-gram with the tokens
        before it, and move the levels up ``moves`` times (1 + the accepted draft tokens).
        ``before`` is the text up to the pending token, which is included."""
        self.levels[0, 0] = before[-1]
        line = [*before[-NgramPool.CONTEXT - 1:-1], *self.levels[0].tolist()]  # the text, then level 0
        offset = len(line) - self.w
        grams = [([*self.levels[:, i].tolist(), int(guesses[i])], line[max(0, offset + i - NgramPool.CONTEXT):offset + i])
                 for i in range(self.w)]
        for step in range(moves):
            refill = guesses if step == 0 else self.levels[0].copy()
            self.levels[:-1] = self.levels[1:].copy()
            self.levels[-1] = refill
        return grams


class LookaheadSource(Source):
    """Lookahead decoding as a draft source: pool n-grams that start with the pending token are
    candidates, and the Jacobi window is a window (it rides when the planner finds it pays).

    Evidence: token i of an n-gram whose preceding tokens match the text on m tokens is
    ``Pooled(length_bucket(1 + m + i), window)`` (the n-gram's first token matches too), with
    ``window`` for n-grams the window produced rather than the text.
    """

    name = "lookahead"

    def __init__(self, config: LookaheadConfig, references: Sequence[Sequence[int]] = ()) -> None:
        self.config = config
        self.max_len = config.n - 1
        self.pool = NgramPool(config.n)
        for ref in references:
            self.pool.add_text(ref)
        self.window: Optional[JacobiWindow] = None
        self._seen: List[int] = []  # the text whose n-grams the pool holds
        # decayed (tokens accepted from window n-grams, window rides): what a ride is worth
        self._credit, self._rides = 0.0, 0.0

    def window_value(self) -> float:
        """Expected future accepted tokens per window ride, learned (prior WINDOW_PRIOR)."""
        return (self._credit + WINDOW_WEIGHT * WINDOW_PRIOR) / (self._rides + WINDOW_WEIGHT)

    def propose(self, tokens: Sequence[int], budget: Budget, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        self._follow(tokens)
        if self.window is None and self.config.w > 0:
            self.window = JacobiWindow(self.config.w, self.config.n, tokens)
        k = min(self.config.n - 1, budget.max_len)
        found = self.pool.candidates(tokens[-1 - NgramPool.CONTEXT:-1], tokens[-1], self.config.g) if k > 0 else []
        cands = tuple(Candidate(tuple(cont[:k]), self.name,
                                tuple(Pooled(length_bucket(1 + match + i), window) for i in range(k)))
                      for cont, match, window in found)
        window = None
        if self.window is not None:
            window = Window(tuple(self.window.rows()), self.config.w, self.window_value())
        return Proposal(cands, window)

    def learn(self, outcome: Outcome) -> None:
        emitted = outcome.emitted
        accepted = emitted[:-1]
        best = 0  # tokens the best window n-gram gave
        for cand in outcome.candidates:
            if cand.source == self.name:
                n = 0
                while n < min(len(cand.tokens), len(accepted)) and cand.tokens[n] == accepted[n]:
                    n += 1
                if cand.evidence and cand.evidence[0].window:
                    best = max(best, n)
        self._credit *= WINDOW_DECAY
        self._rides *= WINDOW_DECAY
        self._credit += best
        if outcome.window_tokens is not None and self.window is not None:
            self._rides += 1
            guesses = list(outcome.window_tokens)
            if self.config.n == 2:  # the last level is level 0: column 0's guess is the pending token's successor
                guesses = [emitted[0], *guesses]
            text = outcome.tokens
            before = text[max(0, len(text) - len(emitted) - NgramPool.CONTEXT - 1):len(text) - len(emitted)]
            for gram, ctx in self.window.advance(before, np.asarray(guesses), len(emitted)):
                self.pool.add(gram, ctx, window=True)
        self._follow(outcome.tokens)

    def _follow(self, tokens: Sequence[int]) -> None:
        """Add the n-grams of text the pool has not seen (after a cut, only past the common part)."""
        keep = len(self._seen) if appended(self._seen, tokens) is not None else common_prefix(self._seen, tokens)
        if keep < len(tokens):
            self.pool.add_text(tokens, keep)
            del self._seen[keep:]
            self._seen += tokens[keep:]

    def contexts(self) -> list:
        return []

    def finish(self, tokens: Sequence[int]) -> None:
        pass


def check_fits(config: LookaheadConfig, n_ctx: int, n_batch: int, leaves: int, whole: bool = False) -> int:
    """The KV-cache sequences a context needs for lookahead (the text, a branch per candidate, at
    least ``leaves``, a column per window column), refused when llama.cpp cannot have that many.
    With ``whole`` (every step carries all G candidates and the window, as llama-lookahead) a
    step that a batch of ``n_batch`` or half the ``n_ctx`` context cannot hold is refused too;
    otherwise the planner sizes each step to what fits. Checked before anything is loaded."""
    n_seq = 1 + max(config.g, leaves) + config.w
    if n_seq > max_sequences():
        raise ConfigError(f"lookahead needs {n_seq} KV-cache sequences (W + G + 1 at least); llama.cpp allows "
                          f"at most {max_sequences()}")
    rows = (config.w + config.g) * (config.n - 1)
    if whole and rows > n_batch:
        raise ConfigError(f"a lookahead step decodes up to (W + G) * (N - 1) = {rows} tokens but a batch "
                          f"holds {n_batch}; lower W, G or N")
    if whole and rows + 1 > n_ctx // 2:
        raise ConfigError(f"a lookahead step needs {rows + 1} cells beyond the text, more than half the "
                          f"{n_ctx}-token context; lower W, G or N or raise the context size (-c)")
    return n_seq


# Priors, by the length bucket of the match (from replays of the recorded answers, see lookup's);
# any other key, the window's n-grams' among them, OTHER. Lookup shadows the pool: it holds the
# n-grams of the prompt, the references and the output, which lookup reads too; lookup's
# evidence (match length, the anchor's edit history) knows where a copy is about to be edited,
# the pool's (context match) does not, and its estimates, learned mostly where both agree on a
# copy, would rate the edit points as copies. (On a steep CPU curve the best of the two made
# `auto` slower than lookup alone in replays.)
_POOL = {1: 0.15, 2: 0.22, 3: 0.43, 4: 0.75, 5: 0.8, 8: 0.85}
OTHER = 0.1


class LookaheadHooks(Hooks):
    def room(self, config: LookaheadConfig, target: Target) -> Room:
        """A branch per candidate (at least the trie's leaves) and a sequence per window column,
        once they fit."""
        check_fits(config, target.n_ctx, target.n_batch, target.leaves, target.whole)
        return Room(max(config.g, target.leaves), config.w)


PLUGIN = Plugin(
    name="lookahead", describe="lookahead alone: Jacobi window and n-gram pool",
    config=LookaheadConfig(), options=(
        Option("lookahead_w", "w", "Lookahead window: columns of Jacobi guesses (llama-lookahead: 15).",
               flag="--lookahead-w"),
        Option("lookahead_n", "n", "Lookahead n-gram size; the window has N - 1 levels (llama-lookahead: 5).",
               flag="--lookahead-n"),
        Option("lookahead_g", "g", "Most pool candidates per step (llama-lookahead: 15).", flag="--lookahead-g")),
    build=lambda setup, text: LookaheadSource(setup.config, text.references),
    priors={Pooled(length, window): _POOL.get(length, OTHER) if not window else OTHER
            for length in LENGTH_BUCKETS for window in (False, True)},
    overall=OTHER, shadowed_by="lookup", reads_references=True, flags=frozenset({"alone", "fixed"}),
    hooks=LookaheadHooks())
