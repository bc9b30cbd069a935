"""Prompt lookup: candidates copied from text the model has already seen.

The last n tokens (n from ``ngram_max`` down to ``ngram_min``) are looked up in the prompt, in
everything generated so far and in reference documents; the tokens that followed an occurrence
are a candidate. When occurrences disagree on what follows, each distinct continuation is a
candidate (the planner merges them into a trie and verifies what pays). Candidates are ranked
by how many tokens before the occurrence agree with the text (the most specific context
first), then by recency. Nothing here touches a model.

Evidence: token i of a candidate whose occurrence agrees with the text on L tokens is
``Matched(support, length_bucket(L + i))``: once its first i tokens are accepted, the copy
agrees on L + i; the support says how the other occurrences that agree at least as well went on
after those i tokens: CONTESTED when one of them went on differently, else how many went on
alike (1: this one alone, 2, 3 or more). A continuation every occurrence agrees on is far
likelier (a JSON record's ``",\n  "`` after each value, a name repeated in a story): over the recorded
answers a match is accepted far more often the more occurrences go on alike (docs/results.md,
"Lookup's priors").

Besides n-gram matches, lookup follows one anchor, the place the text is copying from (see
PromptLookup); its tokens are ``Anchored`` (fresh, in step, out of step, resumed).

A tool call copies a file the prompt holds into a JSON string: its line breaks written ``\n``,
its quotes ``\"``, so that the file's own tokens match only between them. Given the vocabulary's
tokenizer, lookup also reads each prompt's text as a JSON string's contents (the escaped view),
so that such a copy is found and followed like any other.

A text copies itself (a phrase said again, a list's next item) less surely than it copies the
prompt or a reference: where the anchor is in the text being written, and where an n-gram match
of at least OWN_MATCH tokens goes on as only the text being written did (support 1), the
tokens' evidence says so (``own``), with priors of their own.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from itertools import islice
from typing import Callable, DefaultDict, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .base import FORCED, FORCED_PRIOR, LENGTH_BUCKETS, Budget, Candidate, Proposal, Source, length_bucket
from .registry import Option, Plugin
from ..config import SamplingConfig, check
from ..sequences import appended, common_prefix


@dataclass(frozen=True)
class LookupConfig:
    """Drafts copied from text already seen: the prompt and output (prompt lookup) and reference
    documents. Matches are n-grams of ``ngram_min`` .. ``ngram_max`` tokens, longest first;
    occurrences whose preceding tokens agree longest with the text come first (see
    ``PromptLookup``). Candidates are at most ``draft_max`` tokens; the planner verifies what pays."""

    ngram_min: int = 1
    ngram_max: int = 4
    draft_max: int = 31

    def __post_init__(self) -> None:
        check(1 <= self.ngram_min <= self.ngram_max <= 4,
              f"lookup n-gram sizes must satisfy 1 <= min <= max <= 4, got {self.ngram_min}..{self.ngram_max}")
        check(self.draft_max >= 1, f"lookup draft-max must be >= 1, got {self.draft_max}")


# lookup's settings (the n-gram caches' source shares them)
OPTIONS = (
    Option("lookup_ngram_min", "ngram_min", "Shortest n-gram lookup matches.", flag="--lookup-ngram-min"),
    Option("lookup_ngram_max", "ngram_max", "Longest n-gram lookup matches (at most 4).", flag="--lookup-ngram-max"),
    Option("lookup_draft_max", "draft_max", "Most tokens a lookup candidate has."),
)

# Occurrences of one n-gram looked at per step (the most recent), and how far back agreement is counted.
SCAN = 32
AGREEMENT = 32


class TokenIndex:
    """Every n-gram (n in [ngram_min, ngram_max]) of a token list, mapped to the positions right
    after its occurrences, oldest first. Follows appends and cuts."""

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.tokens: List[int] = []
        self._ends: DefaultDict[Tuple[int, ...], List[int]] = defaultdict(list)

    def extend(self, new: Sequence[int]) -> None:
        t = self.tokens
        for token in new:
            t.append(int(token))
            end = len(t)
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                self._ends[tuple(t[end - n:end])].append(end)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens."""
        t = self.tokens
        while len(t) > n:
            end = len(t)
            for size in range(self.ngram_min, min(self.ngram_max, end) + 1):
                ends = self._ends[tuple(t[end - size:end])]
                ends.pop()
                if not ends:
                    del self._ends[tuple(t[end - size:end])]
            t.pop()

    def follow(self, tokens: Sequence[int]) -> int:
        """Index exactly ``tokens``: cut back to the common prefix, then append the rest. Returns
        how many of the tokens indexed before were kept (all of them: ``tokens`` went on from them)."""
        t = self.tokens
        n = len(t)
        if len(tokens) < n or (n and (tokens[n - 1] != t[-1] or appended(t, tokens) is None)):
            keep = common_prefix(t, tokens)
            self.truncate(keep)
            n = keep
        self.extend(tokens[n:])
        return n

    def ends(self, ngram: Tuple[int, ...]) -> List[int]:
        return self._ends.get(ngram, [])


