"""The commands that manage and measure: ``models`` (list, fetch, path), ``lookup`` (n-gram
cache files: create, stats), ``heads train``, ``bench``, ``profile``, ``agreement`` and ``compare``."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

import click

from ..assembly import MAX_SAMPLES
from ..config import ModelConfig, SamplingConfig, SpecConfig, default_threads
from ..errors import LlamaspecError
from ..llama import hub, models
from ..llama.binding import Model, gpus
from ..llama.ngram import NGRAM_STATIC, NgramCache
from ..llama.pool import ModelPool
from ..measure import (PROGRAMS, STRATEGIES, SUITES, SuitePrompt, format_columns, load_suite, matched,
                       require_matplotlib, run_bench, run_compare, write_plot)
from ..measure.agreement import agreement as agreement_run, format_report
from ..measure.replay import copy_oracle, replay
from ..measure.samples import run_samples, table as samples_table
from ..planning import costs
from ..planning.acceptance_model import AcceptanceModel
from ..planning.costs import CostCurve, CostModel, cached_curve
from ..planning.planner import Planner
from ..planning.speculator import Speculator
from ..sources import installed_registry
from ..sources.lookup import escaped_view
from ..sources.registry import Setup, TextContext
from ..training import TrainConfig, train_heads
from ..training.train import LARGE, READ_SHARE, SMALL, SMALL_TARGET
from .options import (SETTINGS, bench_settings, check_writable, models_of, read_text, some_model_options,
                      split_names, write_text, _placement)

@click.group("models")
def models_group() -> None:
    """The models named in models.txt: list, fetch, path."""


cache_option = click.option("--cache-dir", type=click.Path(path_type=Path), default=None,
                            help="Model cache [default: $LLAMASPEC_CACHE or the platform cache].")


@models_group.command("list")
@cache_option
def models_list(cache_dir: Optional[Path]) -> None:
    """Every known model, its size and whether it is fetched; then the GGUF files in the Hugging
    Face hub's local cache (each usable as -m hf://OWNER/REPO/FILE)."""
    target, draft = models.default_pair()
    for name, entry in models.load_model_list().items():
        path = models.model_path(name, cache_dir)
        role = " (default target)" if name == target else " (default draft)" if name == draft else ""
        state = str(path) if path else "not fetched"
        click.echo(f"{name:32} {entry.size / 2**20:8.1f} MiB  {state}{role}")
    for name, path in hub.cached():
        click.echo(f"{hub.PREFIX + name:32} {path.stat().st_size / 2**20:8.1f} MiB  {path}")


@models_group.command("fetch")
@click.argument("names", nargs=-1, required=True)
@cache_option
def models_fetch(names: List[str], cache_dir: Optional[Path]) -> None:
    """Download, verify (sha256) and cache models."""
    for name in names:
        click.echo(models.fetch(name, models.cache_dir(cache_dir)))


@models_group.command("path")
@click.argument("name", required=False)
@some_model_options("hf", "hf_file")
@cache_option
def models_path(name: Optional[str], cache_dir: Optional[Path], **o: Any) -> None:
    """Print the cached path of a fetched model (no download); with -hf REPO[:QUANT] (and
    --hf-file), the hub model's file, fetched into the hub's cache where it is not there yet."""
    if o["hf"] is not None or o["hf_file"] is not None:
        model, _ = models_of({**o, "model": name})
        click.echo(models.resolve_model(model, cache_dir))
        return
    if name is None:
        raise click.UsageError("give a model's name, or -hf REPO[:QUANT]")
    path = models.model_path(name, cache_dir)
    if path is None:
        raise LlamaspecError(f"{name} is not fetched yet: run `llamaspec models fetch {name}`")
    click.echo(path)


@click.group("lookup")
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
        text = read_text(f)
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
@some_model_options("lookup_ngram_min", "lookup_ngram_max")
@click.option("--draft-max", "lookup_draft_max", type=int, default=None,
              help="Most tokens a lookup candidate has [default: lookup's].")
