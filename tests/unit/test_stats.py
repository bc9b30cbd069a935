from llamaspec import Stats
from llamaspec.engine.engine import Step


def test_record_step_counts_by_position_and_by_source():
    s = Stats()
    s.record_step(Step(tokens=[1, 2, 3], n_drafted=3, drafted={"lookup": 3, "lookahead": 1},
                         path_sources=(("lookup", "lookahead"), ("lookup",)), depth=3,
                       branches=2))
    s.record_step(Step(tokens=[4], n_drafted=1, drafted={"lookup": 1}, depth=1, branches=1))
    s.record_step(Step(tokens=[5]))
    assert (s.n_predict, s.n_drafted, s.n_accept, s.n_target_calls) == (5, 4, 2, 3)
    assert s.drafted_by_pos == [2, 1, 1] and s.accepted_by_pos == [1, 1, 0]
    assert s.accept == 50.0 and s.accept_by_position == [0.5, 1.0, 0.0]
    assert abs(s.tokens_per_call - 5 / 3) < 1e-12
    assert (s.speculative_steps, s.n_branches) == (2, 3)
    assert (s.sources["lookup"].drafted, s.sources["lookup"].accepted, s.sources["lookup"].steps) == (4, 2, 2)
    assert (s.sources["lookahead"].drafted, s.sources["lookahead"].accepted) == (1, 1)
    d = s.to_dict()
    assert d["n_accept"] == 2 and d["accept"] == 50.0 and d["sources"]["lookup"]["accepted"] == 2
    assert "n_drafted = 4, n_accept = 2, accept = 50.0% (lookahead 1/1, lookup 2/4)" in s.summary()


def test_a_stop_inside_a_step_counts_only_what_was_kept():
    s = Stats()
    s.record_step(Step(tokens=[1, 2, 3, 4], n_drafted=4, drafted={"draft": 4}, path_sources=(("draft",),) * 3, depth=4), kept=2)
    assert (s.n_predict, s.n_accept, s.n_drafted) == (2, 2, 4) and s.accepted_by_pos == [1, 1, 0, 0]
    assert s.sources["draft"].accepted == 2


def test_idle_reasons_are_kept_until_the_source_runs():
    s = Stats()
    s.record_step(Step(tokens=[1], idle={"draft": "draft idle: too dear"}))
    assert s.idle == {"draft": "draft idle: too dear"}
    s.record_step(Step(tokens=[2, 3], n_drafted=2, drafted={"draft": 2}, path_sources=(("draft",),), depth=2))
    assert s.idle == {}


def test_decode_speed_counts_the_tokens_after_the_call_that_read_the_prompt():
    """As llama-server's predicted_per_second: the first call's token came in the prompt's time."""
    s = Stats(n_predict=32, n_first=1, t_decode=3.1)
    assert s.decode_tps == 10.0 and Stats(n_predict=1, n_first=1, t_decode=0.01).decode_tps == 0.0
