"""A draft source of your own, in one file: the rest of a phrase from a list you give it.

Where the text ends with the start of one of your phrases (its last ``--phrases-min-match``
tokens or more), the rest of that phrase is proposed; the planner verifies it where it pays, so
the text stays the model's own. Use it from the command line::

    llamaspec generate -m smollm2-135m-instruct --source examples/custom_source.py \\
        --phrases phrases.txt -p "Our motto is: the quick"

or from Python::

    spec = llamaspec.load("smollm2-135m-instruct", sources=["examples/custom_source.py"],
                          phrases_file="phrases.txt")

A package can ship a source too, found without ``--source``: declare its module in the entry-point
group ``llamaspec.sources`` (``[project.entry-points."llamaspec.sources"] phrases =
"mypackage.phrases"``). What each part below is for: docs/plugins.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from llamaspec import Budget, Candidate, Hooks, Option, Plugin, Proposal, SamplingConfig, Source
from llamaspec.config import MAX_TEXT_BYTES, check, check_readable


@dataclass(frozen=True)
class PhrasesConfig:
    """Its settings, with their defaults (``--phrases``, ``--phrases-min-match``)."""

    file: Optional[str] = None
    min_match: int = 2

    def __post_init__(self) -> None:
        check(self.min_match >= 1, f"--phrases-min-match must be >= 1, got {self.min_match}")


class PhraseSource(Source):
    """Proposes the rest of a phrase whose start the text ends with; its evidence is how many
    tokens of the phrase the text matched (1, 2, 3, then 4 for any more)."""

    name = "phrases"

    def __init__(self, phrases: Sequence[Tuple[int, ...]], min_match: int) -> None:
        self.phrases, self.min_match = phrases, min_match

    def propose(self, tokens: Sequence[int], budget: Budget, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        """``tokens``: the text so far, its last token the one about to be read."""
        found = {}  # what follows -> the longest match behind it
        for phrase in self.phrases:
            for start in range(len(phrase) - 1):
                n = self._match(tokens, phrase, start)
                if n >= self.min_match and start + n < len(phrase):
                    rest = tuple(phrase[start + n:start + n + budget.max_len])
                    found[rest] = max(n, found.get(rest, 0))
        best = sorted(found.items(), key=lambda f: -f[1])[:budget.max_candidates]  # the longest matches first
        return Proposal(tuple(Candidate(rest, self.name, (min(n, 4),) * len(rest)) for rest, n in best))

    @staticmethod
    def _match(tokens: Sequence[int], phrase: Sequence[int], start: int) -> int:
        """How many tokens the text ends with that are phrase[start:start + n] (the longest n)."""
        best = 0
        for n in range(1, min(len(tokens), len(phrase) - start) + 1):
            if tuple(tokens[-n:]) == tuple(phrase[start:start + n]):
                best = n
        return best


class PhrasesHooks(Hooks):
    """What the source does before it is built for a text: the file read, then tokenized."""

    loads = "a phrase file (--phrases)"

    def check(self, config: PhrasesConfig) -> Optional[str]:
        """Before any model loads: the phrase file, read (a missing file is one line of error)."""
        if config.file is None:
            return None
        check_readable(config.file, MAX_TEXT_BYTES, "phrase file")
        with open(config.file, encoding="utf-8") as f:
            return f.read()

    def available(self, config: PhrasesConfig, draft) -> bool:
        """It runs only where a phrase file is given."""
        return config.file is not None

    def load(self, config: PhrasesConfig, resources, text: str) -> List[Tuple[int, ...]]:
        """Once the target is loaded: each phrase in its tokens, as it stands after a space."""
        model = resources.target
        return [tuple(model.tokenize(" " + line.strip(), add_special=False, parse_special=False))
                for line in text.splitlines() if line.strip()]


PLUGIN = Plugin(
    name="phrases", describe="the rest of a phrase from your list",
    config=PhrasesConfig(),
    options=(Option("phrases_file", "file", "A file of phrases, one a line, the text may go on with.",
                    flag="--phrases", path=True),
             Option("phrases_min_match", "min_match", "Tokens of a phrase the text must end with.",
                    flag="--phrases-min-match")),
    hooks=PhrasesHooks(),
    build=lambda setup, text: PhraseSource(setup.loaded, setup.config.min_match),
    priors={1: 0.3, 2: 0.5, 3: 0.7, 4: 0.8}, overall=0.4)
