"""Every option of the ``llamaspec`` commands, named as in llama.cpp's programs, and what turns
them into the library's arguments: the models and their placement, generation and sampling
options, grammars, prompts read from files or stdin, and the draft sources' settings, generated
from their plugins (each declares its options: ``sources.registry.Option``). A source named with
``--source`` adds its options after the others are known: they follow it on the command line
(``parse_sources``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import click

from ..api import alone, chosen_model, LlamaSpec
from ..config import (MAX_TEXT_BYTES, GenerationConfig, ModelConfig, SamplingConfig, SpecConfig, check_readable,
                      prompt_bytes)
from ..constraints import Grammar
from ..engine.generation import make_config
from ..errors import ConfigError
from ..llama import models
from ..measure import BenchSettings
from ..sources import installed_registry
from ..sources.registry import Registry

# The options of every generating command, named as in llama.cpp, by parameter name. Defaults
# come from the config dataclasses (one definition each).
_SAMPLING = SamplingConfig()

MODEL_OPTIONS = {
    "model": click.option("-m", "--model", help="Target model: GGUF path or models.txt name."),
    "draft": click.option("-md", "--model-draft", "--draft", "draft",
                          help="Draft model: GGUF path or models.txt name."),
    "hf": click.option("-hf", "-hfr", "--hf-repo", "hf", metavar="REPO[:QUANT]",
                       help="Target model from the Hugging Face hub, as llama.cpp's -hf (e.g. "
                            "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF:Q4_K_M); cached by huggingface_hub."),
    "hf_file": click.option("-hff", "--hf-file", "hf_file", metavar="FILE",
                            help="The file of the -hf repository to use, by name (instead of a tag)."),
    "hf_draft": click.option("-hfd", "-hfrd", "--hf-repo-draft", "hf_draft", metavar="REPO[:QUANT]",
                             help="Draft model from the Hugging Face hub."),
    "hf_file_draft": click.option("--hf-file-draft", "hf_file_draft", metavar="FILE",
                                  help="The file of the -hfd repository to use, by name."),
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
                              f"or a list of {', '.join(installed_registry().names)}  [default: auto]."),
    "references": click.option("--reference", "references", multiple=True, type=click.Path(path_type=Path),
                               help="A document lookup and lookahead may copy from (repeatable)."),
    "sources": click.option("--source", "sources", multiple=True, metavar="PATH_OR_MODULE",
                            help="A draft source of your own: a Python file or a module declaring PLUGIN "
                                 "(repeatable); its options follow it on the command line."),
    "spec_fixed": click.option("--spec-fixed", default=None,
                               help="Sources verified whole every step, as llama.cpp's programs do (e.g. draft: "
                                    "draft-max tokens each step); the others only as far as the planner finds "
                                    "it pays."),
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


def source_options(registry: Registry) -> Dict[str, Callable]:
    """The options of the draft sources in ``registry``, by parameter name, as their plugins
    declare them: each setting with a flag, and each source's shorthands (``--lookup``: it alone,
    ``--lookahead-fixed``: verified whole)."""
    out: Dict[str, Callable] = {}
    for keyword, (option, default) in registry.options().items():
        if option.flag is None:
            continue
        kind = click.Path() if option.path else type(default)  # a path as the config's str: bench's JSON writes it
        out[keyword] = click.option(option.flag, keyword, type=kind, default=default,
                                    show_default=default is not None, help=option.help)
    for p in registry.plugins:
        if "alone" in p.flags:
            out[p.name] = click.option(f"--{p.name}", p.name, is_flag=True,
                                       help=f"Shorthand for --spec {p.name}, plus the draft model when -md is given "
                                            f"({p.describe}).")
        if "fixed" in p.flags:
            out[f"{p.name}_fixed"] = click.option(f"--{p.name}-fixed", f"{p.name}_fixed", is_flag=True,
                                                  help=f"Shorthand for --spec-fixed {p.name}: verified whole every "
                                                       f"step, as llama.cpp's programs do.")
    return out


SOURCE_OPTIONS = source_options(installed_registry())
SETTINGS = tuple(k for k in SOURCE_OPTIONS if k in installed_registry().options())  # not the shorthands
EXTRA_ARGS = {"ignore_unknown_options": True, "allow_extra_args": True}  # a --source's own options


def model_options(f: Callable) -> Callable:
    """The options every generating command shares, named as in llama.cpp, and the draft sources'."""
    return some_model_options(*MODEL_OPTIONS, *SOURCE_OPTIONS)(f)


