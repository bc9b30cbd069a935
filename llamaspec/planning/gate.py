"""Whether asking the draft sources is worth its own time this step.

Asking takes time of llamaspec's own, outside llama_decode: every cheap source proposes and the
planner chooses. Beside a large model's decode on a CPU that is nothing; beside a small model's
on a GPU it is a good part of a token, and a text that gives nothing to copy decoded slower
with every source asked than plainly. So the speculator asks only while asking pays::

    gain  = accepted tokens - (the step's planned cost - a plain step's)   single-token decodes
    time  = what asking took (measured), in single-token decodes

Both are decayed means over the steps that asked. While ``gain < time`` the sources are asked
only every ``wait`` steps, ``wait`` doubling after each ask that does not pay (up to MAX_WAIT);
an ask that pays by itself, or a mean that pays again, asks every step. An ask whose candidates
foresaw the step's tokens (a copy starting: lookup trusts it only after a few tokens in step)
asks again the next step, ``wait`` unchanged. Between asks a step is plain; the sources still
learn from every step, so a copy found at the next ask is in step.

The first ask of a text is left out of ``time``: it indexes the prompt, a cost once per text. Nothing measured, nothing gated: a
replay that charges no time for asking asks every step.

DECAY, START_GAIN and MAX_WAIT were chosen by replaying the recorded answers in tests/data on
the H200's curve, asking charged what it costs there: gated, the speed-ups' mean and the worst
answer rose, and the answers that copy still ask nearly every step (docs/results.md, "Tuning
the planner by replaying recorded answers").
"""

from __future__ import annotations


class Gate:
    DECAY = 0.9  # per step that asked: a mean over the last ten or so
    MAX_WAIT = 16  # steps from one ask to the next at most: a copy that starts is found within them
    # A new text asks until its own steps say otherwise: while this, decayed, outweighs the time
    START_GAIN = 0.5

    def __init__(self) -> None:
        self.gain = self.START_GAIN
        self.time = 0.0
        self.wait = 1  # steps from one ask to the next
        self.skip = 0  # steps left before the next ask
        self.asked = False  # whether the step under way asked
        self.learnt = 0  # steps that asked and were learnt from
        self._plain = 0.0  # what a plain step would have cost, this step

    def ask(self, plain_cost: float) -> bool:
        """Whether this step asks the sources; ``plain_cost``: a plain step's planned cost."""
        self.asked = self.skip <= 0
        if self.asked:
            self._plain = plain_cost
        else:
            self.skip -= 1
        return self.asked

    def plain(self, plain_cost: float) -> None:
        """A plain step's planned cost after all, where the step is planned with other limits than
        it was asked with (the rows of the lanes laid out before it, known once they are)."""
        self._plain = plain_cost

    def learn(self, accepted: int, cost: float, time: float, foresaw: bool = False) -> None:
        """The step under way accepted ``accepted`` candidate tokens for its planned ``cost``;
        asking took ``time`` (all in single-token decodes); ``foresaw``: a candidate held every
        token the step emitted, verified or not. Nothing when it did not ask."""
        if not self.asked:
            return
        gain = accepted - (cost - self._plain)
        d = self.DECAY
        self.gain = d * self.gain + (1 - d) * gain
        if self.learnt:
            self.time = d * self.time + (1 - d) * time if self.time > 0 else time
        self.learnt += 1
        if self.time <= 0 or gain >= time or self.gain >= self.time:
            self.wait = 1
        elif not foresaw:
            self.wait = min(2 * self.wait, self.MAX_WAIT)
        self.skip = 0 if foresaw else self.wait - 1
