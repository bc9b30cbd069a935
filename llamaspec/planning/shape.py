"""What a decode costs after the decodes before it, where their row counts matter (a GPU's
captured graphs).

llama.cpp's CUDA backend replays a decode as one captured CUDA graph when the two decodes before
it had its shape; a decode of another row count runs its kernels one by one, and so do the next
two of the new shape (one runs, one is captured). A change of row count thus costs a few
single-token decodes more (``CostCurve.switch``; scripts/gpu_graphs.py measures it, and
docs/results.md, "Tuning the planner by replaying recorded answers", has an H200's).

So a decode that changes the row count is charged the switch, and a decode of fewer rows than
the last one is padded up to its rows (rows of logits on a scratch sequence, emptied after it)
where that costs less than the switch. Keeping a shape wider than one row costs what it costs
over a single row, less the drafted tokens its decodes accept; once that loss reaches the
switch, the shape is left (rent or buy: never more than twice the better of the two). The
other way alike: while decodes stay on one row, what the plans would have scored more had a
change cost nothing adds up (recent steps' only), and once that reaches the switch the next
decode is planned as if none were charged::

    after a verify of 8 rows (1.36 single decodes replayed; switch 2.66):
    a plain step     1 row + 7 padding rows      1.36   (1 row alone: 1.00 + 2.66)
    a 4-row verify   4 rows + 4 padding rows     1.36
    a 12-row verify  12 rows                     2.55 + 2.66
    eight plain steps that accept nothing lose 8 x 0.36 >= 2.66: the next decode takes its own rows

    on one row: plain steps whose best 4-row verify would have scored 0.4, 0.9, 0.7, 0.8 more
    without the switch: 2.69 >= 2.66 forgone (decayed by 0.97 a step), the next plan's rows
    cost what they cost replayed

Where row counts cost nothing (a CPU: ``switch`` == 0) nothing is padded or charged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple


def decode(rows: int, shape: int, switch: float, verify: Callable[[int], float]) -> Tuple[int, float]:
    """(rows decoded, cost) of a decode of ``rows`` rows after one of ``shape`` rows (0: none, or
    one that is being left), each of n rows costing ``verify(n)`` replayed and ``switch`` more
    when its count changes: padded up to ``shape`` where that costs no more than the change."""
    if switch <= 0 or not shape or rows == shape:
        return rows, verify(rows)
    if rows < shape and verify(shape) <= verify(rows) + switch:
        return shape, verify(shape)
    return rows, verify(rows) + switch


@dataclass
class Shape:
    """The row count of the last decode (``rows``), how many decodes had it in a row, and what
    keeping it has lost (``loss``). ``switch``: what a decode of another row count costs more, in
    single-token decodes (0: row counts cost nothing)."""

    # Per single-row decode: what was forgone counts for about the last thirty. Chosen by
    # replaying the recorded answers on the H200's curve: better than never entering, a shorter
    # memory or summing them all (docs/results.md, "Tuning the planner by replaying recorded
    # answers").
    FORGONE_DECAY = 0.97

    switch: float = 0.0
    rows: int = 0
    same: int = 0  # decodes of ``rows`` rows in a row, less one
    loss: float = 0.0  # what keeping ``rows`` rows cost over single rows, less what it accepted
    forgone: float = 0.0  # on single rows: what wider ones would have gained, by the plans' estimates

    @property
    def kept(self) -> int:
        """The row count the next decode is planned against: the last one's, or 0 (none) once
        keeping it has lost a switch's worth, or once single rows have forgone a switch's worth."""
        if self.loss >= self.switch or (self.rows == 1 and self.forgone >= self.switch > 0):
            return 0
        return self.rows

    def warm(self, rows: int) -> bool:
        """Whether a decode of ``rows`` rows now costs what its shape costs replayed (the two
        before it had its shape; always, where row counts cost nothing): only such decodes
        refine the cost curve."""
        return self.switch <= 0 or (rows == self.rows and self.same >= 1)

    def decoded(self, rows: int, accepted: int, verify: Optional[Callable[[int], float]],
                forgone: float = 0.0) -> None:
        """A decode of ``rows`` rows (padding included) ran and accepted ``accepted`` drafted
        tokens; ``verify(n)``: a decode of n rows replayed (None: no costs to weigh it by);
        ``forgone``: what its plan would have scored more had a change of row count cost nothing
        (``Choice.forgone``)."""
        if rows != self.rows:
            self.rows, self.same, self.loss, self.forgone = rows, 0, 0.0, 0.0
            return
        self.same += 1
        if self.switch > 0 and verify is not None:
            self.loss = max(0.0, self.loss + verify(rows) - verify(1) - accepted)
            if rows == 1:
                self.forgone = self.FORGONE_DECAY * self.forgone + forgone
