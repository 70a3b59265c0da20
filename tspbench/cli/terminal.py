"""What the CLI shows while a user waits, and its tables: drawn with ``rich`` on a terminal,
plain lines everywhere else.

A terminal gets a progress bar with the elapsed time and an ETA, redrawn in place, with each
finished unit printed above it, and tables with borders. Output that is not a terminal (a
pipe, CI, a Slurm log) gets no escape codes at all: each finished unit is one line that
carries the counts, elapsed and ETA, a status line at most every ``quiet_s`` while nothing
finishes, and tables as pandas prints them, so logs read and grep as before. The work reports
to a ``tspbench.core.progress.Progress``; these subclasses are the only ones that draw it.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, TextIO

from rich import box
from rich import progress as bars
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tspbench.core.progress import Progress

if TYPE_CHECKING:
    import pandas as pd


def console(stream: TextIO | None = None) -> Console:
    """A rich console on ``stream`` (stdout by default) that takes no markup from the text it is
    given: point labels and error lines are shown as they are."""
    return Console(file=stream or sys.stdout, markup=False, highlight=False, emoji=False, soft_wrap=True)


def on_terminal(stream: TextIO | None = None) -> bool:
    """A terminal a bar can be redrawn on: a tty that rich does not rule out (TERM=dumb,
    TTY_INTERACTIVE=0). FORCE_COLOR alone does not make a log a terminal."""
    stream = stream or sys.stdout
    return stream.isatty() and console(stream).is_interactive


def progress_for(stream: TextIO | None = None, errors: TextIO | None = None) -> Progress:
    """The Progress to hand down to the work: a bar on a terminal, lines otherwise."""
    stream = stream or sys.stdout
    return RichProgress(stream, errors) if on_terminal(stream) else PlainProgress(stream, errors)


def clock(seconds: float | None) -> str:
    """'0:01:05' (h:mm:ss), or '?' before there is anything to go by."""
    if seconds is None:
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class PlainProgress(Progress):
    """Lines for logs: one per finished unit, with counts, elapsed and ETA; never an escape code."""

    def __init__(self, stream: TextIO, errors: TextIO | None = None, quiet_s: float = 30.0) -> None:
        super().__init__()
        self.stream, self.errors, self.quiet_s = stream, errors or sys.stderr, quiet_s
        self._printed = time.monotonic()
        self._open = False  # between start and close: close says where the work ended, once

    def start(self, total: int, title: str) -> None:
        super().start(total, title)
        self._open = True

    def update(self, running: int, current: str = "") -> None:
        super().update(running, current)
        if time.monotonic() - self._printed >= self.quiet_s:
            self._write(self.line())

    def finished(self, status: str, line: str) -> None:
        super().finished(status, line)
        times = f"elapsed {clock(self.elapsed_s())}, ETA {clock(self.eta_s())}"
        self._write(f"[{self.done}/{self.total}] {status:>9}  {line}  ({times})")

    def note(self, line: str) -> None:
        self._write(line)

    def warn(self, line: str) -> None:
        self.errors.write(line + "\n")
        self.errors.flush()

    def close(self) -> None:
        if self._open:
            self._open = False
            self._write(self.line())

    def line(self) -> str:
        text = (
            f"[{self.done}/{self.total} done, {self.running} running, {self.bad} failed] "
            f"elapsed {clock(self.elapsed_s())}  ETA {clock(self.eta_s())}"
        )
        return f"{text}  {self.current}" if self.current else text

    def _write(self, line: str) -> None:
        self._printed = time.monotonic()
        self.stream.write(line + "\n")
        self.stream.flush()


class RichProgress(Progress):
    """A rich bar per piece of work (title, bar, done/total, failures, elapsed, ETA, what runs
    now), redrawn in place; finished units, notes and warnings printed above it."""

    def __init__(self, stream: TextIO, errors: TextIO | None = None) -> None:
        super().__init__()
        self.out = console(stream)
        self.err = console(errors or sys.stderr)
        self.bar = bars.Progress(
            bars.TextColumn("{task.description}", markup=False),
            bars.BarColumn(),
            bars.MofNCompleteColumn(),
            bars.TextColumn("{task.fields[failed]}", markup=False),
            bars.TextColumn("elapsed"),
            bars.TimeElapsedColumn(),
            bars.TextColumn("ETA"),
            bars.TimeRemainingColumn(),
            bars.TextColumn("{task.fields[current]}", markup=False),
            console=self.out,
            # what else is written to the bar's screen goes above it; a stream redirected to a file
            # (calibrate --json > profile.json) is left alone
            redirect_stdout=sys.stdout.isatty(),
            redirect_stderr=sys.stderr.isatty(),
        )
        self.task: bars.TaskID | None = None

    def start(self, total: int, title: str) -> None:
        super().start(total, title)
        self.bar.start()  # a second start is a no-op: one live display, a task per piece of work
        self.task = self.bar.add_task(title, total=total, failed="", current="")

    def update(self, running: int, current: str = "") -> None:
        super().update(running, current)
        if self.task is not None:
            self.bar.update(self.task, current=current)

    def finished(self, status: str, line: str) -> None:
        super().finished(status, line)
        self.out.print(f"[{self.done}/{self.total}] {status:>9}  {line}")
        if self.task is not None:
            self.bar.update(self.task, advance=1, failed=f"{self.bad} failed" if self.bad else "")

    def note(self, line: str) -> None:
        self.out.print(line)

    def warn(self, line: str) -> None:
        """On stderr; above the bar when stderr is the bar's screen (written past the bar, rich
        would leave the line under it)."""
        if self.bar.live.is_started and sys.stderr.isatty():
            self.out.print(Text(line, style="yellow"))
        else:
            self.err.print(line)

    def close(self) -> None:
        if self.task is not None:
            self.bar.update(self.task, current="")
        self.bar.stop()


def print_table(frame: pd.DataFrame, stream: TextIO | None = None) -> None:
    """``frame`` without its index: a rich table on a terminal, pandas' text otherwise."""
    stream = stream or sys.stdout
    if not on_terminal(stream):  # a missing value blank, as on a terminal (not NaN)
        stream.write(frame.to_string(index=False, na_rep="") + "\n")
        return
    import pandas as pd  # here, not at import: a refusal need not load it

    table = Table(box=box.SIMPLE_HEAD)
    for name in frame.columns:
        numeric = pd.api.types.is_numeric_dtype(frame[name])
        table.add_column(str(name), justify="right" if numeric else "left")
    columns = [_cells(frame[name]) for name in frame.columns]
    for row in zip(*columns, strict=True):
        table.add_row(*row)
    console(stream).print(table)


def _cells(column: pd.Series) -> list[str]:
    """A column's cells as pandas would print them: blank for a missing value, a float column
    of whole numbers without '.0', the others as they are."""
    import pandas as pd

    whole = pd.api.types.is_float_dtype(column) and bool((column.dropna() % 1 == 0).all())
    return ["" if pd.isna(v) else str(int(v)) if whole else str(v) for v in column]
