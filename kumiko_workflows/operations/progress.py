"""Progress output for long management commands.

On a terminal, one line redrawn in place (a bar, a percentage and a detail
text); anywhere else (a log file, a pipe, CI), plain lines now and then, so
the output stays readable after the fact.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

BAR_WIDTH = 28


def _plain(text: str) -> str:
    return text


class Progress:
    """Report ``done`` out of ``total`` to ``stream``.

    ``tty`` defaults to ``stream.isatty()``. In plain mode a line is written
    whenever another tenth of the work is done, or when ``interval`` seconds
    passed and something changed, and always at :meth:`finish`. On a
    terminal the line is redrawn at most every ``redraw`` seconds.
    """

    def __init__(
        self,
        total: int,
        label: str,
        stream: TextIO | Any,
        *,
        tty: bool | None = None,
        interval: float = 5.0,
        redraw: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = max(0, int(total))
        self.label = label
        self.stream = stream
        self.tty = bool(stream.isatty()) if tty is None else tty
        self.interval = interval
        self.redraw = redraw
        self.clock = clock
        self.done = 0
        self.detail = ""
        self._last_time = clock()
        self._last_tenth = 0
        self._last_line = ""
        self._drawn = False
        self._finished = False

    # --- public -------------------------------------------------------------

    def update(self, done: int, detail: str | None = None) -> None:
        """Set how much is done (and the detail text), and show it if due."""
        self.done = max(0, int(done))
        if detail is not None:
            self.detail = detail
        self._show(force=False)

    def advance(self, step: int = 1, detail: str | None = None) -> None:
        self.update(self.done + step, detail)

    def note(self, text: str) -> None:
        """Write a line of its own (above the bar on a terminal)."""
        if self.tty and self._drawn:
            self._write("\r\x1b[K")
        self._write(text + "\n")
        if self.tty and self._drawn:
            self._write(self._line())
        self._flush()

    def finish(self, detail: str | None = None) -> None:
        """Show the final state and end the line."""
        if self._finished:
            return
        if detail is not None:
            self.detail = detail
        self._show(force=True)
        if self.tty:
            self._write("\n")
            self._flush()
        self._finished = True

    # --- drawing ------------------------------------------------------------

    def fraction(self) -> float:
        return 1.0 if self.total == 0 else min(1.0, self.done / self.total)

    def _line(self) -> str:
        percent = int(self.fraction() * 100)
        counts = f"{self.done}/{self.total}"
        detail = f"  {self.detail}" if self.detail else ""
        if self.tty:
            filled = int(self.fraction() * BAR_WIDTH)
            bar = "#" * filled + "-" * (BAR_WIDTH - filled)
            return f"\r\x1b[K{self.label} [{bar}] {percent:3d}% {counts}{detail}"
        return f"{self.label}: {counts} ({percent}%){detail}"

    def _show(self, force: bool) -> None:
        now = self.clock()
        if self.tty:
            if force or now - self._last_time >= self.redraw or not self._drawn:
                self._write(self._line())
                self._flush()
                self._drawn = True
                self._last_time = now
            return
        line = self._line()
        tenth = int(self.fraction() * 10)
        changed = line != self._last_line
        if changed and (
            force or tenth > self._last_tenth or now - self._last_time >= self.interval
        ):
            self._write(line + "\n")
            self._flush()
            self._last_line = line
            self._last_tenth = tenth
            self._last_time = now

    def _write(self, text: str) -> None:
        # Django's OutputWrapper appends a newline and styles the text (stderr
        # in red) unless told otherwise.
        stream: Any = self.stream
        if hasattr(stream, "style_func"):
            stream.write(text, style_func=_plain, ending="")
        else:
            self.stream.write(text)

    def _flush(self) -> None:
        flush = getattr(self.stream, "flush", None)
        if flush is not None:
            flush()
