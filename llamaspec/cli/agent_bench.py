"""``llamaspec agent-bench``: a recorded coding-agent conversation replayed against a running
server (``llamaspec serve``, llama-server, or any other with OpenAI's chat completions or
Anthropic's Messages API); the work is measure.agent's, this is its command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import click

from ..measure.agent import APIS, AgentBench, Turn, run_agent_bench
from .options import check_writable, write_text


@click.command("agent-bench")
@click.option("--url", default="http://127.0.0.1:8080", show_default=True,
              help="The server's base URL (http://HOST:PORT; a trailing /v1 is allowed).")
@click.option("--api", type=click.Choice(APIS), default="chat", show_default=True,
              help="chat: POST /v1/chat/completions (OpenAI's shape, tools as functions); messages: POST "
                   "/v1/messages (Anthropic's, the transcript as it is).")
@click.option("--api-key", default=None, help="Sent as Authorization: Bearer KEY and as x-api-key: KEY.")
@click.option("--model", default="default", show_default=True, help="The request's model field.")
@click.option("--turns", type=int, default=None, help="Replay only the first N assistant turns [default: all].")
@click.option("--repeat", type=int, default=1, show_default=True,
              help="Runs of every turn, in order; the report gives each turn's medians.")
@click.option("--max-tokens", type=int, default=None,
              help="Every turn's max_tokens [default: each recorded reply's length in tokens, estimated "
                   "generously].")
@click.option("--timeout", type=float, default=600.0, show_default=True,
              help="Seconds to wait for the server at each step of a request.")
@click.option("--transcript", type=click.Path(path_type=Path), default=None,
              help="Another recorded conversation of the same shape [default: the shipped "
                   "llamaspec/data/agent_transcript.json].")
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Write the report as JSON.")
def agent_bench(url: str, api: str, api_key: Optional[str], model: str, turns: Optional[int], repeat: int,
                max_tokens: Optional[int], timeout: float, transcript: Optional[Path],
                json_file: Optional[Path]) -> None:
    """Replay a coding agent's conversation (files read, edits copying them, a summary) turn by
    turn against a server, greedy and streamed, each request holding the recorded history before
    its turn: per turn, prompt tokens read and reused from the server's cache, time to the first
    token, decode t/s, drafts accepted; then totals over edit turns and all turns."""
    check_writable(json_file)
    bench = AgentBench(url, api, api_key, model, turns, repeat, max_tokens, timeout, transcript)

    def progress(run: int, turn: Turn) -> None:
        head = f"run {run + 1}/{repeat}, " if repeat > 1 else ""
        click.echo(f"{head}turn {turn.turn} ({turn.kind}): {turn.prompt_tokens} prompt tokens, "
                   f"{turn.output_tokens} out", err=True)

    report = run_agent_bench(bench, progress)
    click.echo(report.table())
    if json_file is not None:
        write_text(json_file, json.dumps(report.to_json(), indent=1) + "\n")
