"""Draft sources as plugins: which run (auto, a list, what each needs), their evidence keys and
priors, and a source declared here alone run through the registry in one text and in lanes."""

from __future__ import annotations

from typing import List

import numpy as np
import pytest

from llamaspec import ConfigError, SamplingConfig, SpecConfig
from llamaspec.sources.base import FORCED, Budget, Outcome, Source
from llamaspec.sources.consensus import Siblings
from llamaspec.sources.draft_model import PLUGIN as DRAFT
from llamaspec.sources.ngram_cache import NgramCache, NgramCaches
from llamaspec.sources.registry import Group, Setup, TextContext
from llamaspec.sources import default_registry

from conftest import ANSWERS



REGISTRY = default_registry()
EVERYTHING = frozenset({"draft", "cache", "heads"})  # the sources with something to load, all given it
GREEDY = SamplingConfig(temperature=0)


def test_what_each_spec_runs_given_what_is_loaded():
    resolve = REGISTRY.resolve
    # consensus runs where samples are, the grammar where a request has one
    assert resolve(SpecConfig(), frozenset()) == {"lookup", "lookahead", "consensus", "grammar"}
    assert resolve(SpecConfig(), EVERYTHING) == {"lookup", "cache", "lookahead", "heads", "draft", "consensus",
                                                 "grammar"}
    assert resolve(SpecConfig.parse("lookup"), EVERYTHING) == {"lookup", "cache"}  # the cache files join lookup
    assert resolve(SpecConfig.parse("lookup"), frozenset()) == {"lookup"}
    assert resolve(SpecConfig.parse("none"), EVERYTHING) == frozenset()
    for spec, fragment in [("turbo", "unknown draft source 'turbo'; choose from auto, none or lookup, cache, "
                                     "lookahead, heads, draft, consensus, grammar"),
                           ("draft", "the draft source needs a draft model"),
                           ("cache", "the cache source needs an n-gram cache file")]:
        with pytest.raises(ConfigError, match=fragment):
            resolve(SpecConfig.parse(spec), frozenset())
    with pytest.raises(ConfigError, match="draft is to be verified whole but does not run"):
        resolve(SpecConfig.parse("lookup").with_fixed(frozenset({"draft"})), EVERYTHING)


def test_labels_and_what_the_registry_says_of_each_source():
    names = REGISTRY.resolve(SpecConfig.parse("lookahead,lookup"), EVERYTHING)
    assert REGISTRY.label(names, SpecConfig.parse("lookahead,lookup")) == "lookup,lookahead"
    assert REGISTRY.label(frozenset(), SpecConfig.parse("none")) == "plain"
    assert REGISTRY.label(names, SpecConfig()) == "auto"
    assert REGISTRY.shadowed() == {"lookahead": "lookup", "heads": "lookup"}
    built_in = [cls for cls in Source.__subclasses__() if cls.__module__.startswith("llamaspec.sources.")]
    assert {cls.name for cls in built_in} >= set(REGISTRY.names)
    assert [cls.name for cls in built_in if cls.expensive] == ["draft"]  # asking it costs decodes
    with pytest.raises(ConfigError, match="two draft sources are named 'draft': built-in and built-in"):
        REGISTRY.extended(DRAFT)


def with_caches(caches: NgramCaches) -> dict:
    """Each source's Setup, the cache source's with ``caches`` loaded."""
    setups = REGISTRY.setups()
    return {**setups, "cache": Setup(setups["cache"].config, caches)}


def test_every_source_is_built_where_its_needs_are_met():
    setups = with_caches(NgramCaches(1, 2, NgramCache(), NgramCache()))
    everyone = frozenset(REGISTRY.names) - {"draft", "heads"}  # (built on a model: test_heads, test_sources)
    alone = REGISTRY.build(everyone, setups)
    assert [s.name for s in alone] == ["lookup", "cache", "lookahead"]
    lane = REGISTRY.build(everyone, setups, TextContext(group=Group(2, 3), sample=1))
    assert [s.name for s in lane] == ["lookup", "cache", "lookahead", "consensus"] and lane[-1].sample == 1
    assert all(isinstance(s, Source) for s in lane)


def keys_given(source: Source, prompt: List[int], answer: List[int], windows: bool = False) -> set:
    """Every evidence key ``source`` gives while ``answer`` is written after ``prompt``, step by step
    (each step emitting one token; the window's guesses taken as the next answer tokens)."""
    keys = set()
    rng = np.random.default_rng(0)
    for k in range(1, len(answer)):
        tokens = [*prompt, *answer[:k]]
        proposal = source.propose(tokens, Budget(16), GREEDY, rng)
        for cand in proposal.candidates:
            keys.update(cand.evidence)
        guesses = None
        if windows and proposal.window is not None:
            guesses = tuple(answer[min(k + 1, len(answer) - 1)] for row in proposal.window.rows if row[3])
        source.learn(Outcome(tokens=[*tokens, answer[k]], candidates=proposal.candidates,
                             verified=tuple(len(c.tokens) for c in proposal.candidates),
                             emitted=(answer[k],), window_tokens=guesses))
    return keys


