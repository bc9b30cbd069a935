"""How far a row of a verify batch moves a position's top-1/top-2 logit gap against the same row
decoded alone, on this machine's llama.cpp build: the tests' near-tie tolerance (tests/conftest.py,
NEAR_TIES) must cover it.

A model's greedy answer to each test prompt is decoded one token at a time (the reference rows);
then the same tokens again, each in a batch with rows of other sequences around it (up to two
rows for each of three sequences, one of them emptied now and then, so that the text's KV cells
interleave with theirs as the batcher's lanes do).

    python scripts/batch_row_drift.py smollm2-135m-instruct --seeds 4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import llamaspec
from llamaspec.llama.binding import Context, Model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import PROMPTS  # noqa: E402  (the tests' prompts)


def alone(model: Model, prompt: list, n: int) -> tuple:
    """The greedy tokens after ``prompt`` and their rows, one token a decode."""
    ctx = Context(model, 2048, 2)
    ctx.eval(prompt[:-1])
    tokens, rows, token = [], [], prompt[-1]
    for _ in range(n):
        ctx.eval([token], logits="last")
        rows.append(ctx.logits_ith(-1).copy())
        token = int(rows[-1].argmax())
        tokens.append(token)
    ctx.close()
    return tokens, np.array(rows)


def among_others(model: Model, prompt: list, tokens: list, rng: np.random.Generator) -> np.ndarray:
    """The rows of ``tokens`` (after ``prompt``), each decoded among other sequences' rows."""
    ctx = Context(model, 2048, 2, n_seq_max=4)
    ctx.eval(prompt[:-1])
    used = {1: 0, 2: 0, 3: 0}  # positions each other sequence holds
    rows = []
    for k, token in enumerate([prompt[-1], *tokens[:-1]]):
        if rng.random() < 0.3:  # a sequence leaves: its cells free up between the text's
            seq = int(rng.integers(1, 4))
            ctx.seq_rm(seq, -1, -1)
            used[seq] = 0
        batch = []
        for seq in used:
            for _ in range(int(rng.integers(0, 3))):
                batch.append((int(rng.integers(100, 1000)), used[seq], [seq], False))
                used[seq] += 1
        at = int(rng.integers(0, len(batch) + 1))
        batch.insert(at, (token, len(prompt) - 1 + k, [0], True))
        ctx.decode_rows(batch)
        rows.append(ctx.logits_ith(at).copy())
    ctx.close()
    return np.array(rows)


def margin(rows: np.ndarray, best: np.ndarray) -> np.ndarray:
    """Each row's logit of token ``best`` above the best of the others (negative: another wins)."""
    others = np.where(np.arange(rows.shape[1]) == best[:, None], -np.inf, rows)
    return rows[np.arange(len(rows)), best] - others.max(axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a registry name or a GGUF file")
    parser.add_argument("--tokens", type=int, default=120)
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args()
    path = Path(args.model) if Path(args.model).is_file() else llamaspec.fetch(args.model, progress=False)
    model = Model(path)
    moved = []
    for text in PROMPTS[:3]:
        prompt = model.tokenize(text)
        tokens, ref = alone(model, prompt, args.tokens)
        best = ref.argmax(axis=1)
        gap = margin(ref, best)  # the top-1/top-2 gap
        for seed in range(args.seeds):
            rows = among_others(model, prompt, tokens, np.random.default_rng(seed))
            moved.append(np.abs(margin(rows, best) - gap))
    moved = np.concatenate(moved)
    print(f"{path.name}: {len(moved)} rows; the top-1/top-2 gap moved by at most {moved.max():.3f} "
          f"(99.9%: {np.quantile(moved, 0.999):.3f}, 99%: {np.quantile(moved, 0.99):.3f}, "
          f"median {np.median(moved):.3f})")


if __name__ == "__main__":
    main()
