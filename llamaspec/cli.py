"""The ``llamaspec`` command: a thin shell over the library.

Flag names follow llama.cpp's programs where one exists. Every user error is one line on
stderr and a non-zero exit code.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sys
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import click

from .planning import costs
from .llama import models
from .llama.binding import Model, gpus
from .llama.pool import ModelPool
from .planning.acceptance_model import AcceptanceModel
from .measure.agreement import agreement as agreement_run, format_report
from .api import MAX_SAMPLES, LlamaSpec
from .measure import (PROGRAMS, STRATEGIES, SUITES, BenchSettings, SuitePrompt, format_columns, load_suite, matched,
                    require_matplotlib, run_bench, run_compare, write_plot)
from .config import (MAX_TEXT_BYTES, DraftConfig, GenerationConfig, LookaheadConfig, LookupConfig, ModelConfig,
                     SamplingConfig, SpecConfig, check_readable, default_threads, prompt_bytes)
from .planning.costs import CostCurve, CostModel, cached_curve
from .errors import ConfigError, LlamaspecError, LlamaspecWarning
from .constraints import Grammar
from .engine.generation import Result, make_config
from .sources.registry import Loaded, TextContext
from .sources import default_registry
from .sources.ngram_cache import NGRAM_STATIC, NgramCache, NgramCaches
from .planning.planner import Planner
from .repl import run_chat
from .measure.replay import copy_oracle, replay
from .engine.scheduler import aggregate, check_samples
from .measure.samples import run_samples, table as samples_table
from .planning.speculator import Speculator


class _OneLineErrors(click.Group):
    """Prints every error, usage errors included, as one line: ``error: ...``."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        warnings.simplefilter("default", LlamaspecWarning)
        warnings.showwarning = _show_warning
        try:
            code = super().main(*args, **kwargs)
        except click.exceptions.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(130)
        except click.ClickException as e:
            click.echo(f"error: {_one_line(e.format_message())}", err=True)
            sys.exit(e.exit_code)
        except LlamaspecError as e:
            click.echo(f"error: {_one_line(str(e))}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)


def _one_line(message: str) -> str:
    """A message on one line whatever it quotes (a file name with a newline in it)."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def _show_warning(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
    click.echo(f"warning: {_one_line(str(message))}", err=True)


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llamaspec")
def cli() -> None:
    """Faster local generation with llama.cpp models: speculative decoding with a draft model,
    lookup decoding and lookahead decoding.

    Models are GGUF paths or names from models.txt (see `llamaspec models list`).
    """


# The options of every generating command, named as in llama.cpp, by parameter name. Defaults
# come from the config dataclasses (one definition each).
_SAMPLING, _DRAFT, _LOOKUP, _LOOKAHEAD = SamplingConfig(), DraftConfig(), LookupConfig(), LookaheadConfig()
MODEL_OPTIONS = {
    "model": click.option("-m", "--model", help="Target model: GGUF path or models.txt name."),
    "draft": click.option("-md", "--model-draft", "--draft", "draft",
                          help="Draft model: GGUF path or models.txt name."),
    "n_ctx": click.option("-c", "--ctx-size", "n_ctx", type=int, default=ModelConfig.n_ctx, show_default=True,
                          help="Context size of each model, in tokens."),
    "n_threads": click.option("-t", "--threads", "n_threads", type=int, default=None,
                              help="CPU threads [default: the cores this process may use]."),
    "n_gpu_layers": click.option("-ngl", "--n-gpu-layers", "n_gpu_layers", type=int, default=ModelConfig.n_gpu_layers,
                                 show_default=True,
                                 help="Target layers to offload to the GPU (-1: all; needs a Metal/CUDA build)."),
    "n_gpu_layers_draft": click.option("-ngld", "--n-gpu-layers-draft", "n_gpu_layers_draft", type=int,
                                       default=ModelConfig.n_gpu_layers, show_default=True,
                                       help="Draft layers to offload to the GPU."),
    "max_tokens": click.option("-n", "--n-predict", "max_tokens", type=int, default=GenerationConfig.max_tokens,
                               show_default=True, help="Tokens to generate at most (-1: until a stop or a full context)."),
    "temperature": click.option("--temp", "temperature", type=float, default=_SAMPLING.temperature, show_default=True,
                                help="Temperature; 0 is greedy (the output equals the target's greedy output)."),
    "top_k": click.option("--top-k", type=int, default=_SAMPLING.top_k, show_default=True, help="Top-k (0: off)."),
    "top_p": click.option("--top-p", type=float, default=_SAMPLING.top_p, show_default=True,
                          help="Top-p in (0, 1] (1: off)."),
    "min_p": click.option("--min-p", type=float, default=_SAMPLING.min_p, show_default=True, help="Min-p (0: off)."),
    "typical_p": click.option("--typical", "--typical-p", "typical_p", type=float, default=_SAMPLING.typical_p,
                              show_default=True, help="Locally typical sampling, p (1: off)."),
    "seed": click.option("--seed", type=int, default=None,
                         help="Random seed, for reproducible sampling (-1 or none: a random one, reported)."),
    "stop": click.option("--stop", "stop", multiple=True, help="Stop string (repeatable); never printed."),
    "repeat_penalty": click.option("--repeat-penalty", type=float, default=_SAMPLING.repeat_penalty, show_default=True,
                                   help="Penalize tokens seen in the last --repeat-last-n tokens (1: off)."),
    "penalty_last_n": click.option("--repeat-last-n", "penalty_last_n", type=int, default=_SAMPLING.penalty_last_n,
                                   show_default=True, help="Tokens the penalties look back on (0: off, -1: all)."),
    "presence_penalty": click.option("--presence-penalty", type=float, default=_SAMPLING.presence_penalty,
                                     show_default=True, help="Lower the logit of every token seen (0: off)."),
    "frequency_penalty": click.option("--frequency-penalty", type=float, default=_SAMPLING.frequency_penalty,
                                      show_default=True, help="Lower a token's logit by this per time seen (0: off)."),
    "mirostat": click.option("--mirostat", type=click.IntRange(0, 2), default=_SAMPLING.mirostat, show_default=True,
                             help="Mirostat sampling, after the temperature, instead of top-k/p, min-p, typical "
                                  "(0: off, 1: mirostat, 2: mirostat 2.0)."),
    "mirostat_eta": click.option("--mirostat-lr", "mirostat_eta", type=float, default=_SAMPLING.mirostat_eta,
                                 show_default=True, help="Mirostat's learning rate, eta."),
    "mirostat_tau": click.option("--mirostat-ent", "mirostat_tau", type=float, default=_SAMPLING.mirostat_tau,
                                 show_default=True, help="Mirostat's target entropy (bits a token), tau."),
    "logit_bias": click.option("-l", "--logit-bias", "logit_bias", multiple=True,
                               help="TOKEN_ID(+/-)BIAS added to a token's logit, e.g. 15043+1 or 15043-inf "
                                    "(repeatable)."),
    "json_schema": click.option("-j", "--json-schema", default=None,
                                help="The text is JSON valid under this JSON schema (its text, or a file holding it)."),
    "json_mode": click.option("--json-mode", is_flag=True, help="The text is a JSON object."),
    "grammar": click.option("--grammar", default=None, help="The text follows this GBNF grammar (llama.cpp's)."),
    "grammar_file": click.option("--grammar-file", type=click.Path(path_type=Path), default=None,
                                 help="The text follows the GBNF grammar in this file."),
    "spec": click.option("--spec", default=None,
                         help="Draft sources: auto (every one the models and files allow), none (plain decoding) "
                              f"or a list of {', '.join(default_registry().names)}  [default: auto]."),
    "draft_max": click.option("--draft-max", type=int, default=_DRAFT.draft_max, show_default=True,
                              help="Most tokens the draft model proposes per step."),
    "draft_min": click.option("--draft-min", type=int, default=_DRAFT.draft_min, show_default=True,
                              help="Shorter draft-model proposals are not verified."),
    "draft_p_min": click.option("--draft-p-min", type=float, default=_DRAFT.draft_p_min, show_default=True,
                                help="The draft model also stops when its top probability falls below this "
                                     "(llama.cpp: 0.75; 0 leaves it to the planner)."),
    "lookup": click.option("--lookup", is_flag=True,
                           help="Shorthand: only lookup (prompt, output, references, caches), plus the draft model "
                                "when -md is given."),
    "lookup_ngram_min": click.option("--lookup-ngram-min", type=int, default=_LOOKUP.ngram_min, show_default=True,
                                     help="Shortest n-gram lookup matches."),
    "lookup_ngram_max": click.option("--lookup-ngram-max", type=int, default=_LOOKUP.ngram_max, show_default=True,
                                     help="Longest n-gram lookup matches (at most 4)."),
    "lookup_cache_static": click.option("--lookup-cache-static", type=click.Path(path_type=Path), default=None,
                                        help="Static n-gram cache (llama-lookup-create / `llamaspec lookup create`)."),
    "lookup_cache_dynamic": click.option("--lookup-cache-dynamic", type=click.Path(path_type=Path), default=None,
                                         help="Dynamic n-gram cache, updated after every generation "
                                              "(created if missing)."),
    "references": click.option("--reference", "references", multiple=True, type=click.Path(path_type=Path),
                               help="A document lookup and lookahead may copy from (repeatable)."),
    "lookahead": click.option("--lookahead", is_flag=True,
                              help="Shorthand: only lookahead (Jacobi window and n-gram pool), plus the draft model "
                                   "when -md is given."),
    "lookahead_w": click.option("--lookahead-w", type=int, default=_LOOKAHEAD.w, show_default=True,
                                help="Lookahead window: columns of Jacobi guesses (llama-lookahead: 15)."),
    "lookahead_n": click.option("--lookahead-n", type=int, default=_LOOKAHEAD.n, show_default=True,
                                help="Lookahead n-gram size; the window has N - 1 levels (llama-lookahead: 5)."),
    "lookahead_g": click.option("--lookahead-g", type=int, default=_LOOKAHEAD.g, show_default=True,
                                help="Most pool candidates per step (llama-lookahead: 15)."),
    "spec_fixed": click.option("--spec-fixed", default=None,
                               help="Sources verified whole every step, as llama.cpp's programs do (e.g. draft: "
                                    "draft-max tokens each step); the others only as far as the planner finds "
                                    "it pays."),
    "lookahead_fixed": click.option("--lookahead-fixed", is_flag=True,
                                    help="Shorthand for --spec-fixed lookahead: all G candidates and the whole "
                                         "window every step, as llama-lookahead does."),
    "cache_dir": click.option("--cache-dir", type=click.Path(path_type=Path), default=None,
                              help="Model cache [default: $LLAMASPEC_CACHE or the platform cache]."),
    "rpc": click.option("--rpc", "rpc", default=None, metavar="HOST:PORT,...",
                        help="llama.cpp RPC servers (rpc-server) that hold the target's layers (all unless -ngl "
                             "says how many). Unauthenticated, unencrypted: trusted networks only."),
    "rpc_draft": click.option("--rpc-draft", is_flag=True, help="Place the draft model on the --rpc servers too."),
    "tensor_split": click.option("-ts", "--tensor-split", "tensor_split", default=None, metavar="SHARES",
                                 help="Each device's share of the offloaded layers, the RPC servers first, "
                                      "e.g. 3,1."),
    "rpc_timeout": click.option("--rpc-timeout", type=float, default=ModelConfig.rpc_timeout, show_default=True,
                                help="Seconds one decode on the RPC servers may take before they count as gone."),
}


def model_options(f: Callable) -> Callable:
    """The options every generating command shares, named as in llama.cpp."""
    return some_model_options(*MODEL_OPTIONS)(f)


def some_model_options(*names: str) -> Callable[[Callable], Callable]:
    """The options of MODEL_OPTIONS named, in that order."""
    def apply(f: Callable) -> Callable:
        for name in reversed(names):
            f = MODEL_OPTIONS[name](f)
        return f
    return apply


def _spec_option(o: dict, draft: bool) -> SpecConfig:
    """--spec, or the --lookup / --lookahead shorthands; --spec-fixed and --lookahead-fixed."""
    chosen = [name for name in ("lookup", "lookahead") if o[name]]
    if chosen and o["spec"] is not None:
        raise click.UsageError("give --spec or --lookup/--lookahead, not both")
    spec = SpecConfig(frozenset(chosen + (["draft"] if draft else []))) if chosen else SpecConfig.parse(o["spec"] or "auto")
    fixed = set(_names(o["spec_fixed"]) or []) | ({"lookahead"} if o["lookahead_fixed"] else set())
    return spec.with_fixed(frozenset(fixed))


def _load(o: dict, default_draft: bool) -> LlamaSpec:
    model, draft = o["model"], o["draft"]
    if model is None:
        model, pair_draft = models.default_pair()
        if default_draft and draft is None:
            draft = pair_draft
    placed = _placement(o)
    target = ModelConfig(model, n_ctx=o["n_ctx"], n_threads=o["n_threads"], n_gpu_layers=o["n_gpu_layers"], **placed)
    draft_cfg = None
    if draft:
        draft_cfg = ModelConfig(draft, n_ctx=o["n_ctx"], n_threads=o["n_threads"],
                                n_gpu_layers=o["n_gpu_layers_draft"], **(placed if o["rpc_draft"] else {}))
    spec = _spec_option(o, draft_cfg is not None)
    lookahead = LookaheadConfig(o["lookahead_w"], o["lookahead_n"], o["lookahead_g"])
    lookup = LookupConfig(ngram_min=o["lookup_ngram_min"], ngram_max=o["lookup_ngram_max"],
                          cache_static=_str(o["lookup_cache_static"]), cache_dynamic=_str(o["lookup_cache_dynamic"]))
    references = [_read(path, "reference ") for path in o["references"]]
    return LlamaSpec(target, draft_cfg, DraftConfig(o["draft_max"], o["draft_min"], o["draft_p_min"]), o["cache_dir"],
                     progress=True, lookup=lookup, references=references, lookahead=lookahead, spec=spec)


def _placement(o: dict) -> dict:
    """Where --rpc, --tensor-split and --rpc-timeout place a model (ModelConfig's fields)."""
    shares = []
    for share in _names(o.get("tensor_split")) or []:
        try:
            shares.append(float(share))
        except ValueError:
            raise click.UsageError(f"--tensor-split takes numbers separated by commas, got {o['tensor_split']!r}")
    servers = tuple(_names(o.get("rpc")) or ())
    if o.get("rpc_draft") and not servers:
        raise click.UsageError("--rpc-draft places the draft model on the --rpc servers: give --rpc")
    return dict(rpc=servers, tensor_split=tuple(shares), rpc_timeout=o.get("rpc_timeout", ModelConfig.rpc_timeout))


def _str(path: Optional[Path]) -> Optional[str]:
    return None if path is None else str(path)


def _generation_options(o: dict) -> dict:
    keys = ("max_tokens", "stop", "temperature", "top_k", "top_p", "min_p", "typical_p", "seed", "repeat_penalty",
            "penalty_last_n", "presence_penalty", "frequency_penalty", "mirostat", "mirostat_eta", "mirostat_tau")
    opts = {k: o[k] for k in keys}
    opts["stop"] = tuple(_utf8_option(s, "a --stop string") for s in opts["stop"])
    opts["logit_bias"] = [_logit_bias(text) for text in o["logit_bias"]]
    opts["grammar"] = _grammar_option(o)
    make_config(**opts)  # validate before loading any model
    return opts


def _logit_bias(text: str) -> Tuple[int, float]:
    """llama.cpp's --logit-bias: TOKEN_ID followed by a signed bias (15043+1, 15043-inf)."""
    match = re.fullmatch(r"\s*(\d+)\s*([-+]\s*(?:inf|[0-9.eE+-]+))\s*", text)
    try:
        if match is None:
            raise ValueError
        return int(match.group(1)), float(match.group(2).replace(" ", ""))
    except ValueError:
        raise click.UsageError(f"--logit-bias takes TOKEN_ID(+/-)BIAS, such as 15043+1 or 15043-inf; got {text!r}")


def _grammar_option(o: dict) -> Optional[Grammar]:
    """--json-schema, --json-mode, --grammar or --grammar-file (at most one), checked now: compiled
    on its own, before any model loads."""
    given = [name for name in ("json_schema", "json_mode", "grammar", "grammar_file") if o[name]]
    if len(given) > 1:
        raise click.UsageError(f"give one of --json-schema, --json-mode, --grammar and --grammar-file, not "
                               f"{' and '.join('--' + g.replace('_', '-') for g in given)}")
    if o["json_schema"]:
        text = o["json_schema"]
        if not _inline_json(text):  # a file holding the schema
            text = _read(Path(text), "JSON schema file ")
        return Grammar.json_schema(text, "--json-schema").check()
    if o["json_mode"]:
        return Grammar.json()
    if o["grammar"]:
        return Grammar.gbnf(_utf8_option(o["grammar"], "--grammar"), "--grammar").check()
    if o["grammar_file"]:
        return Grammar.gbnf(_read(o["grammar_file"], "grammar file "), "--grammar-file").check()
    return None


def _inline_json(text: str) -> bool:
    """Whether --json-schema's value is JSON itself (of any type, or an object or list that does
    not parse: its error says why) rather than a file's name."""
    if text.lstrip()[:1] in ("{", "["):
        return True
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def _read_prompt(prompt: Optional[str], file: Optional[Path], n_ctx: int) -> str:
    """The prompt of -p, -f or stdin; a file or stdin longer than a context of ``n_ctx`` tokens
    could hold is refused before it is read (stdin: after that many bytes)."""
    if prompt is not None and file is not None:
        raise click.UsageError("give the prompt with -p or -f, not both")
    limit = prompt_bytes(n_ctx)
    if file is not None:
        return _read(file, "prompt file ", limit)
    if prompt is not None:
        return _utf8_option(prompt, "the prompt (-p)")
    if sys.stdin is None or sys.stdin.isatty():
        raise click.UsageError("no prompt: give -p TEXT, -f FILE or pipe it on stdin")
    if hasattr(sys.stdin, "buffer"):
        data = sys.stdin.buffer.read(limit + 1)
    else:
        data = sys.stdin.read(limit + 1).encode("utf-8", "surrogateescape")
    if len(data) > limit:
        raise click.UsageError(f"the prompt on stdin is longer than {limit:,} bytes, more than a context of "
                               f"{n_ctx} tokens can hold (-c)")
    return _decode(data, "stdin")


def _utf8_option(value: str, what: str) -> str:
    """A command-line value, unless its bytes were not UTF-8 (Python keeps them as surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise click.UsageError(f"{what} is not valid UTF-8 text") from None
    return value


def _decode(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise click.UsageError(f"{what} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


@cli.command()
@model_options
@click.option("-p", "--prompt", help="The prompt, raw text (special tokens are parsed).")
@click.option("-f", "--file", type=click.Path(path_type=Path), help="Read the prompt from a file.")
@click.option("--chat", "as_chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with text and stats.")
@click.option("--samples", type=click.IntRange(1, MAX_SAMPLES), default=1, show_default=True,
              help="Draw this many samples, decoded together and drafting from each other (needs --temp > 0).")
def generate(prompt: Optional[str], file: Optional[Path], as_chat: bool, as_json: bool, samples: int,
             **o: Any) -> None:
    """Generate from one prompt (-p, -f or stdin), speculating with every draft source the models
    allow (--spec auto); --spec none decodes plainly. SIGINT or SIGTERM ends it early with what
    was generated (--json: the partial result, stop reason "interrupted"), exit code 130 or 143.
    With --samples N, N samples are decoded together; each is printed under a header line."""
    text = _read_prompt(prompt, file, o["n_ctx"])
    gen = _generation_options(o)
    if not text.strip():
        raise click.UsageError("the prompt is empty")
    if samples > 1:
        check_samples(samples, make_config(**gen))  # before loading
        _generate_samples(o, text, as_chat, as_json, samples, gen)
        return
    signal_code = 0
    with _load(o, default_draft=False) as spec, _terminate_as_interrupt():
        chunks = (spec.chat_stream([{"role": "user", "content": text}], **gen) if as_chat
                  else spec.stream(text, **gen))
        try:
            for chunk in chunks:
                if not as_json:
                    click.echo(chunk.text, nl=False)
        except (KeyboardInterrupt, _Terminated) as e:
            chunks.close()
            signal_code = 143 if isinstance(e, _Terminated) else 130
        result = chunks.result
    assert result is not None
    if as_json:
        click.echo(json.dumps(_result_json(result)))
    else:
        click.echo()
        click.echo(result.stats.summary(), err=True)
    for warning in result.warnings:  # the text is out; what failed after it still fails the command
        click.echo(f"error: {warning}", err=True)
    if signal_code or result.warnings:
        sys.exit(signal_code or 1)


def _generate_samples(o: dict, text: str, as_chat: bool, as_json: bool, n: int, gen: dict) -> None:
    signal_code = 0
    with _load(o, default_draft=False) as spec, _terminate_as_interrupt():
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
    return {"text": result.text, "tokens": result.tokens, "stop_reason": result.stop_reason,
            "stats": result.stats.to_dict()}


@cli.command()
@model_options
@click.option("--system", default="", help="System message.")
@click.option("--no-stats", is_flag=True, help="Hide the one-line summary after each reply.")
def chat(system: str, no_stats: bool, **o: Any) -> None:
    """Interactive chat: line editing and history, /help for the commands, Ctrl-C stops a reply,
    Ctrl-D quits. Conversations longer than the context lose their oldest turns (it says so).

    With no --model it uses the default pair from models.txt (fetched on first use).
    """
    if click.get_current_context().get_parameter_source("max_tokens") == click.core.ParameterSource.DEFAULT:
        o["max_tokens"] = -1  # a reply goes on to its end (or the context's), as llama-cli's does
    gen = _generation_options(o)
    system = _utf8_option(system, "--system")
    with _load(o, default_draft=True) as spec:
        spec.format_chat([{"role": "user", "content": "hi"}])  # no template: fail now, not at the first turn
        run_chat(spec, gen, system, show_stats=not no_stats)


@cli.command()
@model_options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; think of --api-key).")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True, help="Port to listen on.")
@click.option("--api-key", default=None, help="Require this key (Authorization: Bearer KEY) on every /v1 request.")
@click.option("--queue", type=click.IntRange(0), default=16, show_default=True,
              help="Requests that may wait while --parallel are served; more get 503 at once.")
@click.option("--parallel", "-np", type=click.IntRange(1, MAX_SAMPLES), default=1, show_default=True,
              help="Requests decoded together (each on its own KV-cache sequence of --ctx-size tokens, "
                   "drafting with every source but a draft model); 1: one at a time with every source.")
def serve(host: str, port: int, api_key: Optional[str], queue: int, parallel: int, **o: Any) -> None:
    """An OpenAI-compatible server (chat and text completions, streamed or not) with the same
    speculation as generate and chat. --json-schema, --json-mode, --grammar or --grammar-file
    constrain every request that asks for no format of its own. Needs: pip install
    'llamaspec[server]'."""
    from .server import check_address, require_server, serve as run_server
    require_server()  # before loading any model
    check_address(host, port)
    grammar = _grammar_option(o)
    with _load(o, default_draft=False) as spec:
        together = f", {parallel} requests decoded together" if parallel > 1 else ""
        click.echo(f"llamaspec serve: {spec.model_name} ({spec.spec_name}{together}) on http://{host}:{port}/v1; "
                   f"Ctrl-C stops", err=True)
        run_server(spec, host, port, queue, api_key, parallel, grammar,
                   reload=(lambda: _load(o, default_draft=False)) if o["rpc"] else None)


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


@cli.group("lookup")
def lookup_group() -> None:
    """N-gram caches for lookup decoding: create, stats."""


@lookup_group.command("create")
@click.option("-m", "--model", required=True, help="Model whose tokenizer the cache is for.")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Cache file to write.")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@cache_option
def lookup_create(model: str, output: Path, files: List[Path], cache_dir: Optional[Path]) -> None:
    """Build a static n-gram cache from text FILES (llama-lookup-create's format and 2-grams).

    Each file is tokenized as llama-lookup-create tokenizes its -f file (one trailing newline
    dropped, BOS added, special tokens parsed), so one file gives the same cache as it does.
    """
    vocab = Model(models.resolve_model(model, cache_dir), vocab_only=True)
    cache = NgramCache()
    for f in files:
        text = _read(f)
        tokens = vocab.tokenize(text[:-1] if text.endswith("\n") else text, add_special=True, parse_special=True)
        cache.update(tokens, NGRAM_STATIC, NGRAM_STATIC, len(tokens))
    cache.save(output)
    click.echo(f"{output}: {len(cache)} n-grams from {len(files)} file(s)", err=True)


@lookup_group.command("stats")
@click.option("-m", "--model", required=True, help="Model whose tokenizer to use (it does not run).")
@click.option("-f", "--file", "text_file", type=click.Path(path_type=Path), required=True,
              help="Text to replay, as if the model had generated it.")
@click.option("--prompt", "prompt_file", type=click.Path(path_type=Path), default=None,
              help="Prompt the text followed [default: none, the replay starts at the first token].")
@click.option("--lookup-ngram-min", type=int, default=_LOOKUP.ngram_min, show_default=True)
@click.option("--lookup-ngram-max", type=int, default=_LOOKUP.ngram_max, show_default=True)
@click.option("--draft-max", type=int, default=_LOOKUP.draft_max, show_default=True)
@click.option("--lookup-cache-static", type=click.Path(path_type=Path), default=None)
@click.option("--lookup-cache-dynamic", type=click.Path(path_type=Path), default=None)
@click.option("--reference", "references", multiple=True, type=click.Path(path_type=Path))
@click.option("-t", "--threads", "n_threads", type=int, default=None,
              help="Threads of the cost curve to use [default: all cores].")
@cache_option
def lookup_stats(model: str, text_file: Path, prompt_file: Optional[Path], lookup_ngram_min: int,
                 lookup_ngram_max: int, draft_max: int, lookup_cache_static: Optional[Path],
                 lookup_cache_dynamic: Optional[Path], references: List[Path], n_threads: Optional[int],
                 cache_dir: Optional[Path]) -> None:
    """Replay a text through lookup and the planner without running the model: how much would be
    verified and accepted (llama-lookup-stats), the speed-up the cached cost curve predicts, and
    the copy-oracle bound (what verifying every copyable run at the measured cost would give)."""
    cfg = LookupConfig(lookup_ngram_min, lookup_ngram_max, draft_max, _str(lookup_cache_static),
                       _str(lookup_cache_dynamic))
    path = models.resolve_model(model, cache_dir)
    vocab = Model(path, vocab_only=True)
    prompt = vocab.tokenize(_read(prompt_file), add_special=True) if prompt_file else []
    text = vocab.tokenize(_read(text_file), add_special=not prompt, parse_special=False)
    if len(prompt) + len(text) < 2:
        raise click.UsageError("the text is too short to replay")
    if not prompt:
        prompt, text = text[:1], text[1:]
    refs = [vocab.tokenize(_read(r), add_special=False, parse_special=False) for r in references]
    measured = cached_curve(path, n_threads or default_threads(), models.cache_dir(cache_dir) / "costs.json")
    curve = measured or CostCurve.flat()
    caches = None
    if lookup_cache_static or lookup_cache_dynamic:
        caches = NgramCaches.open(cfg)
        caches.validate_vocab(vocab.n_vocab)
    registry = default_registry()
    loaded = Loaded(vocab.piece, cfg, caches=caches)
    names = registry.resolve(SpecConfig(frozenset({"lookup"})), loaded.meets())  # the cache source joins lookup
    sources = registry.build(names, loaded, TextContext(references=tuple(tuple(r) for r in refs)))
    stats = replay(prompt, text, Speculator(sources, AcceptanceModel(), Planner(CostModel(curve)), vocab.eog_tokens))
    click.echo(f"n_predict    = {stats.n_tokens}")
    click.echo(f"n_drafted    = {stats.n_drafted}")
    click.echo(f"n_accept     = {stats.n_accept}")
    click.echo(f"accept       = {stats.accept:.3f}%")
    click.echo(f"target calls = {stats.n_steps} ({stats.n_tokens / max(stats.n_steps, 1):.2f} tokens per call)")
    if measured:
        bound = copy_oracle(prompt, text, curve.cost, curve.switch)
        click.echo(f"predicted    = {stats.speedup:.2f}x plain decoding with the measured cost curve "
                   f"({curve.threads} threads, {curve.backend}: {curve_summary(curve)})")
        click.echo(f"copy oracle  = {bound:.2f}x ({100 * stats.speedup / bound:.0f}% of it reached)")
    else:
        click.echo("predicted    = no cost curve cached for this model and thread count; "
                   "run `llamaspec profile` once to measure it (the replay assumed a GPU-like flat curve)")


def curve_summary(curve: CostCurve, sizes: Sequence[int] = (1, 2, 4, 8, 12, 16, 24, 32)) -> str:
    switch = f"; a decode of another row count than the last: +{curve.switch:.2f}" if curve.switch else ""
    return " ".join(f"{n}:{curve.cost(n):.2f}" for n in sizes) + switch


# --- bench, profile, compare ----------------------------------------------------------------
_RUN_OPTIONS = ("model", "draft", "n_ctx", "n_threads", "n_gpu_layers", "n_gpu_layers_draft", "max_tokens",
                "draft_max", "draft_min", "draft_p_min", "rpc", "rpc_draft", "tensor_split", "rpc_timeout")


def _bench_settings(o: dict, repeat: int, temperature: float = 0.0, seed: Optional[int] = None) -> BenchSettings:
    """The shared options as BenchSettings; with no --model, the default pair."""
    model, draft = o["model"], o["draft"]
    if model is None:
        model, pair_draft = models.default_pair()
        draft = draft or pair_draft
    return BenchSettings(model, draft, n_predict=o["max_tokens"], n_ctx=o["n_ctx"], n_threads=o["n_threads"],
                         n_gpu_layers=o["n_gpu_layers"], n_gpu_layers_draft=o["n_gpu_layers_draft"],
                         draft_max=o["draft_max"], draft_min=o["draft_min"], draft_p_min=o["draft_p_min"],
                         temperature=temperature, seed=seed, repeat=repeat, rpc_draft=o["rpc_draft"], **_placement(o))


def _names(value: Optional[str]) -> Optional[List[str]]:
    return [v.strip() for v in value.split(",") if v.strip()] if value is not None else None


def _check_writable(*paths: Optional[Path]) -> None:
    """Fail before a long run, not after it, when an output file cannot be created."""
    for path in paths:
        if path is not None and not path.parent.is_dir():
            raise click.UsageError(f"cannot write {path}: no directory {path.parent}")


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise click.UsageError(f"cannot write {path}: {e.strerror}") from None


@cli.command("bench")
@some_model_options(*_RUN_OPTIONS, "seed", "cache_dir")
@click.option("--temp", "temperature", type=float, default=0.0, show_default=True,
              help="Temperature; at 0 (greedy) every strategy's output is checked against plain's.")
@click.option("--strategies", help=f"Comma-separated, from: {', '.join(STRATEGIES)} "
                                   "[default: plain and every strategy the models allow].")
@click.option("--suite", "suite_name", type=click.Choice(sorted(SUITES)), default="default", show_default=True,
              help="The shipped suite: default (llamaspec/data/bench_suite.json) or structured (answers that "
                   "follow a JSON schema: llamaspec/data/structured_suite.json).")
@click.option("--prompts", help="Comma-separated names of prompts of the shipped suite (llamaspec/data/"
                               "bench_suite.json) [default: all; none when -f is given].")
@click.option("-f", "--file", "files", multiple=True, type=click.Path(path_type=Path),
              help="A file whose text is one more prompt, a user message in the chat template (repeatable).")
@click.option("--repeat", type=int, default=3, show_default=True, help="Runs of each strategy on each prompt.")
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Write the report as JSON.")
@click.option("--plot", "plot_file", type=click.Path(path_type=Path),
              help="Write a bar chart of the speed-ups as PNG (needs matplotlib: pip install 'llamaspec[plot]').")
@click.option("--samples", type=click.IntRange(1, MAX_SAMPLES), default=1, show_default=True,
              help="Instead: N samples of each prompt decoded together against N separate runs (needs --temp > 0; "
                   "default prompts json_record, code_edit).")
def bench_command(temperature: float, strategies: Optional[str], suite_name: str, prompts: Optional[str],
                  files: List[Path],
                  repeat: int, json_file: Optional[Path], plot_file: Optional[Path], samples: int, **o: Any) -> None:
    """Plain decoding and each strategy on a prompt suite, same models and settings, one process:
    decode t/s (median, min, max), speed-up over plain, acceptance, tokens per target call,
    prompt t/s, peak memory, and whether the greedy output equals plain's."""
    if plot_file is not None:
        require_matplotlib()
    _check_writable(json_file, plot_file)
    settings = _bench_settings(o, repeat, temperature, o["seed"])
    if samples > 1:
        chosen = load_suite(_names(prompts), SUITES[suite_name]) if prompts is not None else None
        rows = run_samples(settings, samples, chosen, o["cache_dir"])
        click.echo(samples_table(rows))
        if json_file is not None:
            _write(json_file, json.dumps([asdict(r) for r in rows], indent=1) + "\n")
        return
    suite = load_suite(_names(prompts), SUITES[suite_name]) if prompts is not None or not files else []
    suite += [SuitePrompt(f.stem, f"user message from {f}", _read(f, "prompt file ")) for f in files]
    report = run_bench(settings, _names(strategies), suite, o["cache_dir"])
    click.echo(report.table())
    if json_file is not None:
        _write(json_file, json.dumps(asdict(report), indent=1) + "\n")
    if plot_file is not None:
        write_plot(report, plot_file)


@cli.command("profile")
@some_model_options("model", "n_threads", "n_gpu_layers", "rpc", "tensor_split", "rpc_timeout", "cache_dir")
@click.option("--repeats", type=int, default=2, show_default=True,
              help="Measurements of each size; the fastest counts.")
def profile_command(model: Optional[str], n_threads: Optional[int], n_gpu_layers: int, cache_dir: Optional[Path],
                    repeats: int, **o: Any) -> None:
    """Measure what one decode of n tokens costs, n = 1..32, on this machine (or on the RPC servers
    given), and cache the curve that the planner sizes drafts with."""
    config = ModelConfig(model or models.default_pair()[0], n_threads=n_threads, n_gpu_layers=n_gpu_layers,
                         **_placement(o))
    path = models.resolve_model(config.path, cache_dir)
    cache_file = models.cache_dir(cache_dir) / "costs.json"
    pool = ModelPool()
    loaded = pool.get(path, config.offloaded, config.rpc, config.tensor_split, config.rpc_timeout)
    try:
        curve = costs.profile(loaded, config.threads, config.n_ctx, repeats, cache_file)
    finally:
        pool.release(loaded)
    deep = curve.deep_context if curve.deep is not None else 0
    on = "".join(f", {d.name}: {d.description}" for d in gpus()) if curve.backend != "cpu" else ""
    click.echo(f"{path.name}: threads {curve.threads}, backend {curve.backend}{on}, fastest of {repeats}, "
               f"{curve.context} tokens in the KV cache" + (f" (and {deep}: the last two columns)" if deep else ""))
    cells = [("n", "ms per call", "relative cost", "tokens/s") + (("ms", "relative") if deep else ())]
    cells += [(str(n), f"{curve.ms(n):.2f}", f"{curve.cost(n):.2f}", f"{1000 * n / curve.ms(n):.1f}")
              + ((f"{curve.ms(n, deep):.2f}", f"{curve.cost(n, deep):.2f}") if deep else ())
              for n in range(1, len(curve.relative) + 1)]
    click.echo("\n".join(format_columns(cells)))
    click.echo(f"cached in {cache_file}: generation with threads {curve.threads} on {curve.backend} uses it", err=True)


@cli.command("agreement")
@some_model_options("model", "n_ctx", "n_threads", "n_gpu_layers")
@click.option("-md", "--candidate", "candidates", multiple=True, required=True,
              help="A model to measure against -m (repeatable): a quantization of it, or a draft model.")
@click.option("-f", "--file", "files", multiple=True, type=click.Path(path_type=Path),
              help="Text to read (repeatable) [default: the bench suite's prompts and -m's greedy answers].")
@click.option("-n", "--n-predict", "n_tokens", type=click.IntRange(1), default=128, show_default=True,
              help="Tokens of each greedy answer (without -f).")
@some_model_options("temperature", "top_k", "top_p", "min_p", "cache_dir")
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Write the report as JSON.")
@click.option("--min-agreement", type=click.FloatRange(0, 1), default=None,
              help="Exit non-zero when a candidate's top-1 agreement is below this.")
def agreement_command(model: Optional[str], candidates: Tuple[str, ...], files: Tuple[Path, ...], n_tokens: int,
                      json_file: Optional[Path], min_agreement: Optional[float], **o: Any) -> None:
    """How closely each candidate follows the reference model -m: top-1 agreement (the greedy
    acceptance rate), the expected acceptance of speculative sampling at --temp, KL divergence,
    perplexity, and the speed-up drafting with it would give on this machine. Checks a
    quantization (a damaged one agrees far less) and tells whether a draft model pays."""
    _check_writable(json_file)
    texts = [_read(path, "text ") for path in files]
    sampling = SamplingConfig(o["temperature"], o["top_k"], o["top_p"], o["min_p"])
    report = agreement_run(model or models.default_pair()[0], candidates, texts, n_tokens, sampling, o["n_ctx"],
                           o["n_threads"], o["n_gpu_layers"], o["cache_dir"], progress=True)
    click.echo("\n".join(format_report(report)))
    if json_file is not None:
        json_file.write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
    low = [c for c in report.candidates if min_agreement is not None and c.top1_agreement < min_agreement]
    if low:
        raise click.ClickException(f"{low[0].model}: top-1 agreement {low[0].top1_agreement:.3f} is below "
                                   f"--min-agreement {min_agreement}")


@cli.command("compare")
@some_model_options(*_RUN_OPTIONS, "cache_dir")
@click.option("-p", "--prompt", help="The prompt, raw text (special tokens parsed) as the programs take it.")
@click.option("-f", "--file", type=click.Path(path_type=Path), help="Read the raw prompt from a file.")
@click.option("--prompt-name", default="code_edit", show_default=True,
              help="Without -p/-f: this prompt of the bench suite, in the model's chat template.")
@click.option("--strategies", help=f"Comma-separated, from: {', '.join(PROGRAMS)} "
                                   "[default: each one llamaspec has and the models allow].")
@click.option("--bin-dir", type=click.Path(path_type=Path),
              help="Directory of llama.cpp's programs [default: PATH, then where scripts/build_llama_cpp.sh "
                   "puts them].")
@click.option("--repeat", type=int, default=1, show_default=True,
              help="Runs of each side; each side keeps its run of median speed.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds a program may run.")
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Write the report as JSON.")
def compare_command(prompt: Optional[str], file: Optional[Path], prompt_name: str, strategies: Optional[str],
                    bin_dir: Optional[Path], repeat: int, timeout: float, json_file: Optional[Path], **o: Any) -> None:
    """llama.cpp's own programs (llama-completion, llama-speculative-simple, llama-lookup,
    llama-lookahead) and llamaspec side by side: same models, prompt, tokens, threads and draft
    settings, greedy. Shows both speeds, their ratio, both acceptances and whether the texts agree."""
    if prompt is not None and file is not None:
        raise click.UsageError("give the prompt with -p or -f, not both")
    _check_writable(json_file)
    text = _read(file, "prompt file ") if file is not None else prompt
    settings = matched(_bench_settings(o, repeat))
    source = text if text is not None else load_suite([prompt_name])[0]
    report = run_compare(settings, source, _names(strategies), bin_dir, timeout, o["cache_dir"])
    click.echo(report.table())
    if json_file is not None:
        _write(json_file, json.dumps(asdict(report), indent=1) + "\n")


def _read(path: Path, what: str = "", limit: int = MAX_TEXT_BYTES) -> str:
    """A text file's text: a regular file of at most ``limit`` bytes, UTF-8 (checked before reading)."""
    try:
        check_readable(path, limit, (what or "file ").strip())
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise click.UsageError(f"cannot read {what}{path}: {e.strerror}") from None
    return _decode(data, f"{what}{path}")


def main() -> None:
    cli(prog_name="llamaspec")
