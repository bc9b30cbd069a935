"""How likely a candidate token is to be accepted: one model for every source, learned online.

For a source and an evidence key (a match of so many tokens, a draft model's confidence, ...;
each source declares its keys and their priors, see ``sources/registry.py``), the estimate of
P(token accepted | the tokens before it were) is

    (accepted + WEIGHT * prior) / (seen + WEIGHT)

where ``accepted`` and ``seen`` count the observations of that key and decay by ``DECAY``
after every step, so recent steps weigh most and a key not seen for a while drifts back to
its prior. Every step teaches it, verified or not: a candidate token whose predecessors were
all emitted is accepted exactly when it equals the emitted token at its position (greedy: the
target's argmax; sampling: a sample of p, which equals the candidate's token with the
probability that verifying it would have accepted it).

A key without a prior is a source's bug, not a guess to make: ``prior`` raises UnknownEvidence.
"""

from __future__ import annotations

from typing import Dict, Hashable, List, Mapping, Optional, Sequence, Set, Tuple

from ..sources.base import Evidence, Outcome
from ..sources import default_registry

WEIGHT = 2.0
DECAY = 0.98
# No estimate is certain: however long a run of acceptances, a token may still be rejected.
MAX_RATE = 0.98


class UnknownEvidence(KeyError):
    """A source gave an evidence key its plugin declares no prior for."""


class AcceptanceModel:
    """Acceptance estimates per (source, evidence key), and per source overall. ``priors``:
    source -> evidence key -> prior, ``overall``: source -> its acceptance before any evidence
    (both by default the built-in sources' declarations)."""

    def __init__(self, priors: Optional[Mapping[str, Mapping[Hashable, float]]] = None,
                 overall: Optional[Mapping[str, float]] = None, weight: float = WEIGHT, decay: float = DECAY) -> None:
        if priors is None or overall is None:
            registry = default_registry()
            priors = registry.priors() if priors is None else priors
            overall = registry.overall() if overall is None else overall
        self.priors, self.initial = priors, overall
        self.weight, self.decay = weight, decay
        # (source, key) -> (accepted, seen), and source -> the same over its keys, each stored
        # divided by ``_scale``: the decay of every count, one product a step, not one per count
        self._counts: Dict[Tuple[str, Evidence], Tuple[float, float]] = {}
        self._overall: Dict[str, Tuple[float, float]] = {}
        self._scale = 1.0
        self._rates: Dict[Tuple[str, Evidence], float] = {}  # rate() until the counts change

    def prior(self, source: str, key: Evidence) -> float:
        try:
            return self.priors[source][key]
        except KeyError:
            raise UnknownEvidence(f"the {source} source gave evidence {key!r}, which it declares no prior for") from None

    def rate(self, source: str, bucket: Evidence) -> float:
        """Estimated P(accepted | predecessors accepted) of a token of ``source`` with evidence ``bucket``."""
        key = (source, bucket)
        r = self._rates.get(key)
        if r is None:
            acc, seen = self._counts.get(key, (0.0, 0.0))
            acc, seen = acc * self._scale, seen * self._scale
            r = min(MAX_RATE, (acc + self.weight * self.prior(source, bucket)) / (seen + self.weight))
            self._rates[key] = r
        return r

    def chain(self, source: str, evidence: Sequence[Evidence]) -> List[float]:
        """``rate`` of each token of a candidate of ``source`` with ``evidence`` (a step asks this
        of every candidate token: the estimates known are read without a call each)."""
        known = self._rates
        out = []
        for bucket in evidence:
            r = known.get((source, bucket))
            out.append(self.rate(source, bucket) if r is None else r)
        return out

    def rates(self, source: str) -> Dict[Evidence, float]:
        """Every evidence key of ``source`` with a prior or evidence, and its estimate."""
        keys = set(self.priors.get(source, {})) | {k for s, k in self._counts if s == source}
        return {k: self.rate(source, k) for k in keys}

    def overall(self, source: str) -> float:
        """Per-token acceptance of ``source`` over every key: what to expect of it before it
        proposes anything (to decide whether an expensive source is worth asking)."""
        acc, seen = self._overall.get(source, (0.0, 0.0))
        return (acc * self._scale + self.weight * self.initial[source]) / (seen * self._scale + self.weight)

    def evidence(self, source: str) -> float:
        """How many (decayed) observations of ``source`` the model holds."""
        return self._overall.get(source, (0.0, 0.0))[1] * self._scale

    def learn(self, outcome: Outcome) -> None:
        """Decay every count, then count each candidate token whose predecessors were emitted.
        Candidates of one source that share a prefix count once."""
        self._rates.clear()
        self._scale *= self.decay
        if self._scale < 1e-100:  # before stored counts outgrow a float: store them decayed, at scale 1
            self.forget(1.0)
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

    def _count(self, source: str, bucket: Evidence, ok: bool) -> None:
        one = 1.0 / self._scale
        acc, n = self._counts.get((source, bucket), (0.0, 0.0))
        self._counts[(source, bucket)] = (acc + ok * one, n + one)
        acc, n = self._overall.get(source, (0.0, 0.0))
        self._overall[source] = (acc + ok * one, n + one)

    def forget(self, factor: float = 0.5) -> None:
        """Weaken the evidence (a new, unrelated text): estimates move toward their priors."""
        factor *= self._scale
        self._rates.clear()
        self._counts = {k: (a * factor, n * factor) for k, (a, n) in self._counts.items()}
        self._overall = {k: (a * factor, n * factor) for k, (a, n) in self._overall.items()}
        self._scale = 1.0