@some_model_options("lookup_cache_static", "lookup_cache_dynamic", "references")
@click.option("-t", "--threads", "n_threads", type=int, default=None,
              help="Threads of the cost curve to use [default: all cores].")
@cache_option
def lookup_stats(model: str, text_file: Path, prompt_file: Optional[Path], references: List[Path],
                 n_threads: Optional[int], cache_dir: Optional[Path], **o: Any) -> None:
    """Replay a text through lookup and the planner without running the model: how much would be
    verified and accepted (llama-lookup-stats), the speed-up the cached cost curve predicts, and
    the copy-oracle bound (what verifying every copyable run at the measured cost would give)."""
    registry = installed_registry()
    configs = registry.configs({k: v for k, v in o.items() if v is not None})
    path = models.resolve_model(model, cache_dir)
    vocab = Model(path, vocab_only=True)
    prompt = vocab.tokenize(read_text(prompt_file), add_special=True) if prompt_file else []
    text = vocab.tokenize(read_text(text_file), add_special=not prompt, parse_special=False)
    if len(prompt) + len(text) < 2:
        raise click.UsageError("the text is too short to replay")
    if not prompt:
        prompt, text = text[:1], text[1:]

    def tokenize(content: str) -> List[int]:  # as the sources read texts: no special tokens
        return vocab.tokenize(content, add_special=False, parse_special=False)

    refs = [tokenize(read_text(r)) for r in references]
    measured = cached_curve(path, n_threads or default_threads(), models.cache_dir(cache_dir) / "costs.json")
    curve = measured or CostCurve.flat()
    # lookup, and what joins it where its files are given (the n-gram caches), loaded with no model
    loadable = frozenset(p.name for p in registry.plugins if p.loads_from(configs[p.name], None))
    names = registry.resolve(SpecConfig(frozenset({"lookup"})), loadable)
    setups = {}
    for name in names:
        p = registry[name]
        checked = p.hooks.check(configs[name])
        loaded = p.hooks.load(configs[name], _Vocabulary(vocab), checked) if name in loadable else None
        setups[name] = Setup(configs[name], loaded, vocab.piece, tokenize)
    sources = registry.build(names, setups, TextContext(references=tuple(tuple(r) for r in refs)))
    stats = replay(prompt, text, Speculator(sources, AcceptanceModel(), Planner(CostModel(curve)), vocab.eog_tokens))
    click.echo(f"n_predict    = {stats.n_tokens}")
    click.echo(f"n_drafted    = {stats.n_drafted}")
    click.echo(f"n_accept     = {stats.n_accept}")
    click.echo(f"accept       = {stats.accept:.3f}%")
    click.echo(f"target calls = {stats.n_steps} ({stats.n_tokens / max(stats.n_steps, 1):.2f} tokens per call)")
    if measured:
        bound = copy_oracle(prompt, text, curve.cost, curve.switch, [*refs, escaped_view(prompt, vocab.piece, tokenize)])
        click.echo(f"predicted    = {stats.speedup:.2f}x plain decoding with the measured cost curve "
                   f"({curve.threads} threads, {curve.backend}: {curve_summary(curve)})")
        click.echo(f"copy oracle  = {bound:.2f}x ({100 * stats.speedup / bound:.0f}% of it reached)")
    else:
        click.echo("predicted    = no cost curve cached for this model and thread count; "
                   "run `llamaspec profile` once to measure it (the replay assumed a GPU-like flat curve)")


def curve_summary(curve: CostCurve, sizes: Sequence[int] = (1, 2, 4, 8, 12, 16, 24, 32)) -> str:
    switch = f"; a decode of another row count than the last: +{curve.switch:.2f}" if curve.switch else ""
    return " ".join(f"{n}:{curve.cost(n):.2f}" for n in sizes) + switch




