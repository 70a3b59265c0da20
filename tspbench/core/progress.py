"""Progress of work a user waits for, reported by the code doing it to whoever shows it.

Sweeps, the fake world and calibrate take a ``Progress`` and report events to it: a piece of
work of so many units begins (``start``: a sweep's points, a calibration's steps, a fake
world's ranks), what is in flight (``update``), a unit finished (``finished``), a line of
information (``note``) or of trouble (``warn``), the end (``close``). Only tspbench.cli prints
(tests/project/test_architecture.py), so the CLI hands down one that draws them (a bar with an ETA
on a terminal, plain lines in logs: tspbench.cli.terminal). This base class only counts, so
library callers and tests that pass none get silence, not output they did not ask for.
"""

from __future__ import annotations

import time

from tspbench.core.names import OK_STATUSES


class Progress:
    """Counts of the current piece of work; shows nothing (subclasses in tspbench.cli do)."""

    def __init__(self) -> None:
        self.title, self.total = "", 0
        self.done = self.bad = self.running = 0
        self.current = ""
        self.started = time.monotonic()

    def start(self, total: int, title: str) -> None:
        """A piece of work of ``total`` units begins; the counts and the clock restart."""
        self.title, self.total = title, total
        self.done = self.bad = self.running = 0
        self.current = ""
        self.started = time.monotonic()

    def update(self, running: int, current: str = "") -> None:
        """``running`` units in flight now; ``current`` names them."""
        self.running, self.current = running, current

    def finished(self, status: str, line: str) -> None:
        """A unit ended with ``status`` (a record status: oom counts as a result, not a failure);
        ``line`` says which and how."""
        self.done += 1
        self.bad += status not in OK_STATUSES

    def note(self, line: str) -> None:
        """A line of information (what a sweep is about to run)."""

    def warn(self, line: str) -> None:
        """A line about something wrong that does not stop the work (a damaged file moved aside)."""

    def close(self) -> None:
        """The work is over (or was interrupted); what is shown stays."""

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def eta_s(self) -> float | None:
        """Seconds left at the mean pace so far; None before the first unit ends."""
        if not self.done:
            return None
        return self.elapsed_s() / self.done * max(self.total - self.done, 0)
