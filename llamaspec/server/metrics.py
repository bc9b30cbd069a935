"""``GET /metrics``: what a server has done, in Prometheus' text exposition format.

llama-server's names where it has the figure (``llamacpp:prompt_tokens_total``, ...), so that
dashboards made for it work; llamaspec's own under ``llamaspec:``, each draft source's with a
``source`` label. Only counts and seconds: nothing of a prompt's or a reply's text. The counts
live on the server's Metrics object (one per app), written by the worker threads that finish
generations and read by the scrape.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Dict, Iterator, List, Tuple

from ..engine.generation import Chunk, Result

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# name, type, help: the figures with no label, in the order they are written
PLAIN_METRICS = (
    ("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed."),
    ("llamacpp:prompt_seconds_total", "counter", "Prompt process time"),
    ("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed."),
    ("llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time"),
    ("llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls"),
    ("llamacpp:requests_processing", "gauge", "Number of requests processing."),
    ("llamacpp:requests_deferred", "gauge", "Number of requests deferred."),
    ("llamaspec:requests_total", "counter", "Generation requests that took their turn."),
    ("llamaspec:generations_total", "counter", "Generations finished (a request of n choices has n)."),
    ("llamaspec:prompt_tokens_cached_total", "counter", "Prompt tokens reused from the KV cache, not read again."),
    ("llamaspec:draft_steps_asked_total", "counter", "Target decodes that asked the draft sources."),
    ("llamaspec:draft_tokens_total", "counter", "Candidate tokens verified (a token two sources proposed once)."),
    ("llamaspec:draft_tokens_accepted_total", "counter", "Candidate tokens accepted."),
)
# name, type, help, the SourceStats field: each source's figures, labelled by source
SOURCE_METRICS = (
    ("llamaspec:source_tokens_verified_total", "counter", "A source's candidate tokens verified.", "drafted"),
    ("llamaspec:source_tokens_accepted_total", "counter", "A source's candidate tokens accepted.", "accepted"),
    ("llamaspec:source_steps_total", "counter", "Target decodes that verified a source's candidates.", "steps"),
)
PROVENANCE = ("llamaspec:tokens_generated_by_source_total", "counter",
              "Generated tokens by provenance: the source whose candidate supplied it, or plain.")


class Metrics:
    """The server's counts, summed over every generation it finished (``record``), and its queue
    read at each scrape (``render``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plain: Dict[str, float] = {name: 0.0 for name, _, _ in PLAIN_METRICS}
        self._sources: Dict[str, Dict[str, int]] = {}  # source -> SourceStats field -> count
        self._provenance: "Counter[str]" = Counter()

    def request(self) -> None:
        """A request took its turn."""
        with self._lock:
            self._plain["llamaspec:requests_total"] += 1

    def record(self, result: Result) -> None:
        """One generation finished (its last chunk came)."""
        s = result.stats
        with self._lock:
            p = self._plain
            p["llamacpp:prompt_tokens_total"] += s.n_prompt_eval
            p["llamacpp:prompt_seconds_total"] += s.t_prompt
            p["llamacpp:tokens_predicted_total"] += s.n_predict
            p["llamacpp:tokens_predicted_seconds_total"] += s.t_decode
            p["llamacpp:n_decode_total"] += s.n_target_calls
            p["llamaspec:generations_total"] += 1
            p["llamaspec:prompt_tokens_cached_total"] += s.n_prompt - s.n_prompt_eval
            p["llamaspec:draft_steps_asked_total"] += s.n_asked
            p["llamaspec:draft_tokens_total"] += s.n_drafted
            p["llamaspec:draft_tokens_accepted_total"] += s.n_accept
            for name, src in s.sources.items():
                mine = self._sources.setdefault(name, {"drafted": 0, "accepted": 0, "steps": 0})
                mine["drafted"] += src.drafted
                mine["accepted"] += src.accepted
                mine["steps"] += src.steps
            self._provenance.update(result.sources)

    def render(self, processing: int, deferred: int) -> str:
        """The text exposition of every figure; ``processing`` and ``deferred``: the queue's now."""
        with self._lock:
            values = {**self._plain, "llamacpp:requests_processing": processing,
                      "llamacpp:requests_deferred": deferred}
            sources = {name: dict(counts) for name, counts in self._sources.items()}
            provenance = dict(self._provenance)
        lines: List[str] = []
        for name, kind, text in PLAIN_METRICS:
            lines += _family(name, kind, text, [("", values[name])])
        for name, kind, text, field in SOURCE_METRICS:
            lines += _family(name, kind, text, [(_label(s), sources[s][field]) for s in sorted(sources)])
        name, kind, text = PROVENANCE
        lines += _family(name, kind, text, [(_label(s), provenance[s]) for s in sorted(provenance)])
        return "\n".join(lines) + "\n"


def _family(name: str, kind: str, text: str, samples: List[Tuple[str, float]]) -> List[str]:
    return [f"# HELP {name} {text}", f"# TYPE {name} {kind}"] + [f"{name}{labels} {_number(v)}"
                                                                  for labels, v in samples]


def _label(source: str) -> str:
    escaped = source.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")
    return f'{{source="{escaped}"}}'


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class Counted:
    """A LlamaSpec or a batcher whose generations ``metrics`` counts as they finish: its
    ``stream`` and ``sample_stream`` read through CountedStream; the rest is the wrapped one's."""

    def __init__(self, inner: Any, metrics: Metrics) -> None:
        self._inner, self._metrics = inner, metrics

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def stream(self, prompt: Any, **options: Any) -> "CountedStream":
        return CountedStream(self._inner.stream(prompt, **options), self._metrics)

    def sample_stream(self, prompt: Any, n: int, **options: Any) -> "CountedStream":
        return CountedStream(self._inner.sample_stream(prompt, n, **options), self._metrics)


class CountedStream:
    """A Stream (chunks) or RequestStream ((choice, chunk) pairs) that records each last chunk's
    result; stopping, closing and the rest are the wrapped stream's."""

    def __init__(self, inner: Any, metrics: Metrics) -> None:
        self._inner, self._metrics = inner, metrics
        self._items: Iterator[Any] = iter(inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __iter__(self) -> "CountedStream":
        return self

    def __next__(self) -> Any:
        item = next(self._items)
        chunk = item if isinstance(item, Chunk) else item[1]
        if chunk.result is not None:
            self._metrics.record(chunk.result)
        return item
