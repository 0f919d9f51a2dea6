r"""A rank's output bytes into the lines shown for it.  [executor]

* ``\n`` ends a line (``\r\n`` too);
* ``\r`` alone redraws the line (a tqdm bar, a progress counter): only the latest state is kept,
  and it is shown when the line ends, or every :data:`PROGRESS_EVERY_S` seconds while it is being
  redrawn, so a long progress bar never grows into one huge line;
* a line longer than :data:`MAX_LINE` bytes is cut there and ends with
  ``[... N more bytes cut]``: a printed tensor or a runaway line cannot flood the log channel.

Example::

    lines = Lines(print)
    lines.feed(b"epoch 1\r50%\r100%\nnext")   # prints "100%" (the redrawn line's latest state)
    lines.close()                               # prints "next"
"""

from __future__ import annotations

import re
import time
from typing import Callable

MAX_LINE = 16 * 1024
PROGRESS_EVERY_S = 5.0
_SEPARATORS = re.compile(rb"([\r\n])")


class Lines:
    """Feed bytes with :meth:`feed`, call :meth:`close` at the end; ``emit(text)`` gets each line."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self._emit = emit
        self._buf = bytearray()
        self._cut = 0  # bytes of the current line beyond MAX_LINE
        self._cr = False  # the last byte seen was a lone \r (so far)
        self._shown = time.monotonic()

    def feed(self, data: bytes) -> None:
        for token in _SEPARATORS.split(data):
            if not token:
                continue
            if token == b"\n":
                self._cr = False
                self._end()
            elif token == b"\r":
                if self._cr:  # \r\r: a redraw of nothing
                    self._redraw()
                self._cr = True
            else:
                if self._cr:  # \r then text: the line is redrawn
                    self._redraw()
                    self._cr = False
                room = MAX_LINE - len(self._buf)
                self._buf += token[:room]
                self._cut += max(0, len(token) - room)

    def close(self) -> None:
        if self._buf or self._cut:
            self._end()

    def _redraw(self) -> None:
        now = time.monotonic()
        if self._buf and now - self._shown >= PROGRESS_EVERY_S:
            self._end()  # show the progress so far, now and then
        self._buf.clear()
        self._cut = 0

    def _end(self) -> None:
        text = self._buf.decode("utf-8", "replace")
        if self._cut:
            text += f" [... {self._cut} more bytes cut]"
        self._emit(text)
        self._buf.clear()
        self._cut = 0
        self._shown = time.monotonic()
