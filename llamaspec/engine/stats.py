"""Statistics of one generation. Names follow llama.cpp's summaries where the meaning is the same."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence

if TYPE_CHECKING:
    from .engine import Step


@dataclass
class SourceStats:
    """One draft source: candidate tokens verified, of those accepted, and steps it was verified in."""

    drafted: int = 0
    accepted: int = 0
    steps: int = 0


@dataclass
class DraftCounts:
    """Candidate tokens verified and, of those, accepted: ``n_drafted`` / ``n_accept`` /
    ``accept`` mean what llama-speculative-simple prints. With several candidates in one step a
    token proposed by two sources is one verified row; ``sources`` counts it for each. What a
    generation reports (Stats) and a replay predicts (measure.replay.ReplayStats) both count so."""

    n_drafted: int = 0
    n_accept: int = 0
    sources: Dict[str, SourceStats] = field(default_factory=dict)

    @property
    def accept(self) -> float:
        """Acceptance rate in percent (llama.cpp's ``accept``)."""
        return 100.0 * self.n_accept / self.n_drafted if self.n_drafted else 0.0

    def count(self, n_drafted: int, drafted: Mapping[str, int], path_sources: Sequence[Sequence[str]]) -> None:
        """One verified step: ``n_drafted`` candidate tokens, ``drafted[name]`` of them each
        source's, and its accepted tokens' sources (``path_sources``, one entry a token)."""
        self.n_drafted += n_drafted
        self.n_accept += len(path_sources)
        for name, n in drafted.items():
            s = self.sources.setdefault(name, SourceStats())
            s.drafted += n
            s.steps += 1
        for names in path_sources:
            for name in names:
                self.sources.setdefault(name, SourceStats()).accepted += 1


@dataclass
class Stats(DraftCounts):
    """What happened in one generation (besides DraftCounts).

    ``n_predict`` counts emitted tokens (an end-of-generation token included), ``n_first`` those
    of them the call that read the prompt chose: ``t_prompt`` runs to its end, ``t_decode`` from
    there on, as llama-server's ``prompt_ms`` and ``predicted_ms``. Times are wall-clock seconds.
    """

    strategy: str = "plain"
    seed: Optional[int] = None  # the seed sampling used (drawn at random when none was given); None when greedy
    stop_reason: str = ""  # as Result.stop_reason
    n_prompt: int = 0  # prompt tokens
    n_prompt_eval: int = 0  # of those, evaluated now (the rest were reused from the KV cache)
    t_prompt: float = 0.0
    n_predict: int = 0
    n_first: int = 0  # of which, the tokens of the call that read the prompt (its time is t_prompt's)
    n_target_calls: int = 0  # target llama_decode calls that chose tokens (the prompt's included)
    n_asked: int = 0  # of which, steps that asked the draft sources (see planning.gate)
    t_decode: float = 0.0  # generation loop, drafting included
    t_plan: float = 0.0  # of which, asking the sources and planning (drafting included)
    t_draft: float = 0.0  # of which, a draft model drafting
    t_llama: float = 0.0  # of which, spent inside llama_decode (every model)
    t_grammar: float = 0.0  # of which, following the text's grammar (masks, checks, forced tokens)
    drafted_by_pos: List[int] = field(default_factory=list)  # steps that verified a token at depth i + 1
    accepted_by_pos: List[int] = field(default_factory=list)  # steps that accepted one there
    n_branches: int = 0  # branches of the verified tries (their leaves), summed over the steps
    idle: Dict[str, str] = field(default_factory=dict)  # why an expensive source did not run, last time

    @property
    def tokens_per_call(self) -> float:
        return self.n_predict / self.n_target_calls if self.n_target_calls else 0.0

    @property
    def prompt_tps(self) -> float:
        return self.n_prompt_eval / self.t_prompt if self.t_prompt > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        """The tokens after the first call over the time after it (``t_decode``), as
        llama-server's ``predicted_per_second``: the first call's tokens came with the prompt."""
        return (self.n_predict - self.n_first) / self.t_decode if self.t_decode > 0 else 0.0

    @property
    def python_share(self) -> float:
        """Share of the generation loop's wall time spent outside llama_decode (our own code)."""
        return outside_llama(self.t_llama, self.t_decode)

    @property
    def speculative_steps(self) -> int:
        """Target calls that verified at least one candidate token."""
        return self.drafted_by_pos[0] if self.drafted_by_pos else 0

    @property
    def accept_by_position(self) -> List[float]:
        """Share of steps verifying a token at depth i + 1 that accepted one there."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_pos, self.drafted_by_pos)]

    def record_step(self, step: "Step", kept: Optional[int] = None) -> None:
        """One target call. ``kept``: how many of its tokens count (fewer when the generation
        stopped inside the step: an end-of-generation token or a stop string)."""
        kept = len(step.tokens) if kept is None else kept
        n_accepted = min(step.n_accepted, kept)
        self.n_target_calls += 1
        self.n_asked += step.asked
        self.n_predict += kept
        self.count(step.n_drafted, step.drafted, step.path_sources[:n_accepted])
        self.t_plan += step.t_plan
        self.t_draft += step.t_draft
        self.n_branches += step.branches
        grow = step.depth - len(self.drafted_by_pos)
        if grow > 0:
            self.drafted_by_pos.extend([0] * grow)
            self.accepted_by_pos.extend([0] * grow)
        for i in range(step.depth):
            self.drafted_by_pos[i] += 1
        for i in range(n_accepted):
            self.accepted_by_pos[i] += 1
        for name, why in step.idle.items():
            self.idle[name] = why
        for name in step.drafted:
            self.idle.pop(name, None)

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
        if self.sources:
            line += " (" + ", ".join(f"{name} {s.accepted}/{s.drafted}" for name, s in sorted(self.sources.items())) + ")"
        if self.seed is not None:
            line += f", seed {self.seed}"
        if self.stop_reason in ("context", "interrupted"):
            line += ", stopped: " + ("the context is full" if self.stop_reason == "context" else "interrupted")
        return line


def outside_llama(t_llama: float, t_decode: float) -> float:
    """Share of ``t_decode`` seconds of a generation loop not spent in ``t_llama`` seconds of llama_decode."""
    return max(0.0, 1 - t_llama / t_decode) if t_decode > 0 else 0.0


def sum_sources(stats: Iterable[Stats]) -> Dict[str, SourceStats]:
    """Each source's counts summed over several generations."""
    total: Dict[str, SourceStats] = {}
    for s in stats:
        for name, src in s.sources.items():
            mine = total.setdefault(name, SourceStats())
            mine.drafted += src.drafted
            mine.accepted += src.accepted
            mine.steps += src.steps
    return total