class _Vocabulary:
    """What a replay gives a source to load with: the vocabulary alone (no model runs)."""

    draft = None
    lanes = 1

    def __init__(self, target: Model) -> None:
        self.target = target


# the options of the commands that run strategies: the models, their placement, the tokens to
# generate and every draft source's settings
MODELS = ("model", "draft", "hf", "hf_file", "hf_draft", "hf_file_draft", "n_ctx", "n_threads", "n_gpu_layers",
          "n_gpu_layers_draft", "max_tokens")
PLACEMENT = ("rpc", "rpc_draft", "tensor_split", "rpc_timeout")
RUN_OPTIONS = (*MODELS, *SETTINGS, *PLACEMENT)
# compare runs llama.cpp's programs with their own lookup and lookahead settings (measure.compare.matched):
# only the draft model's are the user's
COMPARE_OPTIONS = (*MODELS, *(k for k in SETTINGS if k.startswith("draft_")), *PLACEMENT)


@click.group("heads")
def heads_group() -> None:
    """Draft heads: a small block on the target's last hidden state that guesses the next tokens."""


@heads_group.command("train")
@click.option("-m", "--model", default=None, help="The target the heads are for [default: the default target].")
@click.option("-f", "--file", "files", multiple=True, type=click.Path(path_type=Path),
              help="Training text (repeatable): UTF-8, read a block at a time only as far as --tokens needs, "
                   "whatever its size; a file with a NUL byte or bytes that are not UTF-8 is refused [default: the "
                   "target's answers to a set of prompts, then Python's standard library and installed packages' "
                   "descriptions].")
@click.option("--heads", "n_heads", type=int, default=TrainConfig.heads, show_default=True,
              help="Heads: the block's steps; head k guesses the token k places after the next one, "
                   "reading the tokens before it.")
@click.option("--rank", type=int, default=TrainConfig.rank, show_default=True,
              help="The block's inner units: it goes from the hidden state through this many and back.")
@click.option("--tokens", type=int, default=None,
              help=f"Tokens of training text to read [default: {LARGE.tokens:,}; {SMALL_TARGET.tokens:,} for a "
                   f"target under {SMALL // 10**9}B parameters].")
@click.option("--map-tokens", "n_tokens", type=int, default=0,
              help="Tokens the heads can guess: the most frequent of the target's [default: 0, those that "
                   "make 95% of the target's tokens on the text, 1024 to 8192].")
@click.option("--epochs", type=float, default=TrainConfig.epochs, show_default=True)
@click.option("--minutes", type=float, default=None,
              help=f"The most minutes reading and training take: the reading stops at {READ_SHARE:.0%} of them, "
                   f"the training at their end [default: {LARGE.minutes:g}; {SMALL_TARGET.minutes:g} under "
                   f"{SMALL // 10**9}B parameters].")
