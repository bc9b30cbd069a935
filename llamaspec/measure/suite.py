"""The shipped prompt suites: ``data/bench_suite.json``, prompts where speculation should pay
(the answer copies the prompt) and where it should not, and ``data/structured_suite.json``,
prompts whose answer follows a JSON schema (held apart from the answers the priors were fitted
on)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..llama.binding import Model
from ..llama.chat import ChatTemplate, Message
from ..errors import ConfigError

SUITE_FILE = Path(__file__).resolve().parent.parent / "data" / "bench_suite.json"
SUITES = {"default": SUITE_FILE, "structured": SUITE_FILE.parent / "structured_suite.json"}


@dataclass(frozen=True)
class SuitePrompt:
    """A user message (and system message); ``schema``: the JSON schema its answer follows."""

    name: str
    description: str
    user: str
    system: str = ""
    schema: Optional[Dict[str, Any]] = None

    @property
    def messages(self) -> List[Message]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + [{"role": "user", "content": self.user}]


def load_suite(names: Optional[Sequence[str]] = None, path: Path = SUITE_FILE) -> List[SuitePrompt]:
    """The shipped prompts, or those named (in that order); ConfigError for an unknown name.
    ``path``: a suite's file (SUITES)."""
    suite = {p["name"]: SuitePrompt(**p) for p in json.loads(path.read_text(encoding="utf-8"))}
    if names is None:
        return list(suite.values())
    unknown = [n for n in names if n not in suite]
    if unknown:
        raise ConfigError(f"unknown prompt {unknown[0]!r}; the suite has: {', '.join(suite)}")
    return [suite[n] for n in names]


def render(model_path: Path, prompts: Sequence[SuitePrompt]) -> List[str]:
    """Each prompt in the model's chat template (read from the file, the weights not loaded)."""
    vocab = Model(model_path, vocab_only=True)
    try:
        template = ChatTemplate(vocab)
        return [template.render(p.messages) for p in prompts]
    finally:
        vocab.close()


def greedy_answers(spec: Any, n_tokens: int, prompts: Optional[Sequence[SuitePrompt]] = None
                   ) -> Dict[str, Dict[str, List[int]]]:
    """Each prompt (default: the whole suite) in ``spec``'s chat template, as tokens, and the
    greedy answer of at most ``n_tokens`` that ``spec`` (a LlamaSpec) gives from an empty cache:
    the token streams that replays and ``llamaspec agreement`` read."""
    answers = {}
    for prompt in prompts if prompts is not None else load_suite():
        tokens = spec.tokenize(spec.format_chat(prompt.messages), add_special=False)
        spec.reset()
        answers[prompt.name] = {"prompt": tokens, "answer": spec.generate(tokens, max_tokens=n_tokens, temperature=0,
                                                                            json_schema=prompt.schema).tokens}
    return answers
