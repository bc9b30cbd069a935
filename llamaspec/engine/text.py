"""From token bytes to text: incremental UTF-8 decoding and stop strings."""

from __future__ import annotations

import codecs
from typing import Optional, Sequence


class TextStream:
    """Decodes token pieces into text and cuts it at the first stop string.

    :meth:`push` returns only text that can no longer turn out to be the start of a stop
    string, so a partial stop string is never emitted. ``text`` is the final text
    (without the stop string) once :attr:`stopped` is set or :meth:`flush` was called.
    """

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self.stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self._emitted = 0
        self.stopped = False
        self.stop_string: Optional[str] = None  # the stop string that ended the text, if one did
        self.incomplete = 0

    @property
    def released(self) -> str:
        """The text pushed so far that can no longer turn out to be part of a stop string."""
        return self.text[:self._emitted]

    def push(self, piece: bytes) -> str:
        """Add one token's bytes; return the text that became safe to show."""
        if self.stopped:
            return ""
        self.text += self._decoder.decode(piece)
        return self._release(final=False)

    def flush(self) -> str:
        """End of generation: return whatever was held back. A character whose bytes the
        generation did not finish (it ended inside a multi-byte character) is left out, never
        shown as U+FFFD; ``incomplete`` says how many bytes were."""
        if self.stopped:
            return ""
        self.incomplete = len(self._decoder.getstate()[0])
        self._decoder.reset()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        start = self._emitted
        hits = [(i, s) for i, s in ((self.text.find(s, start), s) for s in self.stop) if i >= 0]
        if hits:
            cut, self.stop_string = min(hits, key=lambda hit: hit[0])
            self.text = self.text[:cut]
            self.stopped = True
        else:
            cut = len(self.text) if final else len(self.text) - self._held_back()
        self._emitted = max(cut, start)
        return self.text[start:self._emitted]

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is the beginning of a stop string."""
        longest = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), longest, -1):
                if self.text.endswith(s[:k]):
                    longest = k
                    break
        return longest
