"""The ``llamaspec`` command: a thin shell over the library.

Flag names follow llama.cpp's programs where one exists. Every user error is one line on
stderr and a non-zero exit code.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable, List, Optional

import click

from . import models
from .api import LlamaSpec, Result, make_config
from .chat import new_messages
from .config import DraftConfig, ModelConfig
from .errors import LlamaspecError


class _OneLineErrors(click.Group):
    """Prints every error, usage errors included, as one line: ``error: ...``."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click.exceptions.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(130)
        except click.ClickException as e:
            click.echo(f"error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)
        except LlamaspecError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llamaspec")
def cli() -> None:
    """Faster local generation with llama.cpp models: speculative decoding with a draft model.

    Models are GGUF paths or names from models.txt (see `llamaspec models list`).
    """


def model_options(f: Callable) -> Callable:
    """The options every generating command shares, named as in llama.cpp."""
    options = [
        click.option("-m", "--model", help="Target model: GGUF path or models.txt name."),
        click.option("-md", "--model-draft", "--draft", "draft", help="Draft model: GGUF path or models.txt name."),
        click.option("-c", "--ctx-size", "n_ctx", type=int, default=4096, show_default=True,
                     help="Context size of each model, in tokens."),
        click.option("-t", "--threads", "n_threads", type=int, default=None,
                     help="CPU threads [default: the cores this process may use]."),
        click.option("-ngl", "--n-gpu-layers", "n_gpu_layers", type=int, default=0, show_default=True,
                     help="Target layers to offload to the GPU (-1: all; needs a Metal/CUDA build)."),
        click.option("-ngld", "--n-gpu-layers-draft", "n_gpu_layers_draft", type=int, default=0,
                     show_default=True, help="Draft layers to offload to the GPU."),
        click.option("-n", "--n-predict", "max_tokens", type=int, default=256, show_default=True,
                     help="Tokens to generate at most (-1: until a stop or a full context)."),
        click.option("--temp", "temperature", type=float, default=0.8, show_default=True,
                     help="Temperature; 0 is greedy (the output equals the target's greedy output)."),
        click.option("--top-k", type=int, default=40, show_default=True, help="Top-k (0: off)."),
        click.option("--top-p", type=float, default=0.95, show_default=True, help="Top-p in (0, 1] (1: off)."),
        click.option("--min-p", type=float, default=0.05, show_default=True, help="Min-p (0: off)."),
        click.option("--seed", type=int, default=None, help="Random seed, for reproducible sampling."),
        click.option("--stop", "stop", multiple=True, help="Stop string (repeatable); never printed."),
        click.option("--draft-max", type=int, default=16, show_default=True,
                     help="Most tokens the draft proposes per step."),
        click.option("--draft-min", type=int, default=0, show_default=True,
                     help="Shorter proposals are not verified."),
        click.option("--draft-p-min", type=float, default=0.75, show_default=True,
                     help="The draft stops when its top probability falls below this."),
        click.option("--cache-dir", type=click.Path(path_type=Path), default=None,
                     help="Model cache [default: $LLAMASPEC_CACHE or the platform cache]."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _load(o: dict, default_draft: bool) -> LlamaSpec:
    model, draft = o["model"], o["draft"]
    if model is None:
        model, pair_draft = models.default_pair()
        if default_draft and draft is None:
            draft = pair_draft
    target = ModelConfig(model, n_ctx=o["n_ctx"], n_threads=o["n_threads"], n_gpu_layers=o["n_gpu_layers"])
    draft_cfg = None
    if draft:
        draft_cfg = ModelConfig(draft, n_ctx=o["n_ctx"], n_threads=o["n_threads"],
                                n_gpu_layers=o["n_gpu_layers_draft"])
    spec_cfg = DraftConfig(o["draft_max"], o["draft_min"], o["draft_p_min"])
    return LlamaSpec(target, draft_cfg, spec_cfg, o["cache_dir"], progress=True)


def _generation_options(o: dict) -> dict:
    keys = ("max_tokens", "stop", "temperature", "top_k", "top_p", "min_p", "seed")
    opts = {k: o[k] for k in keys}
    make_config(**opts)  # validate before loading any model
    return opts


def _read_prompt(prompt: Optional[str], file: Optional[Path]) -> str:
    if prompt is not None and file is not None:
        raise click.UsageError("give the prompt with -p or -f, not both")
    if file is not None:
        try:
            return file.read_text(encoding="utf-8")
        except OSError as e:
            raise click.UsageError(f"cannot read prompt file {file}: {e.strerror}") from None
    if prompt is not None:
        return prompt
    if sys.stdin is None or sys.stdin.isatty():
        raise click.UsageError("no prompt: give -p TEXT, -f FILE or pipe it on stdin")
    return sys.stdin.read()


@cli.command()
@model_options
@click.option("-p", "--prompt", help="The prompt, raw text (special tokens are parsed).")
@click.option("-f", "--file", type=click.Path(path_type=Path), help="Read the prompt from a file.")
@click.option("--chat", "as_chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with text and stats.")
def generate(prompt: Optional[str], file: Optional[Path], as_chat: bool, as_json: bool, **o: Any) -> None:
    """Generate from one prompt (-p, -f or stdin). Without --draft it decodes plainly."""
    text = _read_prompt(prompt, file)
    gen = _generation_options(o)
    if not text.strip():
        raise click.UsageError("the prompt is empty")
    with _load(o, default_draft=False) as spec:
        chunks = (spec.chat_stream([{"role": "user", "content": text}], **gen) if as_chat
                  else spec.stream(text, **gen))
        result = None
        for chunk in chunks:
            if not as_json:
                click.echo(chunk.text, nl=False)
            result = chunk.result
    assert result is not None
    if as_json:
        click.echo(json.dumps(_result_json(result)))
    else:
        click.echo()
        click.echo(result.stats.summary(), err=True)


def _result_json(result: Result) -> dict:
    return {"text": result.text, "tokens": result.tokens, "stop_reason": result.stop_reason,
            "stats": result.stats.to_dict()}


@cli.command()
@model_options
@click.option("--system", default="", help="System message.")
@click.option("--no-stats", is_flag=True, help="Hide the one-line summary after each reply.")
def chat(system: str, no_stats: bool, **o: Any) -> None:
    """Interactive chat. Commands: /reset, /stats, /exit. Ctrl-C stops a reply.

    With no --model it uses the default pair from models.txt (fetched on first use).
    """
    gen = _generation_options(o)
    with _load(o, default_draft=True) as spec:
        spec.format_chat([{"role": "user", "content": "hi"}])  # no template: fail now, not at the first turn
        messages = new_messages(system)
        last: Optional[Result] = None
        click.echo(f"llamaspec chat: {spec.model.path.name}"
                   + (f" + draft {spec.draft_model.path.name}" if spec.draft_model else "")
                   + ". /reset, /stats, /exit; Ctrl-C stops a reply.", err=True)
        while True:
            try:
                line = input("> ")
            except (EOFError, KeyboardInterrupt):
                click.echo(err=True)
                return
            command = line.strip()
            if command in ("/exit", "/quit"):
                return
            if command == "/reset":
                messages = new_messages(system)
                spec.reset()
                click.echo("(conversation cleared)", err=True)
                continue
            if command == "/stats":
                click.echo(_stats_report(last) if last else "(no reply yet)", err=True)
                continue
            if not command:
                continue
            messages.append({"role": "user", "content": line})
            reply, last = _chat_turn(spec, messages, gen)
            messages.append({"role": "assistant", "content": reply})
            if last and not no_stats:
                click.echo(click.style(last.stats.summary(), dim=True), err=True)


def _chat_turn(spec: LlamaSpec, messages: List[dict], gen: dict) -> tuple:
    """Stream one reply; Ctrl-C ends it early and keeps what was said."""
    shown: List[str] = []
    result = None
    chunks = spec.chat_stream(messages, **gen)
    try:
        for chunk in chunks:
            click.echo(chunk.text, nl=False)
            shown.append(chunk.text)
            result = chunk.result
    except KeyboardInterrupt:
        chunks.close()
        click.echo(" [stopped]", nl=False)
    click.echo()
    return (result.text if result else "".join(shown)), result


def _stats_report(result: Result) -> str:
    s = result.stats
    lines = [s.summary(), f"stop reason: {result.stop_reason}, target calls: {s.n_target_calls}, "
             f"prompt {s.t_prompt:.2f} s, decode {s.t_decode:.2f} s (drafting {s.t_draft:.2f} s)"]
    if s.drafted_by_pos:
        by_pos = " ".join(f"{a}/{d}" for a, d in zip(s.accepted_by_pos, s.drafted_by_pos))
        lines.append(f"accepted/drafted by draft position: {by_pos}")
    return "\n".join(lines)


@cli.group("models")
def models_group() -> None:
    """The models named in models.txt: list, fetch, path."""


cache_option = click.option("--cache-dir", type=click.Path(path_type=Path), default=None,
                            help="Model cache [default: $LLAMASPEC_CACHE or the platform cache].")


@models_group.command("list")
@cache_option
def models_list(cache_dir: Optional[Path]) -> None:
    """Every known model, its size and whether it is fetched."""
    target, draft = models.default_pair()
    for name, entry in models.load_registry().items():
        path = models.model_path(name, cache_dir)
        role = " (default target)" if name == target else " (default draft)" if name == draft else ""
        state = str(path) if path else "not fetched"
        click.echo(f"{name:32} {entry.size / 2**20:8.1f} MiB  {state}{role}")


@models_group.command("fetch")
@click.argument("names", nargs=-1, required=True)
@cache_option
def models_fetch(names: List[str], cache_dir: Optional[Path]) -> None:
    """Download, verify (sha256) and cache models."""
    for name in names:
        click.echo(models.fetch(name, models.cache_dir(cache_dir)))


@models_group.command("path")
@click.argument("name")
@cache_option
def models_path(name: str, cache_dir: Optional[Path]) -> None:
    """Print the cached path of a fetched model (no download)."""
    path = models.model_path(name, cache_dir)
    if path is None:
        raise LlamaspecError(f"{name} is not fetched yet: run `llamaspec models fetch {name}`")
    click.echo(path)


def main() -> None:
    cli(prog_name="llamaspec")
