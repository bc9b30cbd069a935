"""llamaspec bench and llamaspec profile on SmolLM2: the shipped suite, the report's fields and
JSON shape, the plot, the cost curve and its cache, and one clear line for bad input."""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

import pytest

from llamaspec import ModelConfig, SpecConfig

from llamaspec.planning import costs
from llamaspec.llama.binding import Context
from llamaspec.api import LlamaSpec
from llamaspec.measure import SUITES, load_suite
from llamaspec.measure.report import BenchReport, validate
from llamaspec.errors import ConfigError


def validate_report(report):
    validate(report, BenchReport)

from conftest import THREADS, assert_one_line_error, run


def test_suite_covers_where_speculation_should_and_should_not_help(smol_plain):
    suite = load_suite()
    assert [p.name for p in suite] == ["code_edit", "summarize_quotes", "json_record", "open_chat", "long_answer"]
    code = suite[0].user
    assert "class Inventory:" in code and "def save(self):" in code  # a real file to edit
    assert len(suite[1].user.split()) > 300 and "quotation" in suite[1].user
    assert "48213" in suite[2].user and "JSON" in suite[2].user
    for prompt in suite:
        text = smol_plain.format_chat(prompt.messages)  # every prompt runs through the chat template
        assert text.startswith("<|im_start|>") and prompt.user in text and prompt.description
    assert [p.name for p in load_suite(["open_chat", "code_edit"])] == ["open_chat", "code_edit"]
    with pytest.raises(ConfigError, match="unknown prompt 'nope'; the suite has: code_edit, summarize_quotes"):
        load_suite(["open_chat", "nope"])


