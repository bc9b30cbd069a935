"""How many drafted tokens to verify: chosen from evidence, not fixed.

Model: each drafted token is accepted, given that the ones before it were, with probability
``a``. A draft of k tokens then yields on average E(k) = 1 + a + a^2 + ... + a^k tokens (the
``1`` is the token the target adds itself) for the price of one decode of k + 1 tokens. We
verify the k that maximises E(k) / cost(k + 1), where cost is the measured curve of this
machine, and no draft at all when nothing beats plain decoding (E(0) / cost(1) = 1).

``a`` is learned per match length (a match of 4 tokens is better evidence than a match of
1), from recent drafts only: counts decay, so the estimate follows the text and drifts back
to the prior (PRIORS) when nothing is drafted.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .costs import CostCurve


# Acceptance expected before any evidence, by match length: a 4-token match usually means the
# text is being copied, a 1-token match rarely does. Chosen by replaying real greedy outputs
# (a code edit and an open chat) through the drafter: these priors start copying at once
# without drafting on open text. Length 0 (n-gram cache drafts) keeps the neutral 0.5.
PRIORS = {1: 0.3, 2: 0.6, 3: 0.8, 4: 0.9}


class DraftLength:
    def __init__(self, costs: CostCurve, priors: Optional[Dict[int, float]] = None, prior_weight: float = 2.0,
                 decay: float = 0.95) -> None:
        self.costs = costs
        self.priors = PRIORS if priors is None else priors
        self.prior_weight, self.decay = prior_weight, decay
        self._counts: Dict[int, Tuple[float, float]] = {}  # match length -> (accepted, rejected)

    def reset(self) -> None:
        self._counts.clear()

    def acceptance(self, match_len: int) -> float:
        """The estimated chance that a drafted token is accepted after its predecessors were."""
        acc, rej = self._counts.get(match_len, (0.0, 0.0))
        w = self.prior_weight
        return (acc + w * self.priors.get(match_len, 0.5)) / (acc + rej + w)

    def choose(self, n_available: int, match_len: int) -> int:
        """The number of drafted tokens worth verifying, 0 for none."""
        a = self.acceptance(match_len)
        best_k, best_rate, expected, term = 0, 1.0 / self.costs.cost(1), 1.0, 1.0
        for k in range(1, n_available + 1):
            term *= a
            expected += term
            rate = expected / self.costs.cost(k + 1)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def record(self, match_len: int, n_drafted: int, n_accepted: int) -> None:
        """Learn from a verified draft: n_accepted successes, and a failure unless all passed."""
        for key, (acc, rej) in self._counts.items():
            self._counts[key] = (acc * self.decay, rej * self.decay)
        if n_drafted:
            acc, rej = self._counts.get(match_len, (0.0, 0.0))
            self._counts[match_len] = (acc + n_accepted, rej + (n_accepted < n_drafted))

    def expected_rate(self, k: int, match_len: int) -> float:
        """Tokens per unit of cost (one single-token decode) expected from a k-token draft."""
        a = self.acceptance(match_len)
        return sum(a ** j for j in range(k + 1)) / self.costs.cost(k + 1)


def curve_summary(costs: CostCurve, sizes: List[int] = (1, 2, 4, 8, 12, 16, 24, 32)) -> str:
    return " ".join(f"{n}:{costs.cost(n):.2f}" for n in sizes)
