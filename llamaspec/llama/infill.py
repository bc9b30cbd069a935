"""Fill-in-the-middle prompts: code before and after a gap, laid out with the model's FIM tokens.

``fim_tokens`` lays them out as llama-cpp-python's ``create_completion(prompt, suffix=...)`` does
(prefix, suffix, middle)::

    [BOS][FIM_PRE]{prefix}[FIM_SUF]{suffix}[FIM_MID]          BOS where the model adds one

``infill_tokens`` as llama-server's ``POST /infill`` does: the repository-level pattern of
Qwen2.5-Coder's paper where the model has its repository and file tokens, the project's other
files first::

    [FIM_REP]myproject\\n                      the repository, when the model has the token
    [FIM_SEP]{filename}\\n{text}  ...          each extra file given (input_extra)
    [FIM_SEP]filename\\n                       the file being edited
    [BOS]                                     where the model adds one
    [FIM_PRE]{prefix}{prompt}[FIM_SUF]{suffix}[FIM_MID]

The model writes the middle and ends with an end-of-generation token. (Qwen2.5-Coder-1.5B-Instruct
ends a function body there with the first layout, and with the second goes on past the suffix
when no other file is given: the first serves the OpenAI and Python APIs.) llama-server also cuts
a long prefix and suffix to fit one batch; here the whole text is read (the context decides).
"""

from __future__ import annotations

from typing import Dict, List, Protocol, Sequence

from ..errors import ConfigError

REPOSITORY = "myproject\n"  # llama-server's names for the repository and the file being edited
FILENAME = "filename\n"
SNIPPET = "\n\n--- snippet ---\n\n"  # between extra files, for a model without a file token


class Vocabulary(Protocol):
    path: object
    add_bos: bool
    bos: int

    def fim_tokens(self) -> Dict[str, int]: ...

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> List[int]: ...


def fim_tokens(model: Vocabulary, prefix: str, suffix: str) -> List[int]:
    """The prompt asking ``model`` for the text between ``prefix`` and ``suffix`` (llama-cpp-python's
    layout); ConfigError for a model without FIM tokens."""
    fim = _fim(model)
    return ([model.bos] if model.add_bos else []) + [fim["pre"]] + _text(model, prefix) + [fim["suf"]] \
        + _text(model, suffix) + [fim["mid"]]


def infill_tokens(model: Vocabulary, prefix: str, suffix: str, extra: Sequence[Dict[str, str]] = (),
                  prompt: str = "") -> List[int]:
    """llama-server's /infill prompt: the text between ``prefix`` (then ``prompt``, special tokens
    read) and ``suffix``, after ``extra`` files of the project ({"filename", "text"})."""
    fim = _fim(model)
    tokens = [fim["rep"]] + _text(model, REPOSITORY) if "rep" in fim else []
    for chunk in extra:
        if "sep" in fim:
            tokens += [fim["sep"]] + _text(model, chunk.get("filename", "tmp") + "\n")
        else:
            tokens += _text(model, SNIPPET)
        tokens += _text(model, chunk["text"])
    if "sep" in fim:
        tokens += [fim["sep"]] + _text(model, FILENAME)
    if model.add_bos:  # after the project's files, where llama-server puts it
        tokens.append(model.bos)
    return (tokens + [fim["pre"]] + _text(model, prefix) + model.tokenize(prompt, add_special=False, parse_special=True)
            + [fim["suf"]] + _text(model, suffix) + [fim["mid"]])


def _fim(model: Vocabulary) -> Dict[str, int]:
    fim = model.fim_tokens()
    missing = [name for name in ("pre", "suf", "mid") if name not in fim]
    if missing:
        name = getattr(model.path, "name", "this model")
        raise ConfigError(f"{name} has no fill-in-the-middle tokens ({', '.join(missing)} missing), so it cannot "
                          f"fill a gap between a prompt and a suffix; use a code model such as Qwen2.5-Coder")
    return fim


def _text(model: Vocabulary, text: str) -> List[int]:
    return model.tokenize(text, add_special=False, parse_special=False)
