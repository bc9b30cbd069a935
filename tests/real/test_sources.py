"""Every registered draft source, alone and verified whole every step, on SmolLM2: greedy text
is plain greedy text (or leaves it only at a near-tie), sampled samples are their seeds' text
alone, and every KV cache holds exactly its text after every step. A new source is checked here
without new test code: it is given what the test offers every source (below) and what its
needs ask of a generation (several samples, a grammar)."""

from __future__ import annotations

import pytest

from llamaspec import SamplingConfig
from llamaspec.sources import default_registry
from llamaspec.sources.registry import Need

from conftest import PROMPTS, SMOL, chatml
from checks import check_greedy, generate_checked, assert_sampled_as_alone

REGISTRY = default_registry()
N = 48
PROMPT = PROMPTS[2]  # a copy-heavy edit: every copying source finds something
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}, "words": {"type": "integer"}},
          "required": ["text", "words"]}
SAMPLED = SamplingConfig(temperature=0.8)


@pytest.fixture(scope="module")
def offers(tmp_path_factory, smol_heads):
    """What a source may load, given to every one: a draft model (SmolLM2 as its own), an n-gram
    cache file (dynamic: it learns from the first generation), draft heads trained for SmolLM2, a
    reference document."""
    return {"draft": True, "settings": {"lookup_cache_dynamic": str(tmp_path_factory.mktemp("cache") / "dyn.bin"),
                                        "draft_max": 4, "heads": str(smol_heads)}}


@pytest.fixture
def plain(make_spec):
    """A fresh plain engine per source: one that kept an earlier prompt's cache would read this
    prompt's shared prefix from decodes of another shape, and leave the text at a near tie (which
    the greedy check cannot tell from a grammar's choice)."""
    return make_spec(SMOL, spec="none")


def spec_of(module_spec, offers, name):
    """``name`` alone; the reference document to the sources that read one (the others refuse it)."""
    references = [PROMPT] if REGISTRY[name].reads_references else []
    return module_spec(SMOL, SMOL if offers["draft"] else None, spec=name, fixed=(name,), references=references,
                       **offers["settings"])


@pytest.mark.parametrize("name", REGISTRY.names)
def test_each_source_alone_keeps_the_target_s_text_and_the_caches_exact(module_spec, offers, plain, reference, name):
    plugin = REGISTRY[name]
    spec = spec_of(module_spec, offers, name)
    prompt = spec.tokenize(chatml("Write the next line of this poem: roses are red") if Need.GRAMMAR in plugin.needs
                           else PROMPT)
    grammar = {"json_schema": SCHEMA} if Need.GRAMMAR in plugin.needs else {}
    if Need.SIBLINGS in plugin.needs:  # several samples of one prompt, each checked against its seed alone
        results = generate_checked(spec, prompt, n=3, max_tokens=N, temperature=SAMPLED.temperature, seed=5,
                                   **grammar)
        assert sum(r.stats.sources[name].drafted for r in results) > 0, f"{name} proposed nothing"
        for i, r in enumerate(results):
            alone = plain.generate(prompt, max_tokens=N, temperature=SAMPLED.temperature, seed=5 + i, **grammar)
            assert_sampled_as_alone(reference(SMOL), prompt, r.tokens, alone.tokens, SAMPLED, 5 + i, f"{name} {i}")
        return
    expected = plain.generate(prompt, max_tokens=N, temperature=0, **grammar)
    first = generate_checked(spec, prompt, max_tokens=N, temperature=0, **grammar)[0]
    again = generate_checked(spec, prompt, max_tokens=N, temperature=0, **grammar)[0]  # what it learned, used
    assert first.stats.sources[name].drafted + again.stats.sources[name].drafted > 0, f"{name} proposed nothing"
    for result, label in ((first, "first"), (again, "again")):
        check_greedy(reference(SMOL), prompt, expected.tokens, result.tokens, f"{name}, {label}", n=N)


def test_every_built_in_source_is_checked_here():
    """Every source runs with what the test offers: none needs something it does not give."""
    from llamaspec import ModelConfig
    configs = REGISTRY.configs({"lookup_cache_dynamic": "dyn.bin", "heads": "smol.heads.npz"})
    for p in REGISTRY.plugins:
        assert not p.loads or p.loads_from(configs[p.name], ModelConfig(SMOL)), \
            f"{p.name} loads something the test does not offer: give it in offers()"
        assert p.needs <= {Need.SIBLINGS, Need.GRAMMAR}, f"{p.name} needs something the test does not give"
