"""Can a draft model speak for the target? The same checks llama.cpp makes, with a clearer error."""

from __future__ import annotations

from typing import Optional

from .binding import Model
from ..errors import VocabMismatchError

MAX_SIZE_DIFFERENCE = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
CHECK_START_TOKEN_ID = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID


def first_difference(target: Model, draft: Model) -> Optional[int]:
    """The first token id (from CHECK_START_TOKEN_ID on) whose text differs, or None."""
    for i in range(CHECK_START_TOKEN_ID, min(target.n_vocab, draft.n_vocab)):
        if target.token_text(i) != draft.token_text(i):
            return i
    return None


def check_compatible(target: Model, draft: Model) -> None:
    """Raise VocabMismatchError, naming the first differing token, unless ``draft`` can draft for ``target``."""
    reasons = []
    if target.vocab_type != draft.vocab_type:
        reasons.append(f"vocab type {draft.vocab_type} vs {target.vocab_type}")
    if target.add_bos != draft.add_bos or (target.add_bos and target.bos != draft.bos):
        reasons.append(f"BOS (add={draft.add_bos}, id={draft.bos}) vs (add={target.add_bos}, id={target.bos})")
    if target.add_eos != draft.add_eos or (target.add_eos and target.eos != draft.eos):
        reasons.append(f"EOS (add={draft.add_eos}, id={draft.eos}) vs (add={target.add_eos}, id={target.eos})")
    if abs(target.n_vocab - draft.n_vocab) > MAX_SIZE_DIFFERENCE:
        reasons.append(f"{draft.n_vocab} vs {target.n_vocab} tokens")
    i = first_difference(target, draft)
    if i is not None:
        reasons.append(f"first differing token {i}: draft {draft.token_text(i)!r} vs target {target.token_text(i)!r}")
    if reasons:
        raise VocabMismatchError(
            f"draft {draft.path.name} cannot draft for {target.path.name} (draft vs target: "
            + "; ".join(reasons) + ")")
