"""How likely a candidate token is to be accepted: one model for every source, learned online.

For a source and an evidence bucket (a match length, a draft model's confidence, ...; each
source defines its buckets), the estimate of P(token accepted | the tokens before it were) is

    (accepted + WEIGHT * prior) / (seen + WEIGHT)

where ``accepted`` and ``seen`` count the observations of that bucket and decay by ``DECAY``
after every step, so recent steps weigh most and a bucket not seen for a while drifts back to
its prior. Every step teaches it, verified or not: a candidate token whose predecessors were
all emitted is accepted exactly when it equals the emitted token at its position (greedy: the
target's argmax; sampling: a sample of p, which equals the candidate's token with the
probability that verifying it would have accepted it).

The priors were chosen by replaying the target's real greedy answers to the bench suite
through the sources (``python scripts/fit_priors.py``): each bucket's acceptance over those
answers, rounded down. The anchor's in-step buckets of tokens the text has not copied yet (120,
121) come from the suite's and eight more answers pooled (0.88 and 0.93 there, 0.98 and 0.96 on
the suite alone): a text's first departure from a copy (a value copied into a CSV line or a
YAML key, then the line's own punctuation) is where a long draft fails, and at 0.95 the planner
bet 15 rows on it. Tokens the text departed from twice and never kept (160, 161) are accepted
17% and 13% over the suite's and fourteen more answers. The end of a sentence a copy has not
met yet (170, 171) is rare in the recorded answers (in every replay of them all: 0 of 15 near
the copy's start, 8 of 16 after 16 copied tokens); its priors were chosen by replaying them
(a quote's first period, where a summary ends its line, cost a 16-row bet). The n-gram
matches' buckets by support (how the other occurrences went on) come from the suite's and
fourteen more answers pooled (``tests/data/more_answers.json``) and were checked on sixteen
answers used in no fit (``tests/data/held_out_answers.json``).
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Set, Tuple

from ..sources.base import Outcome
from ..sources.lookup import MATCH, OWN_MATCH, OWN_TEXT, SUPPORT

WEIGHT = 2.0
DECAY = 0.98
# No estimate is certain: however long a run of acceptances, a token may still be rejected.
MAX_RATE = 0.98


def _table(base: int, rates: Mapping[int, float]) -> Dict[int, float]:
    """``rates`` (per length bucket) as buckets from ``base`` on."""
    return {base + k: v for k, v in rates.items()}


# lookup's anchor: in step by the token's edit class and depth (120 + 10 * class + depth), fresh
# (80 ..), out of step (90 ..), resumed (100 ..)
_ANCHOR = {120: 0.85, 121: 0.9, 130: 0.97, 131: 0.97, 140: 0.85, 141: 0.9, 150: 0.4, 151: 0.3,
           160: 0.15, 161: 0.1, 170: 0.05, 171: 0.3,
           80: 0.4, 81: 0.58, 82: 0.65, 83: 0.75, 84: 0.85, 85: 0.9,
           90: 0.02, 91: 0.5, 92: 0.7, 93: 0.8, 94: 0.85,
           100: 0.8, 101: 0.85, 102: 0.9, 103: 0.9, 104: 0.9, 105: 0.95}
# lookup's n-gram matches: MATCH + SUPPORT * support + the length bucket of the agreement, support
# contested (0, buckets 200 ..), alone (1, 240 ..), two alike (2, 280 ..), three or more (3, 320 ..)
_MATCH = {**_table(MATCH, {1: 0.1, 2: 0.1, 3: 0.07, 4: 0.2, 5: 0.15, 8: 0.1, 12: 0.5, 16: 0.4, 24: 0.5, 32: 0.5}),
          **_table(MATCH + SUPPORT, {1: 0.28, 2: 0.38, 3: 0.6, 4: 0.6, 5: 0.6, 8: 0.65, 12: 0.75, 16: 0.8,
                                     24: 0.85, 32: 0.85}),
          **_table(MATCH + 2 * SUPPORT, {1: 0.45, 2: 0.65, 3: 0.7, 4: 0.75, 5: 0.75, 8: 0.8, 12: 0.85, 16: 0.85,
                                         24: 0.9, 32: 0.9}),
          **_table(MATCH + 3 * SUPPORT, {1: 0.7, 2: 0.7, 3: 0.85, 4: 0.85, 5: 0.85, 8: 0.9, 12: 0.9, 16: 0.9,
                                         24: 0.9, 32: 0.9})}
# Copies of the text being written (lookup.OWN_TEXT + the anchor's buckets, and + an alone
# match's of at least lookup.OWN_MATCH tokens): OWN_FACTOR of the prior (the ratio of their
# acceptance to the prompt's over the recorded answers: 0.64 to 0.86 by kind for the anchor,
# 0.66 for the matches)
OWN_FACTOR = 0.75
_OWN = {**{OWN_TEXT + b: OWN_FACTOR * p for b, p in _ANCHOR.items()},
        **{OWN_TEXT + b: OWN_FACTOR * p for b, p in _MATCH.items()
           if MATCH + SUPPORT + OWN_MATCH <= b < MATCH + 2 * SUPPORT}}

# source -> evidence bucket -> prior acceptance. Buckets not listed take DEFAULT[source].
PRIORS: Dict[str, Dict[int, float]] = {
    # lookup (see lookup.py and above)
    "lookup": {**_MATCH, **_ANCHOR, **_OWN},
    # lookahead: bucket = length_bucket(agreement) for n-grams of the text, 64 + that for the window's
    "lookahead": {1: 0.15, 2: 0.22, 3: 0.43, 4: 0.75, 5: 0.8, 8: 0.85},
    # n-gram caches: bucket = position in the draft (0 first)
    "cache": {0: 0.25, 1: 0.3, 2: 0.35},
    # consensus (see consensus.py): 10 * agreeing siblings (1 .. 3) + the match's length bucket (0 .. 8),
    # a match's length as for lookup, raised by each further agreeing sibling
    "consensus": {10 * a + m: min(0.9, p + 0.1 * (a - 1)) for a in (1, 2, 3)
                  for m, p in {0: 0.1, 1: 0.15, 2: 0.25, 3: 0.35, 4: 0.45, 5: 0.55, 8: 0.65}.items()},
    # draft model: bucket = round(10 * the draft's top probability)
    "draft": {b: min(0.95, 0.05 + 0.09 * b) for b in range(11)},
}
DEFAULT: Dict[str, float] = {"lookup": 0.2, "consensus": 0.3, "lookahead": 0.1, "cache": 0.3, "draft": 0.6}


class AcceptanceModel:
    """Acceptance estimates per (source, evidence bucket), and per source overall."""

    def __init__(self, priors: Optional[Mapping[str, Mapping[int, float]]] = None,
                 default: Optional[Mapping[str, float]] = None, weight: float = WEIGHT, decay: float = DECAY) -> None:
        self.priors = PRIORS if priors is None else priors
        self.default = DEFAULT if default is None else default
        self.weight, self.decay = weight, decay
        self._counts: Dict[Tuple[str, int], Tuple[float, float]] = {}  # (source, bucket) -> (accepted, seen)
        self._overall: Dict[str, Tuple[float, float]] = {}
        self._rates: Dict[Tuple[str, int], float] = {}  # rate() until the counts change

    def prior(self, source: str, bucket: int) -> float:
        return self.priors.get(source, {}).get(bucket, self.default.get(source, 0.1))

    def rate(self, source: str, bucket: int) -> float:
        """Estimated P(accepted | predecessors accepted) of a token of ``source`` in ``bucket``."""
        key = (source, bucket)
        r = self._rates.get(key)
        if r is None:
            acc, seen = self._counts.get(key, (0.0, 0.0))
            r = min(MAX_RATE, (acc + self.weight * self.prior(source, bucket)) / (seen + self.weight))
            self._rates[key] = r
        return r

    def rates(self, source: str) -> Dict[int, float]:
        """Every bucket of ``source`` with a prior or evidence, and its estimate."""
        buckets = set(self.priors.get(source, {})) | {b for s, b in self._counts if s == source}
        return {b: self.rate(source, b) for b in sorted(buckets)}

    def overall(self, source: str) -> float:
        """Per-token acceptance of ``source`` over every bucket: what to expect of it before it
        proposes anything (to decide whether an expensive source is worth asking)."""
        acc, seen = self._overall.get(source, (0.0, 0.0))
        return (acc + self.weight * self.default.get(source, 0.1)) / (seen + self.weight)

    def evidence(self, source: str) -> float:
        """How many (decayed) observations of ``source`` the model holds."""
        return self._overall.get(source, (0.0, 0.0))[1]

    def learn(self, outcome: Outcome) -> None:
        """Decay every count, then count each candidate token whose predecessors were emitted.
        Candidates of one source that share a prefix count once."""
        d = self.decay
        self._rates.clear()
        self._counts = {k: (a * d, n * d) for k, (a, n) in self._counts.items()}
        self._overall = {k: (a * d, n * d) for k, (a, n) in self._overall.items()}
        emitted = outcome.emitted
        seen: Set[Tuple[str, Tuple[int, ...]]] = set()
        for cand in outcome.candidates:
            for i, token in enumerate(cand.tokens[:len(emitted)]):
                key = (cand.source, cand.tokens[:i + 1])
                ok = token == emitted[i]
                if key not in seen:
                    seen.add(key)
                    self._count(cand.source, cand.evidence[i], ok)
                if not ok:
                    break

    def _count(self, source: str, bucket: int, ok: bool) -> None:
        acc, n = self._counts.get((source, bucket), (0.0, 0.0))
        self._counts[(source, bucket)] = (acc + ok, n + 1)
        acc, n = self._overall.get(source, (0.0, 0.0))
        self._overall[source] = (acc + ok, n + 1)

    def forget(self, factor: float = 0.5) -> None:
        """Weaken the evidence (a new, unrelated text): estimates move toward their priors."""
        self._rates.clear()
        self._counts = {k: (a * factor, n * factor) for k, (a, n) in self._counts.items()}
        self._overall = {k: (a * factor, n * factor) for k, (a, n) in self._overall.items()}