def escaped_view(tokens: Sequence[int], piece: Callable[[int], bytes], tokenize: Callable[[str], List[int]]) -> List[int]:
    """The tokens of ``tokens``' text escaped as a JSON string's contents (``\\n``, ``\\"``), as a
    tool call's arguments copy it; none where escaping changes nothing."""
    text = b"".join(piece(t) for t in tokens).decode("utf-8", errors="replace")
    escaped = json.dumps(text, ensure_ascii=False)[1:-1]
    return tokenize(escaped) if escaped != text else []


def _symbol(token: int) -> bytes:
    """A token as bytes of its own, for comparing token lists as text."""
    return int(token).to_bytes(4, "big")


def agreement(a: Sequence[int], a_end: int, b: Sequence[int], b_end: int, limit: int = AGREEMENT) -> int:
    """How many tokens before a_end in ``a`` equal those before b_end in ``b``."""
    n = 0
    while n < limit and n < a_end and n < b_end and a[a_end - 1 - n] == b[b_end - 1 - n]:
        n += 1
    return n


@dataclass
class Anchor:
    """Where in a source text (0: the history, 1..: the references) the text is copying from:
    ``pos`` is where the next token is expected. ``gap``: tokens since the text last agreed with
    the source there (an insertion or a replacement in progress); ``copied``: tokens the text
    copied from it since it was set or last realigned (set where everything written since the
    prompt agrees, all of those); ``trusted``: the text has copied at least
    FRESH_UNTIL tokens in a row from it since it was set. ``home`` and ``edit``: where it was
    before its last realignment and the gap then, restored when the realignment's first token is
    not copied (a short match inside the insertion, not the copy resuming); ``resumed``: that
    realignment took a trusted copy up again after a short edit, close to where it left off."""

    index: int
    pos: int
    gap: int = 0
    copied: int = 0
    home: Optional[int] = None
    trusted: bool = False
    resumed: bool = False
    edit: int = 0


