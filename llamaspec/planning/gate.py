"""Whether asking the draft sources is worth its own time this step.

Asking takes time of llamaspec's own, outside llama_decode: every cheap source proposes and the
planner chooses (about 0.5-1 ms a step). Beside a 35 ms decode (Qwen2.5-Coder-1.5B on a 2-core
CPU) that is nothing; beside a 1.5 ms one (SmolLM2-135M on an H200) it is more than half a
token, and a text that gives nothing to copy decoded a third slower with every source asked
than plainly. So the speculator asks only while asking pays::

    gain  = accepted tokens - (the step's planned cost - a plain step's)   single-token decodes
    time  = what asking took (measured), in single-token decodes

Both are decayed means over the steps that asked. While ``gain < time`` the sources are asked
only every ``wait`` steps, ``wait`` doubling after each ask that does not pay (up to MAX_WAIT);
an ask that pays by itself, or a mean that pays again, asks every step. An ask whose candidates
foresaw the step's tokens (a copy starting: lookup trusts it only after a few tokens in step)
asks again the next step, ``wait`` unchanged. Between asks a step is plain; the sources still
learn from every step, so a copy found at the next ask is in step.

The first ask of a text is left out of ``time``: it indexes the prompt (25 ms for the bench's
code_edit prompt on the 2-core CPU), a cost once per text. Nothing measured, nothing gated: a
replay that charges no time for asking asks every step.

DECAY, START_GAIN and MAX_WAIT were chosen by replaying the 35 recorded answers in tests/data
on the H200's curve with asking charged 0.55 and 0.2 single-token decodes: the speed-ups'
geometric mean 0.97x and 1.19x with every step asking, 1.18x and 1.28x gated; the worst answer
0.63x and 0.79x, gated 0.87x and 0.92x; the answers that copy ask 94-100% of their steps. On
the 2-core CPU's curve at 0.05: 1.19x and 1.20x.
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