def test_every_evidence_key_a_source_gives_has_a_prior():
    """Each built-in source, built by the registry and run over recorded answers, gives only keys
    its plugin declares a prior for (the acceptance model refuses any other); the draft model's
    deciles and the grammar's forced tokens before a candidate (FORCED, where the speculator puts
them) all have one. (The grammar's keys, which need a model's vocabulary: test_grammar_real.py.)"""
    for name, item in list(ANSWERS.items())[:3]:
        prompt, answer = item["prompt"], item["answer"]
        group = Group(2, len(prompt))
        group.shared("consensus", lambda: Siblings(2, len(prompt))).update(0, [*prompt, *answer])
        dynamic = NgramCache()  # holds the answer: the cache source proposes
        dynamic.update([*prompt, *answer], 1, 2, len(prompt) + len(answer))
        setups = with_caches(NgramCaches(1, 2, NgramCache(), dynamic))
        text = TextContext(group=group, sample=1)
        for plugin in REGISTRY.plugins:
            if plugin.name in ("draft", "grammar", "heads"):  # (heads' keys: tests/unit/test_heads.py)
                continue
            source = plugin.build(setups[plugin.name], text)
            keys = keys_given(source, prompt, answer, windows=True)
            assert keys, f"{plugin.name} proposed nothing on {name}"
            missing = (keys | ({FORCED} if source.past_forced else set())) - set(plugin.priors)
            assert not missing, f"{plugin.name} gave keys without a prior: {sorted(map(repr, missing))[:5]}"
    assert set(range(11)) | {FORCED} <= set(DRAFT.priors)


def test_priors_are_probabilities():
    for plugin in REGISTRY.plugins:
        assert plugin.priors and all(0 < p <= 1 for p in plugin.priors.values()), plugin.name
        assert 0 < plugin.overall <= 1


# --- a source of one's own -----------------------------------------------------------------------


def test_what_a_plugin_declares_is_checked_when_it_registers():
    """A fault in a declaration is one ConfigError naming the source when a registry takes it,
    not an error mid-generation."""
    from dataclasses import dataclass, replace
    from llamaspec.sources.registry import Hooks, Option, Plugin

    @dataclass(frozen=True)
    class Settings:
        size: int = 1

    class Silent(Hooks):  # loads something but never says what: load would never be called
        def load(self, config, resources, checked):
            return "loaded"
    good = Plugin(name="mine", build=lambda setup, text: None, priors={"x": 0.5}, overall=0.5, config=Settings(),
                  options=(Option("mine_size", "size", "How big.", "--mine-size"),), origin="a package 1.0")
    assert REGISTRY.extended(good)["mine"] is good
    for change, fault in [({"name": "my-source"}, "its name must be a Python identifier"),
                          ({"name": "auto"}, "its name must be a Python identifier, not auto or none"),
                          ({"priors": {}}, "priors must map each evidence key"),
                          ({"priors": {"x": 1.5}}, "the prior of 'x' is 1.5, not a probability"),
                          ({"overall": 0}, "the prior of 'overall' is 0"),
                          ({"build": None}, "build is not callable"),
                          ({"hooks": lambda config: None}, "hooks must be an instance of Hooks"),
                          ({"hooks": Silent()}, "its hooks load something but do not say what"),
                          ({"flags": frozenset({"alone", "quick"})}, "flags must be a frozenset of alone, fixed"),
                          ({"config": {"size": 1}}, "config must be a dataclass instance"),
                          ({"options": (Option("mine_size", "sized", "How big.", "--mine-size"),)},
                           "option mine_size sets 'sized', which its config has no field of"),
                          ({"options": (Option("mine_size", "size", "How big.", "-s"),)}, "option mine_size's flag '-s' is not a --long-flag"),
                          ({"needs": {"a grammar"}}, "needs must be a frozenset of Need")]:
        with pytest.raises(ConfigError, match=f"the draft source '.*' \\(a package 1.0\\): {fault}"):
            REGISTRY.extended(replace(good, **change))


def test_hooks_default_to_nothing_and_rooms_add_up():
    """A plugin that gives only name, build, priors and overall loads nothing, runs wherever its
    needs are met, and asks a branch per leaf; lookahead's window columns and the heads' hidden
    states add up with it (the most branches, every source's own sequences)."""
    from llamaspec import Hooks, Plugin, Room, SpecConfig, Target
    simple = Plugin(name="simple", build=lambda setup, text: None, priors={"x": 0.5}, overall=0.5)
    assert simple.loads == "" and isinstance(simple.hooks, Hooks)
    registry = REGISTRY.extended(simple)
    configs = registry.configs({"lookahead_w": 5, "lookahead_g": 3})
    assert "simple" in registry.resolve(SpecConfig(), frozenset())
    assert registry.resolve(SpecConfig(frozenset({"simple"})), frozenset()) == {"simple"}
    target = Target(n_ctx=4096, n_batch=512, leaves=4)

    def room(names, configs):
        return Room.together(registry.rooms(frozenset(names), configs, target, frozenset()).values(), 4)
    assert room({"simple"}, configs) == Room(4)
    assert room({"simple", "lookahead", "heads"}, configs) == Room(branches=4, own=5, hidden=True)
    assert room({"lookahead"}, registry.configs({"lookahead_g": 9})).branches == 9


def test_the_simplest_source_in_the_plugin_docs_registers_and_proposes():
    """docs/plugins.md's first example is whole: it runs, registers, and its source proposes."""
    import re
    from pathlib import Path
    from llamaspec import Budget, SamplingConfig, Setup, TextContext
    text = (Path(__file__).parents[2] / "docs" / "plugins.md").read_text()
    code = re.search(r"The simplest source.*?```python\n(.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(code, scope)
    registry = REGISTRY.extended(scope["PLUGIN"])
    echo, = registry.build(frozenset({"echo"}), registry.setups(), TextContext())
    proposal = echo.propose([5, 6, 7, 8], Budget(max_len=4), SamplingConfig(), None)
    assert proposal.candidates[0].tokens == (6, 7, 8)
