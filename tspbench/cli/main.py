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

import tspbench
from tspbench.core.errors import OutputError, UsageError

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (no usage block above it), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from tspbench.cli import analytic, backtest, check, decode, measure, replay, report, sensitivity, sweep

    parser = OneLineParser(
        prog="tspbench",
        description="Benchmark transformer parallel layouts (dp, fsdp, fsdp_sp, tp, sp, tp_sp, tsp): check "
        "them against a single-device reference, measure them, model them, sweep them locally or on Slurm, "
        "and report.",
    )
    parser.add_argument("--version", action="version", version=f"tspbench {tspbench.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    measure.add_commands(sub)  # env, validate, bench, gpu-check
    analytic.add_commands(sub)  # predict, plan, calibrate
    decode.add_commands(sub)  # plan-decode
    sensitivity.add_commands(sub)  # sensitivity
    sweep.add_commands(sub)  # run, status
    report.add_commands(sub)  # report
    backtest.add_commands(sub)  # backtest
    replay.add_commands(sub)  # replay
    check.add_commands(sub)  # check NAME: the models' checks (backtest among them)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    command = "tspbench"
    try:
        parser = build_parser()  # imports the commands' modules (torch): Ctrl-C may come here too
        argv = list(sys.argv[1:] if argv is None else argv)
        args = parser.parse_args(attach_dash_values(parser, argv))
        command = f"tspbench {args.command}"
        with output_may_close():
            return args.func(args)
    except (UsageError, FileNotFoundError) as exc:
        print(f"{command}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # Ctrl-C: what finished was written as it finished (run says more)
        print(f"{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _one_line(exc: Exception) -> str:
    """'/proc/x: No such file or directory', not "[Errno 2] No such file or directory: '/proc/x'"."""
    if isinstance(exc, OSError) and not isinstance(exc, UsageError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


def attach_dash_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--capacity -1GiB`` as ``--capacity=-1GiB``. argparse reads a value that starts with '-'
    (and is not a plain negative number) as another flag and says only "expected one
    argument"; joined, the value reaches the flag's own check, whose error names the flag and
    what is wrong. A value that is itself a known flag is left alone."""
    takes_value, known = _long_options(parser)
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg, value = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        if arg == "--":
            return out + argv[i:]
        if arg in takes_value and value and value.startswith("-") and value.split("=")[0] not in known:
            out.append(f"{arg}={value}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def _long_options(parser: argparse.ArgumentParser) -> tuple[set[str], set[str]]:
    """(long flags that take one value, every flag), over the parser and its subcommands."""
    takes_value: set[str] = set()
    known: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                values, flags = _long_options(sub)
                takes_value |= values
                known |= flags
        known.update(action.option_strings)
        if action.nargs is None:
            takes_value.update(o for o in action.option_strings if o.startswith("--"))
    return takes_value, known


class _DropWhenClosed:
    """stdout that drops what it is given once its reader has gone (``tspbench run ... | head -1``),
    so the command runs to its end (a sweep keeps measuring) and exits with its own status."""

    def __init__(self, stream: TextIO | None) -> None:
        # stdout closed before the command started (``>&-``): Python gives None; as a gone reader
        self._gone = stream is None
        self._stream = open(os.devnull, "w") if stream is None else stream  # noqa: SIM115

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
            except OSError as exc:
                self._failed(exc)
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()
            except OSError as exc:
                self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        """stdout on a full device (ENOSPC) or a failing one (EIO): one line, exit 2, not a
        traceback now and an 'Exception ignored' at exit (#45)."""
        self._reader_gone()
        raise OutputError(exc.errno or 0, f"cannot write standard output: {exc.strerror or exc}", "<stdout>")

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
        sys.stdout.flush()  # a full device says so here, where main prints it as one line
    finally:
        sys.stdout = original


if __name__ == "__main__":
    sys.exit(main())
