"""``llamaspec agreement``: how closely candidate models follow a reference model, to check a
quantization and to choose a draft model.

The token streams are given texts or, by default, the bench suite's prompts followed by the
reference's own greedy answers (generated once, cached beside the models). Every model reads
every stream teacher-forced, in batches of ``BATCH`` rows with logits; the measures per position
are ``divergence.compare``'s. Per candidate: top-1 agreement, expected acceptance of speculative
sampling at the chosen sampler settings, KL(p || q) mean and 99th percentile, perplexity, tokens
per step for chain drafts of k = 1..16 and, from both models' measured cost curves, the
speed-up of drafting with it on this machine; and a verdict.

A candidate with the reference's architecture and shape is a quantization of the same model:
its verdict judges the quantization by top-1 agreement (thresholds in QUANT_VERDICTS, measured
with llama.cpp's quantizer, see the README). Any other candidate is judged as a draft model.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..llama import models
from ..llama.binding import Context, Model
from ..llama.pool import ModelPool
from .report import format_columns
from .suite import SUITE_FILE, greedy_answers
from ..config import ModelConfig, SamplingConfig
from ..planning.costs import CostModel, load_or_measure
from .divergence import Positions, compare, full_runs, speedups, tokens_per_step
from ..errors import ConfigError, PromptError
from ..llama.tables import read_table, write_table
from ..llama.vocab import check_compatible
from ..sources import default_registry

BATCH = 256  # rows evaluated with logits at a time
K_MAX = 16
# (lowest top-1 agreement, verdict) for a quantization of the reference, best first.
QUANT_VERDICTS = ((0.93, "agrees like a healthy quant"), (0.85, "lossy: a low-bit quant"),
                  (0.0, "far below: likely broken"))

# the source a draft model drafts as (its cost curve's name in a CostModel)
DRAFT = default_registry().on_draft_model()[0]


@dataclass(frozen=True)
class Stream:
    """Tokens read as context, then tokens scored: each one predicted from all before it."""

    name: str
    context: Tuple[int, ...]
    scored: Tuple[int, ...]


@dataclass(frozen=True)
class CandidateAgreement:
    """One candidate against the reference (``tokens_per_step[k - 1]`` and ``speedups[k - 1]``:
    drafting k tokens every step)."""

    model: str
    n_tokens: int
    top1_agreement: float
    expected_acceptance: float
    kl_mean: float
    kl_p99: float
    perplexity: float
    tokens_per_step: Tuple[float, ...]
    speedups: Tuple[float, ...]
    predicted_speedup: float
    best_k: int
    same_model: bool
    verdict: str


@dataclass(frozen=True)
class AgreementReport:
    reference: str
    reference_perplexity: float
    temperature: float
    streams: Tuple[str, ...]
    candidates: Tuple[CandidateAgreement, ...]

    def to_json(self) -> Dict:
        return asdict(self)


def agreement(reference: str, candidates: Sequence[str], texts: Sequence[str] = (), n_tokens: int = 128,
              sampling: SamplingConfig = SamplingConfig(), n_ctx: int = ModelConfig.n_ctx,
              n_threads: Optional[int] = None, n_gpu_layers: int = ModelConfig.n_gpu_layers,
              cache_dir: Optional[Path] = None, progress: bool = False) -> AgreementReport:
    """Measure each candidate (a GGUF path or models.txt name) against ``reference`` on
    ``texts`` or, without texts, on the suite's prompts and the reference's greedy answers of
    ``n_tokens`` tokens."""
    if not candidates:
        raise ConfigError("give at least one candidate model")
    if n_tokens < 1:
        raise ConfigError(f"tokens per answer must be >= 1, got {n_tokens}")
    for i, text in enumerate(texts):
        if not text.strip():
            raise PromptError(f"text {i + 1} is empty")
    config = ModelConfig(reference, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
    ref_path = models.resolve_model(reference, cache_dir, progress)
    cand_paths = [models.resolve_model(c, cache_dir, progress) for c in candidates]
    pool = ModelPool()
    ref_model = pool.get(ref_path, n_gpu_layers)
    cand_models: List[Model] = []
    contexts: List[Context] = []
    try:
        for path in cand_paths:
            cand_models.append(pool.get(path, n_gpu_layers))
            check_compatible(ref_model, cand_models[-1])
        streams = _text_streams(ref_model, texts) if texts else _answer_streams(
            ref_model, n_tokens, config, pool, models.cache_dir(cache_dir) / "agreement-answers.json")
        longest = max(len(s.context) + len(s.scored) for s in streams)
        if longest > config.n_ctx:
            raise PromptError(f"a text has {longest} tokens but the context holds {config.n_ctx}; "
                              f"raise the context size (-c) or shorten the text")
        contexts = [Context(m, config.n_ctx, config.threads, BATCH) for m in [ref_model] + cand_models]
        costs_file = models.cache_dir(cache_dir) / "costs.json"
        curves = [load_or_measure(ctx, costs_file, progress) for ctx in contexts]
        measured = _evaluate(contexts, streams, sampling)
        same = [_shape(m) == _shape(ref_model) for m in cand_models]
    finally:
        for ctx in contexts:
            ctx.close()
        for m in [ref_model] + cand_models:
            pool.release(m)
    ref_ppl = float(np.exp(measured[0][0].nll_p.mean()))
    results = []
    for name, same_model, curve, (positions, per_stream) in zip(candidates, same, curves[1:], measured):
        full = full_runs(per_stream, K_MAX)
        per_step = tokens_per_step(full)
        gains = speedups(full, CostModel(curves[0], {DRAFT: curve}))
        best = int(np.argmax(gains)) + 1
        results.append(CandidateAgreement(
            model=name, n_tokens=len(positions.agree), top1_agreement=float(positions.agree.mean()),
            expected_acceptance=float(positions.accept.mean()), kl_mean=float(positions.kl.mean()),
            kl_p99=float(np.percentile(positions.kl, 99)), perplexity=float(np.exp(positions.nll_q.mean())),
            tokens_per_step=tuple(float(x) for x in per_step), speedups=tuple(float(x) for x in gains),
            predicted_speedup=float(gains[best - 1]), best_k=best, same_model=same_model,
            verdict=verdict(float(positions.agree.mean()), float(gains[best - 1]), best, same_model)))
    return AgreementReport(reference, ref_ppl, sampling.temperature, tuple(s.name for s in streams), tuple(results))


def format_report(report: AgreementReport) -> List[str]:
    """The report as aligned lines: the reference, then one row per candidate."""
    kind = "greedy" if report.temperature == 0 else f"temp {report.temperature:g}"
    cells = [("candidate", "top-1", f"accept ({kind})", "KL mean", "KL p99", "ppl", "tok/step k=1,2,4,8",
              "predicted", "verdict")]
    for c in report.candidates:
        cells.append((Path(c.model).name, f"{c.top1_agreement:.3f}", f"{c.expected_acceptance:.3f}",
                      f"{c.kl_mean:.4f}", f"{c.kl_p99:.3f}", f"{c.perplexity:.3f}",
                      " ".join(f"{c.tokens_per_step[k - 1]:.2f}" for k in (1, 2, 4, 8)),
                      f"{c.predicted_speedup:.2f}x (k={c.best_k})", c.verdict))
    head = (f"reference {Path(report.reference).name}: perplexity {report.reference_perplexity:.3f} on "
            f"{report.candidates[0].n_tokens} tokens ({', '.join(report.streams)})")
    return [head] + format_columns(cells, left=(0, 8))


def verdict(top1: float, speedup: float, best_k: int, same_model: bool) -> str:
    """A quantization by its top-1 agreement (QUANT_VERDICTS); another model as a draft."""
    if same_model:
        return next(text for floor, text in QUANT_VERDICTS if top1 >= floor)
    if speedup > 1.0:
        return f"pays as a draft here: {speedup:.2f}x drafting {best_k} a step"
    return f"does not pay as a draft here (best {speedup:.2f}x, {best_k} a step): the planner leaves it idle"


def _evaluate(contexts: List[Context], streams: Sequence[Stream],
              sampling: SamplingConfig) -> List[Tuple[Positions, List[np.ndarray]]]:
    """Per candidate: its measures over all streams, and each stream's acceptance per position."""
    parts: List[List[Positions]] = [[] for _ in contexts[1:]]
    for stream in streams:
        for ctx in contexts:
            ctx.truncate(0)
            ctx.eval(stream.context[:-1])
        rows = (stream.context[-1],) + stream.scored[:-1]  # row j predicts scored[j]
        per_candidate: List[List[Positions]] = [[] for _ in contexts[1:]]
        for start in range(0, len(rows), BATCH):
            chunk, nxt = rows[start:start + BATCH], stream.scored[start:start + BATCH]
            contexts[0].eval(chunk, logits="all")
            p = contexts[0].logits(len(chunk)).copy()
            for ctx, out in zip(contexts[1:], per_candidate):
                ctx.eval(chunk, logits="all")
                out.append(compare(p, ctx.logits(len(chunk)), nxt, sampling))
        for acc, out in zip(parts, per_candidate):
            acc.append(Positions.concat(out))
    return [(Positions.concat(p), [s.accept for s in p]) for p in parts]


