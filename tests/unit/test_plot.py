"""bench --plot's picture from a report made by hand: the speed-ups above, and under them the
share of each strategy's tokens each draft source supplied (stacked bars)."""

from __future__ import annotations

import pytest

from llamaspec.engine.stats import SourceStats
from llamaspec.measure.plot import accepted_shares, write_plot
from llamaspec.measure.report import BenchReport, Machine, PromptInfo, Row, StrategyInfo
from llamaspec.measure.settings import BenchSettings


def row(prompt: str, strategy: str, n_predict: int, n_accept: int, **accepted: int) -> Row:
    sources = {name: SourceStats(drafted=2 * n, accepted=n, steps=n) for name, n in accepted.items()}
    return Row(prompt, strategy, [10.0], 10.0, 10.0, 10.0, 1.5, 0.5, 50.0, 1.5, 100.0, n_predict, 2 * n_accept,
               n_accept, n_predict - n_accept, sources, 100.0, "same")


def test_shares_are_of_the_generated_tokens_the_rest_the_target_s():
    shares = accepted_shares(row("a", "auto", 100, 60, lookup=40, lookahead=20, draft=0))
    assert shares == pytest.approx({"lookup": 0.4, "lookahead": 0.2})
    doubled = accepted_shares(row("a", "auto", 100, 30, lookup=30, lookahead=30))  # both proposed every token
    assert sum(doubled.values()) == pytest.approx(0.3)
    assert accepted_shares(row("a", "plain", 100, 0)) == {}


def test_the_plot_has_the_speed_ups_and_the_sources_stacked(tmp_path):
    prompts = [PromptInfo("code_edit", "", 100, 3.0), PromptInfo("open_chat", "", 50, 1.2)]
    report = BenchReport("0", "today", Machine("linux", 2, 2, "cpu", "0.3"), BenchSettings("m.gguf"), "rss",
                         [StrategyInfo(n, "", 0.0) for n in ("plain", "lookup", "auto")], prompts,
                         [row("code_edit", "plain", 100, 0), row("code_edit", "lookup", 100, 70, lookup=70),
                          row("code_edit", "auto", 100, 80, lookup=60, lookahead=25),
                          row("open_chat", "plain", 100, 0), row("open_chat", "lookup", 100, 5, lookup=5),
                          row("open_chat", "auto", 100, 20, lookahead=20)])
    png = tmp_path / "bench.png"
    write_plot(report, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