# Evidence of lookup. The anchor's continuation (``Anchored``): once the text has copied at
# least FRESH_UNTIL tokens from it, IN_STEP with the token's edit class, ``at`` 1 once
# copied + i >= 16; before that (it was just set, moved or realigned after an edit; unless the
# token was never kept, see PromptLookup._in_step) FRESH with ``at`` min(copied + i, 5), or
# RESUMED when the realignment resumed a trusted copy after an edit of at most SHORT_EDIT
# tokens and at most SHORT_EDIT tokens on (a type hint inserted, a word replaced: such copies
# go on); while the text is still being edited, OUT_OF_STEP with ``at`` min(i, 4). Edit classes
# of a source token, from how the text treated that token id when copying it so far: 0 never
# copied yet, 1 always kept, 2 edited less than half the time, 3 more often, 4 never kept and
# edited at least twice (edits repeat: a file gets the same change on every line, a summary
# ends its line at every quoted sentence's end), 5 never copied yet and the end of a sentence in
# the source (a quote often stops there).
IN_STEP, FRESH, OUT_OF_STEP, RESUMED = "in step", "fresh", "out of step", "resumed"
STATES = {FRESH: range(6), OUT_OF_STEP: range(5), RESUMED: range(6), IN_STEP: range(2)}
EDIT_CLASSES = range(6)
FRESH_UNTIL = 4
SHORT_EDIT = 4
# A source token the text departed from this many times and never copied ends a fresh copy too
# (once is enough: a JSON record written from "key: value" lines departs at every ':').
NEVER_KEPT = 1
# How far before and after the anchor a realignment looks, and how many bytes of text it compares.
BEHIND, AHEAD = 4, 64
REALIGN_BYTES = 32
DISTANCE = 0.25
# Agreement that moves the anchor to another occurrence; or, at the start of a text, agreement on
# everything it wrote, if that is at least COPIES_ALL tokens (an answer opening with ```python
# where the prompt's code block does: of the forty recorded answers, the ten that did went on
# copying, 10 tokens on average, while a single token at the start was a copy none of the time).
MOVE = 4
COPIES_ALL = 2
# n-gram matches: the support is CONTESTED or how many occurrences went on alike, up to MAX_SUPPORT.
CONTESTED = 0
MAX_SUPPORT = 3
# Candidates copied from the text being written (the text copying itself): the anchor's tokens
# where the anchor is there, and an n-gram match's agreeing on at least OWN_MATCH tokens where
# that occurrence alone goes on so (support 1) are ``own``. Such copies go on less often than
# those of the prompt or a reference, over the recorded answers of tests/data, for the anchor
# and for an alone match alike (docs/results.md, "Lookup's priors").
OWN_MATCH = 2


@dataclass(frozen=True)
class Anchored:
    """A token of the anchor's continuation: its copy's ``state`` (FRESH, IN_STEP, OUT_OF_STEP,
    RESUMED), ``at`` (see STATES), in step the token's ``edit`` class; ``own``: the anchor is in
    the text being written."""

    state: str
    at: int
    edit: int = 0
    own: bool = False


@dataclass(frozen=True)
class Matched:
    """A token of an n-gram match's continuation: how the other occurrences went on there
    (``support``), the length bucket of the match's agreement with the text at that token
    (``length``); ``own``: the occurrence is in the text being written."""

    support: int
    length: int
    own: bool = False


Evidence = Union[Anchored, Matched]