def _text_streams(model: Model, texts: Sequence[str]) -> List[Stream]:
    streams = []
    for i, text in enumerate(texts):
        tokens = model.tokenize(text)
        if len(tokens) < 2:
            raise PromptError(f"text {i + 1} has {len(tokens)} token(s): nothing to predict")
        streams.append(Stream(f"text {i + 1}", tuple(tokens[:1]), tuple(tokens[1:])))
    return streams


def _answer_streams(model: Model, n_tokens: int, config: ModelConfig, pool: ModelPool,
                    cache_file: Path) -> List[Stream]:
    """The suite's prompts in the reference's chat template, then its greedy answers (cached
    per reference file, answer length and suite)."""
    stat = model.path.stat()
    key = hashlib.sha256(f"{model.path.name}:{stat.st_size}:{stat.st_mtime_ns}:{n_tokens}:".encode()
                         + SUITE_FILE.read_bytes()).hexdigest()[:24]
    table = read_table(cache_file)
    if key not in table:
        table[key] = _answers(model, n_tokens, config, pool)
        write_table(cache_file, table)
    return [Stream(name, tuple(a["prompt"]), tuple(a["answer"])) for name, a in table[key].items() if a["answer"]]


def _answers(model: Model, n_tokens: int, config: ModelConfig, pool: ModelPool) -> Dict[str, Dict[str, List[int]]]:
    from ..api import LlamaSpec  # the plain generation path, tested against llama.cpp's programs

    spec = LlamaSpec(ModelConfig(str(model.path), config.n_ctx, config.n_threads, config.n_gpu_layers), spec="none",
                     progress=False, pool=pool)  # the pool shares the loaded weights
    try:
        return greedy_answers(spec, n_tokens)
    finally:
        spec.close()


def _shape(model: Model) -> Tuple[Optional[str], ...]:
    """The architecture and sizes: equal for two quantizations of one model."""
    arch = model.meta("general.architecture")
    return (arch,) + tuple(model.meta(f"{arch}.{key}") for key in
                           ("block_count", "embedding_length", "feed_forward_length", "attention.head_count"))

