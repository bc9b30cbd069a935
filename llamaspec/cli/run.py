"""The commands that generate: ``generate`` (one prompt, or --samples of it), ``chat`` (the
terminal chat, repl.py) and ``serve`` (the OpenAI-compatible server)."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from pathlib import Path
from typing import Any, Iterator, Optional, Tuple

import click

from ..assembly import MAX_SAMPLES
from ..engine.generation import Result, make_config
from ..engine.scheduler import aggregate, check_samples
from .options import (EXTRA_ARGS, generation_options, grammar_option, load_spec, model_options, parse_sources,
                      read_prompt, utf8_option)
from .repl import Painter, colours_wanted, run_chat

COLOR_SOURCES = click.option("--color-sources", is_flag=True,
                             help="Colour the text by the source each token came from, with a legend after it "
                                  "(at a terminal only; NO_COLOR turns it off).")

@click.command(context_settings=EXTRA_ARGS)
@model_options
@click.option("-p", "--prompt", help="The prompt, raw text (special tokens are parsed).")
@click.option("-f", "--file", type=click.Path(path_type=Path), help="Read the prompt from a file.")
@click.option("--chat", "as_chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with text and stats.")
@click.option("--samples", type=click.IntRange(1, MAX_SAMPLES), default=1, show_default=True,
              help="Draw this many samples, decoded together and drafting from each other (needs --temp > 0).")
@COLOR_SOURCES
@click.pass_context
def generate(context: click.Context, prompt: Optional[str], file: Optional[Path], as_chat: bool, as_json: bool,
             samples: int, color_sources: bool, **o: Any) -> None:
    """Generate from one prompt (-p, -f or stdin), speculating with every draft source the models
    allow (--spec auto); --spec none decodes plainly. SIGINT or SIGTERM ends it early with what
    was generated (--json: the partial result, stop reason "interrupted"), exit code 130 or 143.
    With --samples N, N samples are decoded together; each is printed under a header line.
    --json gives each token's source (plain: the target's own) beside the tokens."""
    registry = parse_sources(o, context.args)
    text = read_prompt(prompt, file, o["n_ctx"])
    gen = generation_options(o)
    if not text.strip():
        raise click.UsageError("the prompt is empty")
    if samples > 1:
        check_samples(samples, make_config(**gen))  # before loading
        _generate_samples(load_spec(o, registry, default_draft=False), text, as_chat, as_json, samples, gen)
        return
    signal_code = 0
    painter = Painter(colours_wanted(color_sources and not as_json, sys.stdout))
    with load_spec(o, registry, default_draft=False) as spec, _terminate_as_interrupt():
        chunks = (spec.chat_stream([{"role": "user", "content": text}], **gen) if as_chat
                  else spec.stream(text, **gen))
        try:
            for chunk in chunks:
                if not as_json:
                    click.echo(painter.text(chunk), nl=False)
        except (KeyboardInterrupt, _Terminated) as e:
            chunks.close()
            signal_code = 143 if isinstance(e, _Terminated) else 130
        result = chunks.result
    assert result is not None
    if as_json:
        click.echo(json.dumps(_result_json(result)))
    else:
        click.echo()
        if painter.on:
            click.echo(painter.legend(result), err=True)
        click.echo(result.stats.summary(), err=True)
    for warning in result.warnings:  # the text is out; what failed after it still fails the command
        click.echo(f"error: {warning}", err=True)
    if signal_code or result.warnings:
        sys.exit(signal_code or 1)


def _generate_samples(loaded: Any, text: str, as_chat: bool, as_json: bool, n: int, gen: dict) -> None:
    signal_code = 0
    with loaded as spec, _terminate_as_interrupt():
        prompt = (spec.tokenize(spec.format_chat([{"role": "user", "content": text}]), add_special=False)
                  if as_chat else text)
        stream = spec.sample_stream(prompt, n, **gen)
        try:
            for _ in stream:
                pass
        except (KeyboardInterrupt, _Terminated) as e:  # each sample as far as it got: "interrupted"
            stream.close()
            signal_code = 143 if isinstance(e, _Terminated) else 130
        results = stream.results
    stats = aggregate(results)
    if as_json:
        click.echo(json.dumps({"samples": [{"text": r.text, "tokens": r.tokens, "stop_reason": r.stop_reason,
                                            "seed": r.stats.seed} for r in results],
                               "stats": stats.to_dict()}))
    else:
        for i, r in enumerate(results, 1):
            click.echo(f"--- sample {i}/{n} (seed {r.stats.seed}, {len(r.tokens)} tokens, {r.stop_reason}) ---")
            click.echo(r.text)
        stats.strategy += f", {n} samples"
        click.echo(stats.summary(), err=True)
    if signal_code:
        sys.exit(signal_code)


class _Terminated(Exception):
    """SIGTERM arrived."""


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises _Terminated (as Ctrl-C raises KeyboardInterrupt)."""
    def handler(signum: int, frame: Any) -> None:
        raise _Terminated()
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave SIGTERM alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _result_json(result: Result) -> dict:
    return {"text": result.text, "tokens": result.tokens, "sources": result.sources,
            "stop_reason": result.stop_reason, "stats": result.stats.to_dict()}


