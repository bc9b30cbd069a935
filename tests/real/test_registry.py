"""Draft sources as plugins: which run (auto, a list, what each needs), their evidence keys and
priors, and a source declared here alone run through the registry in one text and in lanes."""

from __future__ import annotations

from typing import List

import numpy as np
import pytest

from llamaspec import ConfigError, SamplingConfig
from llamaspec.sources.base import Budget, Candidate, Proposal, Source
from llamaspec.sources.registry import Plugin
from llamaspec.sources import default_registry

from conftest import PROMPTS, SMOL
from checks import assert_sampled_as_alone, check_greedy


# --- a source of one's own -----------------------------------------------------------------------

class Echo(Source):
    """The text's last two tokens again: a source declared in this test module alone."""

    name = "echo"

    def __init__(self, calls: List[int]) -> None:
        self.calls = calls

    def propose(self, tokens, budget: Budget, sampling: SamplingConfig, rng: np.random.Generator) -> Proposal:
        self.calls.append(id(self))
        cont = tuple(tokens[-2:])[:budget.max_len]
        return Proposal((Candidate(cont, self.name, ("again",) * len(cont)),) if cont else ())


def echo_registry(calls: List[int]):
    return default_registry().extended(Plugin(name="echo", build=lambda setup, text: Echo(calls), priors={"again": 0.3},
                                           overall=0.3))


def test_a_source_of_ones_own_runs_in_auto_in_one_text_and_in_lanes(make_spec, smol_plain, reference):
    """Registered alone (no other file names it), ``auto`` builds it for one text and for every
    lane of several samples; verified whole every step, the text stays the target's own."""
    calls: List[int] = []
    spec = make_spec(SMOL, fixed=("echo",), registry=echo_registry(calls))
    assert spec.spec_name == "auto"
    prompt = PROMPTS[1]
    one = spec.generate(prompt, max_tokens=32, temperature=0)
    plain = smol_plain.generate(prompt, max_tokens=32, temperature=0)
    assert len(set(calls)) == 1 and one.stats.sources["echo"].drafted > 0
    check_greedy(reference(SMOL), spec.tokenize(prompt), plain.tokens, one.tokens, "echo, one text", n=32)

    calls.clear()
    many = spec.generate(prompt, n=3, max_tokens=16, temperature=0.8, seed=7)
    assert len(set(calls)) == 3, "one echo source per lane"
    assert all(r.stats.sources["echo"].drafted > 0 for r in many)
    for i, r in enumerate(many):
        alone = smol_plain.generate(prompt, max_tokens=16, temperature=0.8, seed=7 + i)
        assert_sampled_as_alone(reference(SMOL), spec.tokenize(prompt), r.tokens, alone.tokens,
                                SamplingConfig(temperature=0.8), 7 + i, f"echo, sample {i}")


def test_a_source_of_ones_own_is_refused_by_a_registry_without_it(make_spec):
    with pytest.raises(ConfigError, match="unknown draft source 'echo'"):
        make_spec(SMOL, spec="echo")
