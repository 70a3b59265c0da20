"""The ``tspbench`` command line. Every bad input exits 2 with one line naming what was wrong.

Only this package parses arguments or prints tables; each command's module registers its
subcommands (``add_commands``) and imports the machinery it drives when it runs, so
``tspbench --help`` and ``tspbench report`` stay quick.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn, TextIO

from tspbench.cli import analytic, decode, measure, report, sweep
from tspbench.core.errors import UsageError

EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (no usage block above it), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="tspbench",
        description="Benchmark transformer parallel layouts (dp, fsdp, fsdp_sp, tp, sp, tp_sp, tsp): check "
        "them against a single-device reference, measure them, model them, sweep them locally or on Slurm, "
        "and report.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    measure.add_commands(sub)  # env, validate, bench, gpu-check
    analytic.add_commands(sub)  # predict, plan, calibrate
    decode.add_commands(sub)  # plan-decode
    sweep.add_commands(sub)  # run, status
    report.add_commands(sub)  # report
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with output_may_close():
            return args.func(args)
    except (UsageError, FileNotFoundError) as exc:
        print(f"tspbench {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


class _DropWhenClosed:
    """stdout that drops what it is given once its reader has gone (``tspbench run ... | head -1``),
    so the command runs to its end (a sweep keeps measuring) and exits with its own status."""

    def __init__(self, stream: TextIO) -> None:
        self._stream, self._gone = stream, False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        self._gone = True
        with contextlib.suppress(OSError, ValueError):  # what is still buffered, and any later flush
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())  # go nowhere

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def output_may_close() -> Iterator[None]:
    """While a command runs, a closed stdout is not an error (see _DropWhenClosed)."""
    original, sys.stdout = sys.stdout, _DropWhenClosed(sys.stdout)
    try:
        yield
    finally:
        sys.stdout = original


if __name__ == "__main__":
    sys.exit(main())
