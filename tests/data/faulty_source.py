"""A draft source that goes wrong on purpose, for tests: it proposes the text's last two tokens
again (a copy the target sometimes takes), then, from its ``--faulty-after``-th ask on, does what
``--faulty-mode`` says: raise, return a list or a candidate of no token id (negative, or past
the vocabulary), give evidence it
declares no prior for, raise in learn, or take seconds to answer."""

from __future__ import annotations

import time
from dataclasses import dataclass

from llamaspec import Candidate, Option, Plugin, Proposal, Source

MODES = ("raise", "list", "token", "vocab", "evidence", "learn", "slow")


@dataclass(frozen=True)
class FaultyConfig:
    mode: str = "raise"
    after: int = 2
    seconds: float = 3.0


class Faulty(Source):
    name = "faulty"

    def __init__(self, config: FaultyConfig) -> None:
        self.config, self.asks = config, 0

    def propose(self, tokens, budget, sampling, rng):
        self.asks += 1
        mode = self.config.mode if self.asks > self.config.after else ""
        again = tuple(tokens[-2:])[:budget.max_len]
        if mode == "raise":
            raise RuntimeError("the faulty source broke")
        if mode == "list":
            return [again]
        if mode == "token":
            return Proposal((Candidate((again[0], -7), self.name, ("again", "again")),))
        if mode == "vocab":  # past any vocabulary's end
            return Proposal((Candidate((again[0], 10_000_000), self.name, ("again", "again")),))
        if mode == "evidence":
            return Proposal((Candidate(again, self.name, ("undeclared",) * len(again)),))
        if mode == "slow":
            time.sleep(self.config.seconds)
        return Proposal((Candidate(again, self.name, ("again",) * len(again)),))

    def learn(self, outcome):
        if self.config.mode == "learn" and self.asks > self.config.after:
            raise KeyError("the faulty source's learning broke")


PLUGIN = Plugin(name="faulty", build=lambda setup, text: Faulty(setup.config), priors={"again": 0.3}, overall=0.3,
                describe="goes wrong on purpose (tests)", config=FaultyConfig(),
                options=(Option("faulty_mode", "mode", "How it goes wrong: " + ", ".join(MODES), "--faulty-mode"),
                         Option("faulty_after", "after", "Asks it answers well first", "--faulty-after")))