def some_model_options(*names: str) -> Callable[[Callable], Callable]:
    """The options of MODEL_OPTIONS and SOURCE_OPTIONS named, in that order."""
    table = {**MODEL_OPTIONS, **SOURCE_OPTIONS}

    def apply(f: Callable) -> Callable:
        for name in reversed(names):
            f = table[name](f)
        return f
    return apply


def parse_sources(o: dict, args: Sequence[str]) -> Registry:
    """The registry with the sources ``--source`` names, their options read from ``args`` (what
    the command line had besides its own options) into ``o``; UsageError for an argument that
    is no option of theirs."""
    registry = installed_registry(o.get("sources") or ())
    own = {k: v for k, v in source_options(registry).items() if k not in SOURCE_OPTIONS}
    if not own and not args:
        return registry
    command = click.Command("sources", params=[])
    for decorate in own.values():
        decorate(command)
    try:
        parsed = command.make_context("llamaspec", list(args), resilient_parsing=False)
    except click.NoSuchOption as e:
        raise click.UsageError(f"no such option: {e.option_name}") from None
    except click.BadParameter as e:
        raise click.UsageError(e.format_message()) from None
    if parsed.args:
        raise click.UsageError(f"got unexpected extra argument ({' '.join(parsed.args)})")
    o.update(parsed.params)
    return registry


def source_settings(o: dict, registry: Registry) -> Dict[str, Any]:
    """The sources' settings ``o`` holds, by keyword."""
    return {k: o[k] for k in registry.options() if k in o}


def spec_option(o: dict, registry: Registry, draft: bool) -> SpecConfig:
    """--spec, or a source's shorthand (--lookup, --lookahead); --spec-fixed and each --NAME-fixed."""
    chosen = [p.name for p in registry.plugins if "alone" in p.flags and o.get(p.name)]
    try:
        spec = alone(registry, SpecConfig.parse(o["spec"] or "auto"), chosen, draft, "--spec") \
            if not (chosen and o["spec"] is not None) else None
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    if spec is None:
        raise click.UsageError(f"give --spec or --{'/--'.join(chosen)}, not both")
    fixed = set(split_names(o["spec_fixed"]) or []) | {p.name for p in registry.plugins if "fixed" in p.flags
                                                 and o.get(f"{p.name}_fixed")}
    return spec.with_fixed(frozenset(fixed))


def load_spec(o: dict, registry: Registry, default_draft: bool) -> LlamaSpec:
    """The LlamaSpec the options ``o`` describe; with no --model, the default pair (its draft
    with ``default_draft``)."""
    model, draft = models_of(o)
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
    spec = spec_option(o, registry, draft_cfg is not None)
    references = [read_text(path, "reference ") for path in o["references"]]
    return LlamaSpec(target, draft_cfg, settings=source_settings(o, registry), cache_dir=o["cache_dir"],
                     progress=True, references=references, spec=spec, registry=registry)


def _placement(o: dict) -> dict:
    """Where --rpc, --tensor-split and --rpc-timeout place a model (ModelConfig's fields)."""
    shares = []
    for share in split_names(o.get("tensor_split")) or []:
        try:
            shares.append(float(share))
        except ValueError:
            raise click.UsageError(f"--tensor-split takes numbers separated by commas, got {o['tensor_split']!r}")
    servers = tuple(split_names(o.get("rpc")) or ())
    if o.get("rpc_draft") and not servers:
        raise click.UsageError("--rpc-draft places the draft model on the --rpc servers: give --rpc")
    return dict(rpc=servers, tensor_split=tuple(shares), rpc_timeout=o.get("rpc_timeout", ModelConfig.rpc_timeout))