class PromptLookup:
    """Finds continuations of the text in the text itself and in reference documents.

    Besides n-gram matches anywhere, it follows one anchor: the place the text is copying from.
    Editing a file (adding type hints, renaming) copies it with insertions and replacements;
    after each edit the copy resumes right after where it left off, which an n-gram match of
    the last tokens alone often misses (``:\n`` occurs everywhere, an inserted ``float`` nowhere).
    The copy is found again by comparing text, not tokens: an edit often splits a token of the
    source (``):\n`` becomes ``) -> float:\n``, whose last token ``:\n`` ends the source's
    ``):\n``). ``piece`` gives a token's bytes; without it each token is a symbol of its own.
    """

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4, references: Sequence[Sequence[int]] = (),
                 piece: Optional[Callable[[int], bytes]] = None,
                 tokenize: Optional[Callable[[str], List[int]]] = None) -> None:
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.piece = piece or _symbol
        self.tokenize = tokenize if piece is not None else None
        self.history = TokenIndex(ngram_min, ngram_max)
        self.references: List[TokenIndex] = []
        for ref in references:
            index = TokenIndex(ngram_min, ngram_max)
            index.extend(ref)
            self.references.append(index)
        self.escaped = TokenIndex(ngram_min, ngram_max)  # the prompt's text as a JSON string's contents
        self.anchor: Optional[Anchor] = None
        self.start: Optional[int] = None  # where the text being written starts (its first token)
        self.edits: Dict[int, Tuple[int, int]] = {}  # source token id -> (times copied, times edited there)

    def _indexes(self) -> List[TokenIndex]:
        """The sources: the history (0), the references, the prompt's escaped view (last)."""
        return [self.history, *self.references, self.escaped]

    def follow(self, tokens: Sequence[int]) -> None:
        """Index ``tokens`` as the history and move the anchor along what was appended."""
        n = len(self.history.tokens)
        if self.start is None or len(tokens) <= self.start:
            self.start = len(tokens) - 1  # a new text: the prompt, and its first token pending
            self._escape(tokens)
        if self.history.follow(tokens) < n:
            self.anchor = None  # the text was cut: start over
            return
        a = self.anchor
        if a is None:
            return
        src = self._indexes()[a.index].tokens
        for t in tokens[n:]:
            expected = src[a.pos] if a.pos < len(src) else None
            if expected is not None and not a.gap:
                kept, edited = self.edits.get(expected, (0, 0))
                self.edits[expected] = (kept + (expected == t), edited + (expected != t))
            if expected == t:
                a.pos, a.gap, a.copied = a.pos + 1, 0, a.copied + 1
                a.trusted = a.trusted or a.copied >= FRESH_UNTIL
            elif not a.gap and not a.copied and a.home is not None:
                a.pos, a.gap, a.home, a.resumed = a.home, a.edit + 1, None, False
            else:
                a.gap += 1
        if a.gap:
            self._realign(a)

    def end_text(self) -> None:
        """The text being written is complete: the next one starts after the next prompt."""
        self.start = None

    def _escape(self, prompt: Sequence[int]) -> None:
        """Index the escaped view of a new text's ``prompt``: its text as the contents of a JSON
        string (what a tool call's arguments copy it as), where escaping changes it."""
        if self.anchor is not None and self.anchor.index == len(self._indexes()) - 1:
            self.anchor = None
        self.escaped = TokenIndex(self.ngram_min, self.ngram_max)
        if self.tokenize is not None:
            self.escaped.extend(escaped_view(prompt, self.piece, self.tokenize))

    def _realign(self, a: Anchor) -> None:
        """Move the anchor to the token boundary around it where the source's text ends with as
        much of the text's as possible (at least its whole last token), less DISTANCE bytes per
        token away from the anchor: an edit is short and the copy resumes near where it left off,
        while a spurious match (``] =`` of another line) is rarely much longer than the true one."""
        hist = self.history.tokens
        src = self._indexes()[a.index].tokens
        text = self._tail(hist, len(hist))
        need = len(self.piece(hist[-1]))
        best, best_pos = 0.0, -1
        for p in range(max(a.pos - BEHIND, 1), min(a.pos + AHEAD, len(src) - 1) + 1):
            end = self.piece(src[p - 1])
            if end and end[-1:] != text[-1:]:  # not even the last byte agrees
                continue
            n = common_prefix(text[::-1], self._tail(src, p)[::-1])
            score = n - DISTANCE * (p - a.pos if p >= a.pos else 2 * (a.pos - p))
            if n >= need and score > best:
                best, best_pos = score, p
        if best_pos >= 0:
            a.resumed = a.trusted and a.gap <= SHORT_EDIT and 0 <= best_pos - a.pos <= SHORT_EDIT
            a.home, a.pos, a.edit, a.gap, a.copied = a.pos, best_pos, a.gap, 0, 0  # trust is earned again

    def _tail(self, tokens: Sequence[int], end: int) -> bytes:
        """The last REALIGN_BYTES bytes of the text of ``tokens[:end]``."""
        out, i = b"", end
        while len(out) < REALIGN_BYTES and i > 0:
            i -= 1
            out = self.piece(tokens[i]) + out
        return out[-REALIGN_BYTES:]

    def find(self, max_len: int, max_candidates: int) -> List[Tuple[List[int], Tuple[Evidence, ...]]]:
        """Up to ``max_candidates`` distinct continuations of the history (each up to
        ``max_len`` tokens), best first, each with the evidence of every token."""
        hist = self.history.tokens
        end = len(hist)
        indexes = self._indexes()
        view = len(indexes) - 1
        scored = self._occurrences(range(view), max_candidates)
        # The escaped view only where it agrees longer than the text itself and the references:
        # elsewhere its occurrences are twins of theirs (the same text up to a line break).
        best = max((s[0] for s in scored), default=0)
        scored += [s for s in self._occurrences([view], max_candidates) if s[0] > best]
        scored.sort(key=lambda s: (-s[0], -s[1]))
        a = self.anchor
        written = end - self.start if self.start is not None else 0
        if scored and (scored[0][0] >= MOVE or self._copies_all(scored, written)) \
                and (a is None or a.gap or scored[0][0] > self._agreement_at(a)):
            a = self.anchor = Anchor(scored[0][2], scored[0][3])
            if scored[0][0] >= written:
                a.copied = written  # everything written so far is a copy of it
        found: List[Tuple[List[int], Tuple[Evidence, ...]]] = []
        if a is not None and a.pos < len(indexes[a.index].tokens):
            src = indexes[a.index].tokens
            cont = src[a.pos:a.pos + max_len]
            own = self._written(a.index, a.pos)
            if a.gap:
                evidence = tuple(Anchored(OUT_OF_STEP, min(i, 4), own=own) for i in range(len(cont)))
            else:
                evidence = tuple(self._in_step(a, i, src, own) for i in range(len(cont)))
            found.append((cont, evidence))
        for agree, _, i, e in scored:
            if len(found) == max_candidates:
                break
            cont = indexes[i].tokens[e:e + max_len]
            if cont and not any(k[:len(cont)] == cont for k, _ in found):  # nothing new: a prefix of one kept
                support = self._support(cont, agree, scored)
                own = self._written(i, e) and agree >= OWN_MATCH and support[0] == 1
                found.append((cont, tuple(Matched(s, length_bucket(agree + j), own) for j, s in enumerate(support))))
        return found

    def _occurrences(self, sources: Sequence[int], max_candidates: int) -> List[Tuple[int, int, int, int]]:
        """The occurrences in ``sources`` (indexes of ``_indexes()``) of the history's last
        n-grams, longest first, until ``max_candidates`` distinct tokens follow them: (agreement,
        recency, index, end)."""
        hist = self.history.tokens
        end = len(hist)
        indexes = self._indexes()
        seen: Dict[Tuple[int, int], None] = {}  # (index, end) of occurrences already scored
        scored: List[Tuple[int, int, int, int]] = []
        for n in range(min(self.ngram_max, end), self.ngram_min - 1, -1):
            key = tuple(hist[end - n:])
            for i in sources:
                index = indexes[i]
                for e in islice(reversed(index.ends(key)), SCAN):
                    if e >= len(index.tokens) or (i, e) in seen:
                        continue
                    seen[(i, e)] = None
                    scored.append((agreement(index.tokens, e, hist, end), e if i == 0 else -1, i, e))
            if len({indexes[i].tokens[e] for _, _, i, e in scored}) >= max_candidates:
                break
        return scored

    def _written(self, index: int, pos: int) -> bool:
        """Whether ``pos`` of source ``index`` is in the text being written."""
        return index == 0 and self.start is not None and pos >= self.start

    def _copies_all(self, scored: Sequence[Tuple[int, int, int, int]], written: int) -> bool:
        """Whether the ``written`` tokens of the text being written (at least COPIES_ALL) all
        agree with the best of the ``scored`` occurrences, and every occurrence that agrees as
        well goes on alike."""
        if written < COPIES_ALL or scored[0][0] < written:
            return False
        _, _, i, e = scored[0]
        return self._support(self._indexes()[i].tokens[e:e + 1], written, scored)[0] != CONTESTED

    def _support(self, cont: Sequence[int], agree: int, scored: Sequence[Tuple[int, int, int, int]]) -> List[int]:
        """Per token of ``cont`` (the continuation of one of the ``scored`` occurrences, which
        agrees with the text on ``agree`` tokens): how the occurrences agreeing at least as well
        that went on like ``cont`` up to that token go on there. CONTESTED when one goes on
        differently (and every later token), else how many go on alike, at most MAX_SUPPORT."""
        indexes = self._indexes()
        peers = [(indexes[i].tokens, e, len(indexes[i].tokens)) for a, _, i, e in scored if a >= agree]
        out: List[int] = []
        for j, token in enumerate(cont):
            going = [(t, e, limit) for t, e, limit in peers if e + j < limit]  # a source may end first
            alike = [(t, e, limit) for t, e, limit in going if t[e + j] == token]
            if len(alike) < len(going):
                return out + [CONTESTED] * (len(cont) - j)
            out.append(min(len(alike), MAX_SUPPORT))
            peers = alike
        return out

    def _in_step(self, a: Anchor, i: int, src: Sequence[int], own: bool) -> Anchored:
        """The evidence of the anchor's i-th next token in its source ``src`` while the text is in
        step with it. A token the text never copied but departed from (NEVER_KEPT times) takes
        its edit class's bucket even in a fresh or resumed copy: a summary quotes a sentence,
        then ends its line where the source goes on, every time."""
        token = src[a.pos + i]
        kept, edited = self.edits.get(token, (0, 0))
        if a.copied >= FRESH_UNTIL or (edited >= NEVER_KEPT and not kept):
            return Anchored(IN_STEP, int(a.copied + i >= 16), self._edit_class(token, src, a.pos + i), own)
        return Anchored(RESUMED if a.resumed else FRESH, min(a.copied + i, 5), own=own)

    def _edit_class(self, token: int, src: Sequence[int] = (), pos: int = -1) -> int:
        """The edit class of ``token``, at ``src[pos]`` when given (see EDIT_CLASSES)."""
        kept, edited = self.edits.get(token, (0, 0))
        if kept + edited == 0:
            return 5 if 0 <= pos < len(src) - 1 and self._ends_sentence(src[pos], src[pos + 1]) else 0
        if not kept and edited >= 2:
            return 4
        return 1 if edited == 0 else 2 if 2 * edited < kept + edited else 3

    def _ends_sentence(self, token: int, following: int) -> bool:
        """Whether ``token`` ends a sentence: ``.``, ``!`` or ``?`` (a quote or a bracket may
        close after it), and the next token starts with a space or a line break (not ``self.x``)."""
        text, after = self.piece(token), self.piece(following)
        return text.rstrip(b"\"')")[-1:] in (b".", b"!", b"?") and after[:1] in (b" ", b"\n")

    def _agreement_at(self, a: Anchor) -> int:
        hist = self.history.tokens
        return agreement(self._indexes()[a.index].tokens, a.pos, hist, len(hist))


