"""Requests from any thread decoded together (continuous batching): one thread steps a Scheduler.

    batcher = spec.batcher(4)                    # 4 sequences, a context of their own
    stream = batcher.sample_stream(prompt, n=1, temperature=0)   # from any thread
    for index, chunk in stream: ...              # as the stepping thread accepts text

A request joins the batch at the next step and leaves it when its last sample stops; the
others never wait for it (a long prompt is read a chunk per step). Each lane keeps its KV
cache between requests, and a request goes to the lane whose cache holds most of its prompt.
``llamaspec serve --parallel N`` answers every request through one Batcher.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Sequence, Union

from ..errors import LlamaspecError
from .generation import make_config
from .engine import check_prompt
from .scheduler import Request, RequestStream, Scheduler

Prompt = Union[str, Sequence[int]]


class Batcher:
    """Steps ``scheduler`` on a thread of its own while it has work; ``owned``: what it decodes
    on (the target's context, a draft model's), each closed when it closes. ``tokens_of``: a prompt's
    tokens (validated); ``strategy``: the name results report."""

    def __init__(self, scheduler: Scheduler, owned: Sequence[Any], tokens_of: Callable[[Prompt], List[int]],
                 strategy: str) -> None:
        self.scheduler, self.owned = scheduler, list(owned)
        self._tokens_of, self._strategy = tokens_of, strategy
        self._wake = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="llamaspec-batcher", daemon=True)
        self._thread.start()

    @property
    def parallel(self) -> int:
        """Sequences decoded together at most."""
        return self.scheduler.n_lanes

    def sample_stream(self, prompt: Prompt, n: int = 1, **options: Any) -> RequestStream:
        """(sample index, Chunk) of ``n`` samples of ``prompt`` as they come (options as
        LlamaSpec.generate's); waits, first come first served, for ``n`` free sequences."""
        config = make_config(**options)
        request = Request(self._tokens_of(prompt), config, n, self._strategy)
        check_prompt(len(request.prompt), self.scheduler.limit)  # now, not when it joins the batch
        self.scheduler.check(request)  # its grammar compiled here, not while the stepping thread waits for the lock
        with self._wake:
            if self._closing:
                raise LlamaspecError("this batcher is closed")
            self.scheduler.submit(request)  # n above the lane count: ConfigError
            self._wake.notify()
        return RequestStream(request, self._cancel)

    def _cancel(self, request: Request) -> None:
        with self._wake:
            self.scheduler.cancel(request)
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._closing and not self.scheduler.busy:
                    self._wake.wait()
                if self._closing:
                    break
            try:
                self.scheduler.step()
            except Exception:  # noqa: BLE001 - the requests it ended carry the error to their readers
                pass
        self.scheduler.close()

    def close(self) -> None:
        """Stop every request (stop reason "interrupted"), the thread, and free the contexts."""
        with self._wake:
            if self._closing:
                return
            self._closing = True
            self._wake.notify()
        self._thread.join()
        for thing in self.owned:
            thing.close()

    def __enter__(self) -> "Batcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