def generation_options(o: dict) -> dict:
    keys = ("max_tokens", "stop", "temperature", "top_k", "top_p", "min_p", "typical_p", "seed", "repeat_penalty",
            "penalty_last_n", "presence_penalty", "frequency_penalty", "mirostat", "mirostat_eta", "mirostat_tau")
    opts = {k: o[k] for k in keys}
    opts["stop"] = tuple(utf8_option(s, "a --stop string") for s in opts["stop"])
    opts["logit_bias"] = [_logit_bias(text) for text in o["logit_bias"]]
    opts["grammar"] = grammar_option(o)
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


def grammar_option(o: dict) -> Optional[Grammar]:
    """--json-schema, --json-mode, --grammar or --grammar-file (at most one), checked now: compiled
    on its own, before any model loads."""
    given = [name for name in ("json_schema", "json_mode", "grammar", "grammar_file") if o[name]]
    if len(given) > 1:
        raise click.UsageError(f"give one of --json-schema, --json-mode, --grammar and --grammar-file, not "
                               f"{' and '.join('--' + g.replace('_', '-') for g in given)}")
    if o["json_schema"]:
        text = o["json_schema"]
        if not _inline_json(text):  # a file holding the schema
            text = read_text(Path(text), "JSON schema file ")
        return Grammar.json_schema(text, "--json-schema").check()
    if o["json_mode"]:
        return Grammar.json()
    if o["grammar"]:
        return Grammar.gbnf(utf8_option(o["grammar"], "--grammar"), "--grammar").check()
    if o["grammar_file"]:
        return Grammar.gbnf(read_text(o["grammar_file"], "grammar file "), "--grammar-file").check()
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


def read_prompt(prompt: Optional[str], file: Optional[Path], n_ctx: int) -> str:
    """The prompt of -p, -f or stdin; a file or stdin longer than a context of ``n_ctx`` tokens
    could hold is refused before it is read (stdin: after that many bytes)."""
    if prompt is not None and file is not None:
        raise click.UsageError("give the prompt with -p or -f, not both")
    limit = prompt_bytes(n_ctx)
    if file is not None:
        return read_text(file, "prompt file ", limit)
    if prompt is not None:
        return utf8_option(prompt, "the prompt (-p)")
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


def utf8_option(value: str, what: str) -> str:
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


def read_text(path: Path, what: str = "", limit: int = MAX_TEXT_BYTES) -> str:
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


def split_names(value: Optional[str]) -> Optional[List[str]]:
    return [v.strip() for v in value.split(",") if v.strip()] if value is not None else None


def check_writable(*paths: Optional[Path]) -> None:
    """Fail before a long run, not after it, when an output file cannot be created."""
    for path in paths:
        if path is not None and not path.parent.is_dir():
            raise click.UsageError(f"cannot write {path}: no directory {path.parent}")


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise click.UsageError(f"cannot write {path}: {e.strerror}") from None




def models_of(o: dict) -> Tuple[Optional[str], Optional[str]]:
    """The target and draft model arguments -m/-hf (--hf-file) and -md/-hfd (--hf-file-draft) give."""
    try:
        return (chosen_model(o.get("model"), o.get("hf"), o.get("hf_file"), ("-m", "-hf", "--hf-file"), required=False),
                chosen_model(o.get("draft"), o.get("hf_draft"), o.get("hf_file_draft"), ("-md", "-hfd", "--hf-file-draft"),
                             required=False))
    except ConfigError as e:
        raise click.UsageError(str(e)) from None


def bench_settings(o: dict, repeat: int, temperature: float = 0.0, seed: Optional[int] = None) -> BenchSettings:
    """The shared options as BenchSettings; with no --model, the default pair."""
    model, draft = models_of(o)
    if model is None:
        model, pair_draft = models.default_pair()
        draft = draft or pair_draft
    registry = installed_registry()
    fixed = tuple(p.name for p in registry.plugins if "fixed" in p.flags and o.get(f"{p.name}_fixed"))
    return BenchSettings(model, draft, n_predict=o["max_tokens"], n_ctx=o["n_ctx"], n_threads=o["n_threads"],
                         n_gpu_layers=o["n_gpu_layers"], n_gpu_layers_draft=o["n_gpu_layers_draft"],
                         temperature=temperature, seed=seed, repeat=repeat, rpc_draft=o["rpc_draft"],
                         sources=source_settings(o, registry), fixed=fixed, **_placement(o))
