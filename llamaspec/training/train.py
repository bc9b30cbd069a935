"""``llamaspec heads train`` as a function: the target read on a text, heads fitted, the file written."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Optional, Sequence, Tuple, Union

from tqdm import tqdm

from ..config import default_threads
from ..errors import ConfigError
from ..llama import models
from ..llama.binding import Model
from ..draft_heads import FORMAT, cached_path
from .data import GROUP, check_text_file, collect, default_texts, file_texts, output_rows
from .fit import Report, TrainConfig, train


@dataclass(frozen=True)
class Defaults:
    """What a training reads and spends by default for a target of its size: ``tokens``, rows of
    the default text (answers to the default prompts first); ``minutes``, the most it takes from
    the target's loading to the file written, whatever the machine (the budgets of a 2-core CPU,
    less a margin), of which the reading takes at most ``READ_SHARE`` and the training the rest.
    A slower machine reads fewer rows and trains fewer steps: on a fast one the rows run out
    first, on a slow one the time (the training is short beside the reading, so the reading may
    take most of it). The runs these were chosen from: docs/results.md, "Draft heads"."""

    tokens: int
    minutes: float


LARGE, SMALL_TARGET = Defaults(114688, 29.0), Defaults(49152, 4.8)
READ_SHARE = 0.8  # of the minutes, the most the reading takes
SMALL = 1_000_000_000  # parameters: a target under this is a small one


def defaults(n_params: int) -> Defaults:
    """The training's defaults for a target of ``n_params`` parameters."""
    return SMALL_TARGET if n_params < SMALL else LARGE


# the target's answer to each default prompt, at most: more, shorter answers guessed better than
# fewer, longer ones (docs/results.md, "Draft heads")
ANSWER_TOKENS = 128
PROMPT_ROOM = 352  # cells of each answer's sequence for its prompt


def train_heads(model: str, files: Sequence[Union[str, Path]] = (), config: TrainConfig = TrainConfig(),
                output: Optional[Path] = None, tokens: Optional[int] = None, answer_tokens: int = ANSWER_TOKENS,
                threads: Optional[int] = None, cache_dir: Optional[Path] = None, progress: bool = True,
                minutes: Optional[float] = None) -> Tuple[Path, Report]:
    """Heads for ``model`` trained on ``files`` (UTF-8 text, each read only as far as the tokens
    wanted: ``data.file_tokens``; default: the mix of training/data.py), written to
    ``output`` (default: where they are found without --heads, training.train's ``cached_path``).
    Returns the file and the training's report. Ctrl-C while the text is read trains on what
    was read; while training, keeps the heads as they are. ``tokens``: the text's rows to read
    (default: ``defaults``); ``minutes``: the most the reading and training take together
    (default: ``defaults``; the model's download is not counted)."""
    if tokens is not None and tokens < 64:
        raise ConfigError(f"training needs at least 64 tokens of text, got {tokens}")
    if minutes is not None and not minutes > 0:
        raise ConfigError(f"minutes must be > 0, got {minutes}")
    files = [Path(f) for f in files]
    for f in files:  # a binary file refused before the target loads (or downloads)
        check_text_file(f)
    path = models.resolve_model(model, cache_dir, progress)
    out = Path(output) if output is not None else cached_path(path, models.cache_dir(cache_dir))
    out.parent.mkdir(parents=True, exist_ok=True)
    start = perf_counter()
    target = Model(path)
    try:
        size = defaults(target.n_params)
        tokens = tokens if tokens is not None else size.tokens
        seconds = 60 * (minutes if minutes is not None else size.minutes)
        read_until = start + READ_SHARE * seconds
        pieces = file_texts(files) if files else default_texts(config.seed)
        group = GROUP if any(p.kind == "answer" for p in pieces) else 1  # a sequence per answer decoded together
        ctx = target.context(max(2048, group * (PROMPT_ROOM + answer_tokens)), threads or default_threads(), 512,
                             group)
        try:
            with tqdm(total=tokens, desc="reading the target's states", unit="tok", disable=not progress,
                      leave=False) as bar:
                states, cut = collect(target, ctx, pieces, tokens, answer_tokens, bar.update, read_until)
        finally:
            ctx.close()
        if len(states) < 64:
            when = f" in the {READ_SHARE:.0%} of {seconds / 60:g} minutes it may take" \
                if perf_counter() >= read_until else ""
            raise ConfigError(f"the training text gave {len(states)} tokens{when}; heads need at least 64")
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

