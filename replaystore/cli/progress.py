"""A one-line progress report on standard error, for ``verify`` and ``compact`` in a terminal (and
nothing where standard error is a file or a pipe): the CLI needs no progress-bar library."""

from __future__ import annotations

import sys
import time
from typing import Self

#: seconds between two redraws
EVERY = 0.1


class Progress:
    """``update(label, done, total)`` redraws one line; leaving the ``with`` block clears it."""

    def __init__(self, *, quiet: bool = False) -> None:
        self.shown = not quiet and sys.stderr.isatty()
        self._last = 0.0
        self._width = 0

    def update(self, label: str, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.shown or (now - self._last < EVERY and done < total):
            return
        self._last = now
        line = f"{label} {done:,}/{total:,}" + (f" ({100 * done / total:.0f}%)" if total else "")
        sys.stderr.write("\r" + line.ljust(self._width))
        sys.stderr.flush()
        self._width = len(line)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.shown and self._width:
            sys.stderr.write("\r" + " " * self._width + "\r")
            sys.stderr.flush()