@click.command(context_settings=EXTRA_ARGS)
@model_options
@click.option("--system", default="", help="System message.")
@click.option("--no-stats", is_flag=True, help="Hide the one-line summary after each reply.")
@COLOR_SOURCES
@click.pass_context
def chat(context: click.Context, system: str, no_stats: bool, color_sources: bool, **o: Any) -> None:
    """Interactive chat: line editing and history, /help for the commands, Ctrl-C stops a reply,
    Ctrl-D quits. Conversations longer than the context lose their oldest turns (it says so).

    With no --model it uses the default pair from models.txt (fetched on first use).
    """
    registry = parse_sources(o, context.args)
    if context.get_parameter_source("max_tokens") == click.core.ParameterSource.DEFAULT:
        o["max_tokens"] = -1  # a reply goes on to its end (or the context's), as llama-cli's does
    gen = generation_options(o)
    system = utf8_option(system, "--system")
    with load_spec(o, registry, default_draft=True) as spec:
        spec.format_chat([{"role": "user", "content": "hi"}])  # no template: fail now, not at the first turn
        run_chat(spec, gen, system, show_stats=not no_stats,
                 painter=Painter(colours_wanted(color_sources, sys.stdout)))


@click.command(context_settings=EXTRA_ARGS)
@model_options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; think of --api-key).")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True, help="Port to listen on.")
@click.option("--api-key", default=None,
              help="Require this key (Authorization: Bearer KEY, or x-api-key: KEY) on every request but /health.")
@click.option("--cors-origin", "cors", multiple=True, metavar="ORIGIN",
              help="A web page's origin (http://localhost:3000; a comma-separated list, repeatable; *: any) "
                   "that may call the server; pages of other origins get 403.")
@click.option("--queue", type=click.IntRange(0), default=16, show_default=True,
              help="Requests that may wait while --parallel are served; more get 503 at once.")
@click.option("--parallel", "-np", type=click.IntRange(1, MAX_SAMPLES), default=1, show_default=True,
              help="Requests decoded together (each on its own KV-cache sequence of --ctx-size tokens, "
                   "drafting with every source but a draft model); 1: one at a time with every source.")
@click.pass_context
def serve(context: click.Context, host: str, port: int, api_key: Optional[str], cors: Tuple[str, ...], queue: int,
          parallel: int, **o: Any) -> None:
    """An OpenAI-compatible server (chat and text completions, streamed or not) with the same
    speculation as generate and chat. --json-schema, --json-mode, --grammar or --grammar-file
    constrain every request that asks for no format of its own. Needs: pip install
    'llamaspec[server]'."""
    from ..server import check_address, cors_origins, require_server, serve as run_server
    registry = parse_sources(o, context.args)
    require_server()  # before loading any model
    check_address(host, port)
    origins = cors_origins(cors)
    grammar = grammar_option(o)
    with load_spec(o, registry, default_draft=False) as spec:
        together = f", {parallel} requests decoded together" if parallel > 1 else ""
        click.echo(f"llamaspec serve: {spec.model_name} ({spec.spec_name}{together}) on http://{host}:{port}/v1; "
                   f"Ctrl-C stops", err=True)
        run_server(spec, host, port, queue, api_key, parallel, grammar,
                   reload=(lambda: load_spec(o, registry, default_draft=False)) if o["rpc"] else None, cors=origins)
