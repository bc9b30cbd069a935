"""llamaspec agent-bench against llamaspec serve as a real process (Qwen2.5-Coder-0.5B, whose
chat template tells the model of the tools): two turns of the shipped transcript, the second
reusing the first's prompt from the server's cache."""

from __future__ import annotations

import json

import pytest

from conftest import QWEN_DRAFT, THREADS, run
from checks import Server
from llamaspec.measure.agent import Transcript


@pytest.mark.slow
@pytest.mark.parametrize("api, path", [("chat", "/v1/chat/completions"), ("messages", "/v1/messages")])
def test_two_turns_against_llamaspec_serve_reuse_the_prefix(model_file, tmp_path, api, path):
    server = Server("-m", str(model_file(QWEN_DRAFT)), "-t", str(THREADS), "-c", "4096")
    try:
        out = tmp_path / "out.json"
        result = run("agent-bench", "--url", server.url, "--api", api, "--turns", "2", "--max-tokens", "16",
                     "--json", str(out), "--timeout", "120")
    finally:
        errors = server.stop()
    assert result.exit_code == 0, result.output + errors[-2000:]
    # the client closes each stream at its [DONE]: the whole answer was sent, not a client gone
    assert errors.count(f"POST {path} 200") == 2, errors[-2000:]
    report = json.loads(out.read_text())
    first, second = report["turns"]
    assert len(report["turns"]) == 2 and [first["kind"], second["kind"]] == Transcript.load().kinds[:2]
    assert 0 < first["prompt_tokens"] < second["prompt_tokens"]
    # the second request resends the first's prompt: only the rest is read
    assert second["reused_tokens"] >= first["prompt_tokens"] - 8
    assert second["read_tokens"] == second["prompt_tokens"] - second["reused_tokens"]
    assert second["read_tokens"] <= second["new_tokens"] + 8 < second["prompt_tokens"] - 500
    for turn in (first, second):
        assert 0 < turn["output_tokens"] <= 16 and turn["max_tokens"] == 16
        assert turn["prefill_s"] > 0 and turn["server_prefill_s"] > 0
        assert turn["server_decode_tps"] > 0
        # the decode's seconds (not ms): at its speed, no more tokens than the turn wrote (and its end)
        assert 0 < turn["server_decode_s"] * turn["server_decode_tps"] <= turn["output_tokens"] + 1
        # the client's own figure, where the text came in more than one piece (a tool call comes whole)
        assert turn["decode_tps"] is None or turn["decode_tps"] > 0
    assert report["totals"]["server_decode_tps"] > 0
    assert report["totals"]["read_after_first"] == second["read_tokens"]
    assert "decode t/s" in result.stdout