class LookupSource(Source):
    """Prompt lookup as a draft source: the prompt, the output so far and references."""

    name = "lookup"
    past_forced = True

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4, references: Sequence[Sequence[int]] = (),
                 max_len: int = 31, piece: Optional[Callable[[int], bytes]] = None,
                 tokenize: Optional[Callable[[str], List[int]]] = None) -> None:
        self.lookup = PromptLookup(ngram_min, ngram_max, references, piece, tokenize)
        self.max_len = max_len

    def propose(self, tokens: Sequence[int], budget: Budget, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        self.lookup.follow(tokens)
        found = self.lookup.find(min(budget.max_len, self.max_len), budget.max_candidates)
        return Proposal(tuple(Candidate(tuple(cont), self.name, evidence) for cont, evidence in found if cont))

    def finish(self, tokens: Sequence[int]) -> None:
        self.lookup.end_text()


# Priors. They were chosen by replaying the target's real greedy answers to the bench suite
# through the sources (``python benchmarks/fit_priors.py``): each key's acceptance over those
# answers, rounded down. The anchor's in-step keys of tokens the text has not copied yet (edit
# class 0) come from the suite's and eight more answers pooled: a text's first departure from a
# copy (a value copied into a CSV line or a YAML key, then the line's own punctuation) is where
# a long draft fails, and a prior near 1 made the planner bet many rows on it. Tokens the text
# departed from twice and never kept (edit class 4) come from the suite's and fourteen more
# answers. The end of a sentence a copy has not met yet (edit class 5) is rare in the recorded
# answers; its priors were chosen by replaying them (a quote's first period, where a summary
# ends its line, cost a long bet). The numbers: docs/results.md, "Lookup's priors".
# The n-gram matches' priors by support come from the suite's and fourteen more answers pooled
# (``tests/data/more_answers.json``) and were checked on sixteen answers used in no fit
# (``tests/data/held_out_answers.json``).
_IN_STEP = {  # edit class -> (at 0, at 1)
    0: (0.85, 0.9), 1: (0.97, 0.97), 2: (0.85, 0.9), 3: (0.4, 0.3), 4: (0.15, 0.1), 5: (0.05, 0.3)}
_ANCHOR = {**{Anchored(IN_STEP, at, edit): p for edit, ps in _IN_STEP.items() for at, p in enumerate(ps)},
           **{Anchored(FRESH, at): p for at, p in enumerate((0.4, 0.58, 0.65, 0.75, 0.85, 0.9))},
           **{Anchored(OUT_OF_STEP, at): p for at, p in enumerate((0.02, 0.5, 0.7, 0.8, 0.85))},
           **{Anchored(RESUMED, at): p for at, p in enumerate((0.8, 0.85, 0.9, 0.9, 0.9, 0.95))}}
_MATCH_LENGTHS = (1, 2, 3, 4, 5, 8, 12, 16, 24, 32)  # the length buckets with a prior of their own
_MATCH = {support: dict(zip(_MATCH_LENGTHS, ps)) for support, ps in {
    CONTESTED: (0.1, 0.1, 0.07, 0.2, 0.15, 0.1, 0.5, 0.4, 0.5, 0.5),
    1: (0.28, 0.38, 0.6, 0.6, 0.6, 0.65, 0.75, 0.8, 0.85, 0.85),
    2: (0.45, 0.65, 0.7, 0.75, 0.75, 0.8, 0.85, 0.85, 0.9, 0.9),
    3: (0.7, 0.7, 0.85, 0.85, 0.85, 0.9, 0.9, 0.9, 0.9, 0.9)}.items()}
# Copies of the text being written: OWN_FACTOR of the prior (the ratio of their acceptance to
# the prompt's over the recorded answers), for the anchor's keys and an alone match's of at least OWN_MATCH tokens.
OWN_FACTOR = 0.75
# Any other key: a match of a length bucket without a prior of its own, or an own match whose
# support changed after its first token.
OTHER = 0.2


def _priors() -> Dict[Evidence, float]:
    priors: Dict[Evidence, float] = {}
    for state, ats in STATES.items():
        for at in ats:
            for edit in (EDIT_CLASSES if state == IN_STEP else (0,)):
                p = _ANCHOR[Anchored(state, at, edit)]
                priors[Anchored(state, at, edit)] = p
                priors[Anchored(state, at, edit, own=True)] = OWN_FACTOR * p
    for support in range(MAX_SUPPORT + 1):
        for length in LENGTH_BUCKETS:
            p = _MATCH[support].get(length, OTHER)
            priors[Matched(support, length)] = p
            alone = support == 1 and length >= OWN_MATCH and length in _MATCH[support]
            priors[Matched(support, length, own=True)] = OWN_FACTOR * p if alone else OTHER
    priors[FORCED] = FORCED_PRIOR
    return priors


PLUGIN = Plugin(
    name="lookup", describe="lookup alone: copies of the prompt and the output",
    config=LookupConfig(), options=OPTIONS,
    build=lambda setup, text: LookupSource(setup.config.ngram_min, setup.config.ngram_max, text.references,
                                           setup.config.draft_max, setup.piece, setup.tokenize),
    priors=_priors(), overall=OTHER, reads_references=True, flags=frozenset({"alone"}))
