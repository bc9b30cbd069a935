"""Statistics of one generation. Names follow llama.cpp's summaries where the meaning is the same."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class Stats:
    """What happened in one generation.

    ``n_predict`` counts emitted tokens; ``n_drafted`` / ``n_accept`` / ``accept`` mean what
    llama-speculative-simple prints. Times are wall-clock seconds.
    """

    strategy: str = "plain"
    n_prompt: int = 0  # prompt tokens
    n_prompt_eval: int = 0  # of those, evaluated now (the rest were reused from the KV cache)
    t_prompt: float = 0.0
    n_predict: int = 0
    n_drafted: int = 0
    n_accept: int = 0
    n_target_calls: int = 0  # target llama_decode calls while generating
    t_decode: float = 0.0  # generation loop, drafting included
    t_draft: float = 0.0  # of which, spent proposing drafts
    t_llama: float = 0.0  # of which, spent inside llama_decode (every model)
    drafted_by_pos: List[int] = field(default_factory=list)  # drafts that reached position i
    accepted_by_pos: List[int] = field(default_factory=list)  # drafts accepted at position i
    extra: Dict[str, int] = field(default_factory=dict)  # the strategy's own counters (lookahead: pool_size, pool_hits)

    @property
    def accept(self) -> float:
        """Acceptance rate in percent (llama.cpp's ``accept``)."""
        return 100.0 * self.n_accept / self.n_drafted if self.n_drafted else 0.0

    @property
    def tokens_per_call(self) -> float:
        return self.n_predict / self.n_target_calls if self.n_target_calls else 0.0

    @property
    def prompt_tps(self) -> float:
        return self.n_prompt_eval / self.t_prompt if self.t_prompt > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return self.n_predict / self.t_decode if self.t_decode > 0 else 0.0

    @property
    def python_share(self) -> float:
        """Share of the generation loop's wall time spent outside llama_decode (our own code)."""
        return max(0.0, 1 - self.t_llama / self.t_decode) if self.t_decode > 0 else 0.0

    @property
    def accept_by_position(self) -> List[float]:
        """Share of drafts reaching position i that were accepted there."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_pos, self.drafted_by_pos)]

    def record_step(self, n_drafted: int, n_accepted: int, n_emitted: int, depth: Optional[int] = None) -> None:
        """One target call. ``depth``: the longest candidate when several were verified side
        by side (the by-position counts follow it), else ``n_drafted``."""
        self.n_target_calls += 1
        self.n_predict += n_emitted
        self.n_drafted += n_drafted
        self.n_accept += n_accepted
        n_drafted = n_drafted if depth is None else depth
        grow = n_drafted - len(self.drafted_by_pos)
        if grow > 0:
            self.drafted_by_pos.extend([0] * grow)
            self.accepted_by_pos.extend([0] * grow)
        for i in range(n_drafted):
            self.drafted_by_pos[i] += 1
        for i in range(n_accepted):
            self.accepted_by_pos[i] += 1

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d.update(accept=self.accept, tokens_per_call=self.tokens_per_call, prompt_tps=self.prompt_tps,
                 decode_tps=self.decode_tps, python_share=self.python_share,
                 accept_by_position=self.accept_by_position)
        return d

    def summary(self) -> str:
        """One line, for the end of a reply."""
        line = (f"{self.strategy}: {self.n_predict} tokens, {self.decode_tps:.1f} t/s decode, "
                f"{self.prompt_tps:.1f} t/s prompt ({self.n_prompt_eval}/{self.n_prompt} evaluated), "
                f"{self.tokens_per_call:.2f} tokens/call")
        if self.n_drafted:
            line += f", n_drafted = {self.n_drafted}, n_accept = {self.n_accept}, accept = {self.accept:.1f}%"
        for key, value in self.extra.items():
            line += f", {key} = {value}"
        return line