@click.option("--seed", type=int, default=TrainConfig.seed, show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Heads file to write [default: CACHE/heads/MODEL_FILE.heads.npz, where generate, chat, serve and "
                   "bench find them without --heads].")
@click.option("-t", "--threads", "n_threads", type=int, default=None, help="Threads [default: all cores].")
@cache_option
def heads_train(model: Optional[str], files: Tuple[Path, ...], n_heads: int, rank: int, tokens: Optional[int],
                n_tokens: int, epochs: float, minutes: Optional[float], seed: int, output: Optional[Path],
                n_threads: Optional[int], cache_dir: Optional[Path]) -> None:
    """Train draft heads for a model on this machine, from its own hidden states and tokens."""
    config = TrainConfig(heads=n_heads, rank=rank, n_tokens=n_tokens, epochs=epochs, seed=seed)
    if output is not None:
        check_writable(output)
    path, report = train_heads(model or models.default_pair()[0], files, config, output, tokens,
                               threads=n_threads, cache_dir=cache_dir, minutes=minutes)
    cut = " (stopped by Ctrl-C: what was trained is kept)" if report.interrupted else \
        f" (stopped at the time given, before {epochs:g} epochs)" if report.out_of_time else ""
    click.echo(f"{path}: {n_heads} heads over {report.n_tokens} tokens ({report.coverage:.0%} of the target's), "
               f"{report.rows} rows, {report.steps} steps in {report.seconds:.0f} s{cut}", err=True)
    if not report.held_out_rows:
        click.echo("no text held out to measure the heads on (a tenth of the files given is: "
                   "give more to see how they do)", err=True)
        return
    for k, (t1, t5, b1) in enumerate(zip(report.top1, report.top5, report.base_top1), start=1):
        click.echo(f"head {k}: top-1 {t1:.3f}, top-5 {t5:.3f} on {report.held_out_rows} held-out rows "
                   f"(untrained: top-1 {b1:.3f})", err=True)


@click.command("bench")
@some_model_options(*RUN_OPTIONS, "seed", "cache_dir")
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
    check_writable(json_file, plot_file)
    settings = bench_settings(o, repeat, temperature, o["seed"])
    if samples > 1:
        chosen = load_suite(split_names(prompts), SUITES[suite_name]) if prompts is not None else None
        rows = run_samples(settings, samples, chosen, o["cache_dir"])
        click.echo(samples_table(rows))
        if json_file is not None:
            write_text(json_file, json.dumps([asdict(r) for r in rows], indent=1) + "\n")
        return
    suite = load_suite(split_names(prompts), SUITES[suite_name]) if prompts is not None or not files else []
    suite += [SuitePrompt(f.stem, f"user message from {f}", read_text(f, "prompt file ")) for f in files]
    report = run_bench(settings, split_names(strategies), suite, o["cache_dir"])
    click.echo(report.table())
    if json_file is not None:
        write_text(json_file, json.dumps(asdict(report), indent=1) + "\n")
    if plot_file is not None:
        write_plot(report, plot_file)


@click.command("profile")
@some_model_options("model", "hf", "hf_file", "n_threads", "n_gpu_layers", "rpc", "tensor_split", "rpc_timeout",
                    "cache_dir")
@click.option("--repeats", type=int, default=2, show_default=True,
              help="Measurements of each size; the fastest counts.")
def profile_command(n_threads: Optional[int], n_gpu_layers: int, cache_dir: Optional[Path], repeats: int,
                    **o: Any) -> None:
    """Measure what one decode of n tokens costs, n = 1..32, on this machine (or on the RPC servers
    given), and cache the curve that the planner sizes drafts with."""
    model, _ = models_of(o)
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


@click.command("agreement")
@some_model_options("model", "hf", "hf_file", "n_ctx", "n_threads", "n_gpu_layers")
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
def agreement_command(candidates: Tuple[str, ...], files: Tuple[Path, ...], n_tokens: int,
                      json_file: Optional[Path], min_agreement: Optional[float], **o: Any) -> None:
    """How closely each candidate follows the reference model -m: top-1 agreement (the greedy
    acceptance rate), the expected acceptance of speculative sampling at --temp, KL divergence,
    perplexity, and the speed-up drafting with it would give on this machine. Checks a
    quantization (a damaged one agrees far less) and tells whether a draft model pays."""
    check_writable(json_file)
    model, _ = models_of(o)
    texts = [read_text(path, "text ") for path in files]
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


@click.command("compare")
@some_model_options(*COMPARE_OPTIONS, "cache_dir")
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
    check_writable(json_file)
    text = read_text(file, "prompt file ") if file is not None else prompt
    settings = matched(bench_settings(o, repeat))
    source = text if text is not None else load_suite([prompt_name])[0]
    report = run_compare(settings, source, split_names(strategies), bin_dir, timeout, o["cache_dir"])
    click.echo(report.table())
    if json_file is not None:
        write_text(json_file, json.dumps(asdict(report), indent=1) + "\n")