def test_bench_end_to_end(smol, smol_heads, tmp_path):
    """Every strategy on a suite prompt and a file's, with a heads file given (the report keeps
    its path as the JSON's text): the report's fields, its JSON, the table and the plot."""
    own = tmp_path / "repeat_list.txt"
    own.write_text("Repeat this list exactly: alpha, beta, gamma, delta, epsilon.")
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    strategies = ["plain", "lookup", "lookahead", "draft", "auto"]
    result = run("bench", "-m", smol, "-md", smol, "-t", str(THREADS), "-c", "1024", "-n", "8", "--draft-max", "4",
                 "--draft-p-min", "0", "--prompts", "open_chat", "-f", str(own), "--repeat", "2",
                 "--strategies", "lookup,lookahead,draft,auto", "--heads", str(smol_heads), "--json", str(out),
                 "--plot", str(png))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    validate_report(report)
    assert [s["name"] for s in report["strategies"]] == strategies
    assert [(p["name"], p["n_prompt"] > 10) for p in report["prompts"]] == [("open_chat", True), ("repeat_list", True)]
    assert all(p["copy_bound"] >= 1.0 for p in report["prompts"])
    assert report["settings"]["n_predict"] == 8 and report["settings"]["repeat"] == 2
    assert report["settings"]["sources"]["heads"] == str(smol_heads)
    assert report["machine"]["threads"] == THREADS and report["machine"]["backend"] == "cpu"
    rows = {(r["prompt"], r["strategy"]): r for r in report["rows"]}
    assert list(rows) == [(p, s) for p in ("open_chat", "repeat_list") for s in strategies]
    for (prompt, strategy), r in rows.items():
        assert len(r["decode_tps"]) == 2 and r["decode_tps_min"] <= r["decode_tps_median"] <= r["decode_tps_max"]
        assert r["decode_tps_min"] > 0 and r["prompt_tps"] > 0 and r["peak_rss_mb"] > 0
        assert r["n_predict"] == 16 and r["n_target_calls"] >= 2 and r["tokens_per_call"] >= 1
        plain = rows[(prompt, "plain")]
        assert r["speedup"] == pytest.approx(statistics.median(
            t / b for t, b in zip(r["decode_tps"], plain["decode_tps"])))  # paired by repetition
        bound = next(p["copy_bound"] for p in report["prompts"] if p["name"] == prompt)
        assert r["bound_share"] == pytest.approx(r["speedup"] / bound)
        assert all(s["accepted"] <= s["drafted"] for s in r["sources"].values())
        assert re.fullmatch(r"same|differs from token \d+", r["output"]), r["output"]
        if r["n_drafted"]:
            assert r["accept"] == pytest.approx(100 * r["n_accept"] / r["n_drafted"])
        line = next(line for line in result.stdout.splitlines()
                    if line.startswith(f"{prompt} ") and f" {strategy} " in line)
        assert f"{r['speedup']:.2f}x" in line and f"{r['decode_tps_median']:.2f}" in line and r["output"] in line
    assert rows[("open_chat", "plain")]["output"] == "same"  # plain twice: deterministic
    assert set(rows[("repeat_list", "auto")]["sources"]) <= {"lookup", "lookahead", "draft", "heads"}
    assert "copy-oracle bound: open_chat " in result.stdout
    assert all(s["load_rss_mb"] > 0 for s in report["strategies"])
    assert "memory added by loading each strategy" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_structured_suite_runs_constrained_and_prints_the_grammar_s_cost(smol, tmp_path):
    """--suite structured: every answer follows its prompt's schema (cut at -n aside), the
    grammar source runs in auto, and the time spent following the schema is printed per token."""
    out = tmp_path / "bench.json"
    result = run("bench", "-m", smol, "-t", str(THREADS), "-c", "2048", "-n", "48", "--suite", "structured",
                 "--prompts", "records_list,function_call", "--repeat", "1", "--strategies", "auto",
                 "--json", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    validate_report(report)
    assert [p["constrained"] for p in report["prompts"]] == [True, True] and report["decode_ms"] > 0
    for r in report["rows"]:
        assert 0 < r["grammar_ms_per_token"] < report["decode_ms"], r
        assert r["output"] == "same" or r["output"].startswith("differs from token"), r["output"]
    auto = [r for r in report["rows"] if r["strategy"] == "auto"]
    assert all("grammar" in r["sources"] for r in auto)
    assert "following the schema, per token (of a " in result.stdout and "records_list auto " in result.stdout
    schemas = {p.name: p.schema for p in load_suite(path=SUITES["structured"])}
    assert set(schemas) == {"schema_extract", "records_list", "function_call"} and all(schemas.values())


def test_bench_user_errors(smol, tmp_path, monkeypatch):
    assert_one_line_error(run("bench", "-m", smol, "--strategies", "plain,turbo"), "unknown strategy 'turbo'")
    assert_one_line_error(run("bench", "-m", smol, "--strategies", "draft"), "needs a draft model (-md)")
    assert_one_line_error(run("bench", "-m", smol, "--prompts", "nope"), "unknown prompt 'nope'")
    assert_one_line_error(run("bench", "-m", smol, "--repeat", "0"), "repeat must be >= 1")
    assert_one_line_error(run("bench", "-m", smol, "-n", "0"), "must be >= 1")
    assert_one_line_error(run("bench", "-m", smol, "--json", str(tmp_path / "no" / "x.json")), "cannot write")
    (tmp_path / "open_chat.txt").write_text("Hi")
    assert_one_line_error(run("bench", "-m", smol, "--prompts", "open_chat", "-f", str(tmp_path / "open_chat.txt")),
                          "two prompts are named 'open_chat'")
    # without matplotlib, --plot fails first: before the (missing) model is even looked at
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = run("bench", "-m", str(tmp_path / "missing.gguf"), "--plot", str(tmp_path / "x.png"))
    assert_one_line_error(result, "--plot needs matplotlib: pip install 'llamaspec[plot]'")


def test_profile_measures_every_n_and_generation_reuses_it(smol, tmp_path, monkeypatch):
    result = run("profile", "-m", smol, "-t", str(THREADS), "--repeats", "1", "--cache-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert f"threads {THREADS}, backend cpu" in lines[0]
    assert f"{costs.PREFIX} tokens in the KV cache (and {costs.DEEP}: the last two columns)" in lines[0]
    assert lines[1].split() == ["n", "ms", "per", "call", "relative", "cost", "tokens/s", "ms", "relative"]
    table = [[float(x) for x in line.split()] for line in lines[2:]]
    assert [int(row[0]) for row in table] == list(range(1, costs.N_MAX + 1))
    assert all(ms > 0 and rel > 0 and tps > 0 and deep_ms > 0 and deep_rel > 0
               for _, ms, rel, tps, deep_ms, deep_rel in table) and table[0][2] == table[0][5] == 1.0

    cache_file = tmp_path / "costs.json"
    curve = costs.cached_curve(Path(smol), THREADS, cache_file)
    assert curve is not None and len(curve.relative) == costs.N_MAX and curve.threads == THREADS
    assert [round(curve.cost(n), 2) for n in range(1, costs.N_MAX + 1)] == [row[2] for row in table]
    # measured behind two lengths of text, every n at both
    assert (curve.context, curve.deep_context) == (costs.PREFIX, costs.DEEP) and len(curve.deep) == costs.N_MAX
    assert [round(curve.cost(n, costs.DEEP), 2) for n in range(1, costs.N_MAX + 1)] == [row[5] for row in table]

    def no_measuring(*args, **kwargs):
        raise AssertionError("the cached curve should have been used")
    monkeypatch.setattr(costs, "measure", no_measuring)
    with LlamaSpec(ModelConfig(smol, n_ctx=1024, n_threads=THREADS), cache_dir=tmp_path, progress=False,
                   spec=SpecConfig(frozenset({"lookup"}))) as spec:
        assert spec.generate("Hello", max_tokens=2, temperature=0).stats.n_predict == 2
    assert_one_line_error(run("profile", "-m", smol, "--repeats", "0", "--cache-dir", str(tmp_path)),
                          "repeats must be >= 1")


def test_costs_are_measured_on_text_and_one_token_is_timed_most(smol, pool, monkeypatch):
    """Decodes of text behind text (not of one token repeated), one token tried ONES times as
    often as a batch: one token is the unit of every cost. Rolled back after."""
    model = pool.get(Path(smol))
    ctx = Context(model, 1024, THREADS)
    try:
        ctx.eval(model.tokenize("Hello", add_special=False))
        before = list(ctx.tokens)
        decodes = []
        real_eval = ctx.eval
        monkeypatch.setattr(ctx, "eval", lambda tokens, logits="none": decodes.append((list(tokens), logits))
                            or real_eval(tokens, logits=logits))
        curve = costs.measure(ctx, sizes=(1, 2, 4), repeats=2, deep_sizes=())
        assert ctx.tokens == before and curve.relative[0] == 1.0
        (filler, _), timed = decodes[0], [tokens for tokens, logits in decodes if logits == "all"]
        assert len(filler) == costs.PREFIX and len(set(filler)) > 10
        assert [len(t) for t in timed] == 2 * ([1] * costs.ONES + [2, 4])
        assert all(t == filler[:len(t)] for t in timed)
    finally:
        ctx.close()
        pool.release(model)


def test_draft_fixed_verifies_draft_max_tokens_every_step_and_is_not_a_default(smol, tmp_path):
    from llamaspec.measure import BenchSettings
    from llamaspec.measure.settings import default_strategies
    assert "draft-fixed" not in default_strategies(BenchSettings(smol, smol))
    out = tmp_path / "bench.json"
    result = run("bench", "-m", smol, "-md", smol, "-t", str(THREADS), "-c", "1024", "-n", "16", "--draft-max", "3",
                 "--prompts", "json_record", "--repeat", "1", "--strategies", "plain,draft-fixed", "--json", str(out))
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(out.read_text())["rows"] if r["strategy"] == "draft-fixed")
    draft = row["sources"]["draft"]
    # 3 tokens every step (the last one: what is left of -n)
    assert 3 * (draft["steps"] - 1) < draft["drafted"] <= 3 * draft["steps"] and draft["steps"] >= 3
    assert row["output"] == "same" and row["tokens_per_call"] > 3  # the model drafting for itself, greedy
