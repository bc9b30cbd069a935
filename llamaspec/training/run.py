"""``llamaspec heads train`` as a function: the target read on a text, heads fitted, the file written."""

from __future__ import annotations

from pathlib import Path
from time import perf_counter
from typing import Optional, Sequence, Tuple

from tqdm import tqdm

from ..config import default_threads
from ..errors import ConfigError
from ..llama import models
from ..llama.binding import Model
from ..sources.heads import FORMAT, cached_path
from .data import GROUP, collect, default_texts, file_texts, output_rows
from .fit import Report, TrainConfig, train

# Rows of the default training text, answers to the default prompts first (up to 54,000 rows
# of the 1.5B's, read at about 80 rows/s on 2 cores; code and documentation at 143): the 1.5B
# trains in under 30 minutes there. A target under SMALL parameters reads fewer: SmolLM2-135M reads its
# states only 2.6x faster than the 1.5B, and 65,536 rows took 5 min 23 s to train on.
TOKENS, SMALL_TOKENS, SMALL = 114688, 49152, 1_000_000_000
# Minutes a training takes at most from the target's loading to the file written (the 30
# and 5 on 2 cores, less a margin), whatever the machine: the reading stops at READ_SHARE of them
# (the 1.5B's 114,688 rows took 19 of its 29 minutes on 2 AMD EPYC cores, where the budget
# changes nothing), the training where the rest ends. A slower machine reads fewer rows and
# trains fewer steps.
MINUTES, SMALL_MINUTES, READ_SHARE = 29.0, 4.8, 0.66
# the target's answer to each default prompt, at most: 421 answers of 128 tokens guessed better
# than 203 of 256 (head 1 on answers outside the mix: prose 0.324 -> 0.338, code 0.414 -> 0.465)
ANSWER_TOKENS = 128
PROMPT_ROOM = 352  # cells of each answer's sequence for its prompt


def train_heads(model: str, files: Sequence[Path] = (), config: TrainConfig = TrainConfig(),
                output: Optional[Path] = None, tokens: Optional[int] = None, answer_tokens: int = ANSWER_TOKENS,
                threads: Optional[int] = None, cache_dir: Optional[Path] = None, progress: bool = True,
                minutes: Optional[float] = None) -> Tuple[Path, Report]:
    """Heads for ``model`` trained on ``files`` (default: the mix of training/data.py), written to
    ``output`` (default: where they are found without --heads, training.run's ``cached_path``).
    Returns the file and the training's report. Ctrl-C while the text is read trains on what
    was read; while training, keeps the heads as they are. ``tokens``: the text's rows to read
    (default: ``default_tokens``); ``minutes``: the most the reading and training take together
    (default: ``default_minutes``; the model's download is not counted)."""
    if tokens is not None and tokens < 64:
        raise ConfigError(f"training needs at least 64 tokens of text, got {tokens}")
    if minutes is not None and not minutes > 0:
        raise ConfigError(f"minutes must be > 0, got {minutes}")
    for f in files:
        if not Path(f).is_file():
            raise ConfigError(f"no such training file: {f}")
    path = models.resolve_model(model, cache_dir, progress)
    out = Path(output) if output is not None else cached_path(path, models.cache_dir(cache_dir))
    out.parent.mkdir(parents=True, exist_ok=True)
    start = perf_counter()
    target = Model(path)
    try:
        tokens = tokens if tokens is not None else default_tokens(target.n_params)
        seconds = 60 * (minutes if minutes is not None else default_minutes(target.n_params))
        pieces = file_texts(files) if files else default_texts(config.seed)
        group = GROUP if any(p.kind == "answer" for p in pieces) else 1  # a sequence per answer decoded together
        ctx = target.context(max(2048, group * (PROMPT_ROOM + answer_tokens)), threads or default_threads(), 512,
                             group)
        try:
            with tqdm(total=tokens, desc="reading the target's states", unit="tok", disable=not progress,
                      leave=False) as bar:
                states, cut = collect(target, ctx, pieces, tokens, answer_tokens, bar.update,
                                      start + READ_SHARE * seconds)
        finally:
            ctx.close()
        if len(states) < 64:
            raise ConfigError(f"the training text gave {len(states)} tokens; heads need at least 64")
        meta = {"format": FORMAT, "model": path.name, "sha256": models.sha256(path), "n_vocab": target.n_vocab,
                "n_embd": target.n_embd, "text": [str(f) for f in files] or "default mix", "cut_short": cut}
        with tqdm(total=1, desc="training heads", unit="step", disable=not progress, leave=False) as bar:
            def step(done: int, steps: int, loss: float) -> None:
                bar.total = steps
                bar.update(done - bar.n)
                bar.set_postfix(loss=f"{loss:.3f}")
            heads, report = train(states, target.n_vocab, lambda t: output_rows(path, t), config, meta, step,
                                  start + seconds)
        heads.save(out)
        return out, report
    finally:
        target.close()


def default_tokens(n_params: int) -> int:
    """Rows of training text read by default for a target of ``n_params`` parameters."""
    return SMALL_TOKENS if n_params < SMALL else TOKENS


def default_minutes(n_params: int) -> float:
    """The most minutes a training takes by default for a target of ``n_params`` parameters."""
    return SMALL_MINUTES if n_params < SMALL else MINUTES
