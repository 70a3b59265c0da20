"""Live progress of a sweep: points done, running and failed, the current point, elapsed, ETA."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tspbench.core.names import OK_STATUSES


class Progress:
    """Points done / running / failed, the current point, elapsed and ETA.

    On a terminal one status line is redrawn in place, with each finished point printed above
    it. Otherwise (logs, CI) every finished point is one line carrying the counts, and the
    status line is printed at most every ``quiet_s`` seconds while nothing finishes.
    """

    def __init__(
        self, total: int, stream: TextIO | None = None, quiet_s: float = 30.0, errors: TextIO | None = None
    ) -> None:
        self.total, self.stream = total, stream or sys.stdout
        self.errors = errors or sys.stderr  # warnings: the reader of stdout may be a pipe
        self.tty = self.stream.isatty()
        self.start, self.quiet_s = time.monotonic(), quiet_s
        self.done = self.running = self.bad = 0
        self.current = ""
        self._printed = time.monotonic()

    def update(self, running: int, current: str = "") -> None:
        self.running, self.current = running, current
        if self.tty:
            self._write("\r\x1b[K" + self.line())
        elif time.monotonic() - self._printed >= self.quiet_s:
            self._write(self.line() + "\n")

    def finished(self, status: str, line: str) -> None:
        """A point finished with ``status``; ``line`` says which and how."""
        self.done += 1
        self.bad += status not in OK_STATUSES
        self.note(f"[{self.done}/{self.total}] {status:>9}  {line}")

    def note(self, line: str) -> None:
        self._write(("\r\x1b[K" if self.tty else "") + line + "\n")
        if self.tty:
            self._write(self.line())

    def warn(self, line: str) -> None:
        """A line about something wrong (a damaged file moved aside), on the error stream."""
        if self.tty:
            self._write("\r\x1b[K")
        self.errors.write(line + "\n")
        self.errors.flush()
        if self.tty:
            self._write(self.line())

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else None
        text = (
            f"[{self.done}/{self.total} done, {self.running} running, {self.bad} failed] "
            f"elapsed {_clock(elapsed)}  ETA {_clock(eta) if eta is not None else '?'}"
        )
        return f"{text}  {self.current}" if self.current else text

    def _write(self, text: str) -> None:
        self._printed = time.monotonic()
        self.stream.write(text)
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self._write("\r\x1b[K" + self.line() + "\n")
        else:
            self._write(self.line() + "\n")


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
