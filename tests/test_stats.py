from llamaspec import Stats


def test_record_step_counts_by_position():
    s = Stats()
    s.record_step(n_drafted=3, n_accepted=2, n_emitted=3)
    s.record_step(n_drafted=1, n_accepted=0, n_emitted=1)
    s.record_step(n_drafted=0, n_accepted=0, n_emitted=1)
    assert (s.n_predict, s.n_drafted, s.n_accept, s.n_target_calls) == (5, 4, 2, 3)
    assert s.drafted_by_pos == [2, 1, 1] and s.accepted_by_pos == [1, 1, 0]
    assert s.accept == 50.0
    assert s.accept_by_position == [0.5, 1.0, 0.0]
    assert abs(s.tokens_per_call - 5 / 3) < 1e-12
    d = s.to_dict()
    assert d["n_accept"] == 2 and d["accept"] == 50.0
    assert "n_drafted = 4, n_accept = 2, accept = 50.0%" in s.summary()
