"""Each token's provenance (engine/generation.py) and the server's Prometheus metrics
(server/metrics.py), without a model: steps made by hand, a collector, the parser of
prometheus_client reading what the metrics write."""

from __future__ import annotations

from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fakes import EOS, FakeModel
from llamaspec.engine.engine import Step
from llamaspec.engine.generation import PLAIN, Collector, make_config
from llamaspec.engine.stats import Stats
from llamaspec.errors import ConfigError
from llamaspec.server.metrics import Metrics


def collect(*steps: Step, **options):
    collector = Collector(FakeModel(), make_config(**options), Stats())
    chunks = [collector.take(step)[0] for step in steps]
    return chunks, collector.result()


def test_accepted_tokens_name_their_source_and_the_target_s_own_is_plain():
    chunks, result = collect(
        Step(tokens=[1]),  # the prompt's first token
        Step(tokens=[2, 3, 4], n_drafted=3, depth=3, drafted={"lookup": 3}, path_sources=(("lookup",), ("lookup",))),
        Step(tokens=[5, 6], n_drafted=2, depth=2, drafted={"draft": 2}, path_sources=(("draft",),)))
    assert [c.sources for c in chunks] == [[PLAIN], ["lookup", "lookup", PLAIN], ["draft", PLAIN]]
    assert result.sources == [PLAIN, "lookup", "lookup", PLAIN, "draft", PLAIN]
    assert len(result.sources) == len(result.tokens)
    assert [c.pieces for c in chunks] == [["b"], ["c", "d", "e"], ["f", "g"]]
    assert all("".join(c.pieces) == c.text for c in chunks)
    counts = Counter(result.sources)
    assert counts["lookup"] == result.stats.sources["lookup"].accepted
    assert counts["draft"] == result.stats.sources["draft"].accepted


def test_a_token_two_sources_proposed_is_the_first_one_s_and_counts_for_both():
    _, result = collect(Step(tokens=[2, 3], n_drafted=1, depth=1, drafted={"lookup": 1, "draft": 1},
                             path_sources=(("lookup", "draft"),)))
    assert result.sources == ["lookup", PLAIN]
    assert result.stats.sources["lookup"].accepted == result.stats.sources["draft"].accepted == 1


def test_a_stop_cuts_the_sources_with_the_tokens():
    _, result = collect(Step(tokens=[2, EOS, 4], n_drafted=2, depth=2, drafted={"lookup": 2},
                             path_sources=(("lookup",), ("lookup",))))
    assert result.tokens == [2] and result.sources == ["lookup"]
    _, result = collect(Step(tokens=[2, 3, 4], n_drafted=2, depth=2, drafted={"lookup": 2},
                             path_sources=(("lookup",), ("lookup",))), stop="d")
    assert result.text == "c" and result.sources == ["lookup", "lookup"]  # the stop string's token came, unsent


def test_a_request_names_its_sources_as_spec_does():
    assert make_config().sources is None and make_config(sources="auto").sources is None
    assert make_config(sources="none").sources == frozenset()
    assert make_config(sources="lookup, draft").sources == {"lookup", "draft"}
    for bad in ("", "auto,lookup", 3):
        with pytest.raises(ConfigError, match="^spec: "):
            make_config(sources=bad)


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict, name: str, **labels) -> float:
    for sample in fams[name].samples:
        if sample.name.endswith("_total") or sample.name == name:
            if sample.labels == labels:
                return sample.value
    raise AssertionError(f"no sample of {name} {labels}")


def test_metrics_parse_and_sum_what_generations_report():
    metrics = Metrics()
    empty = families(metrics.render(0, 0))
    assert value(empty, "llamacpp:prompt_tokens") == 0 and empty["llamacpp:requests_processing"].type == "gauge"
    assert empty["llamacpp:tokens_predicted"].type == "counter"
    _, one = collect(Step(tokens=[1]), Step(tokens=[2, 3], n_drafted=2, depth=2, drafted={"lookup": 2},
                                            path_sources=(("lookup",),)))
    one.stats.n_prompt, one.stats.n_prompt_eval, one.stats.t_decode = 10, 7, 0.5
    metrics.request()
    metrics.record(one)
    metrics.record(one)
    fams = families(metrics.render(processing=1, deferred=3))
    assert value(fams, "llamacpp:prompt_tokens") == 14 and value(fams, "llamacpp:tokens_predicted") == 6
    assert value(fams, "llamacpp:tokens_predicted_seconds") == 1.0 and value(fams, "llamacpp:n_decode") == 4
    assert value(fams, "llamacpp:requests_processing") == 1 and value(fams, "llamacpp:requests_deferred") == 3
    assert value(fams, "llamaspec:requests") == 1 and value(fams, "llamaspec:prompt_tokens_cached") == 6
    assert value(fams, "llamaspec:source_tokens_verified", source="lookup") == 4
    assert value(fams, "llamaspec:source_tokens_accepted", source="lookup") == 2
    assert value(fams, "llamaspec:source_steps", source="lookup") == 2
    assert value(fams, "llamaspec:tokens_generated_by_source", source="plain") == 4
    assert value(fams, "llamaspec:tokens_generated_by_source", source="lookup") == 2


def test_metrics_are_the_server_s_own():
    a, b = Metrics(), Metrics()
    a.request()
    assert value(families(b.render(0, 0)), "llamaspec:requests") == 0
