"""The ``tspbench`` command line. Every bad input exits 2 with one line naming what was wrong.

Only this package parses arguments or prints tables; each command's module registers its
subcommands (``add_commands``) and imports the machinery it drives when it runs, so
``tspbench --help`` and ``tspbench report`` stay quick.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tspbench.cli import analytic, measure, report, sweep
from tspbench.core.errors import UsageError

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tspbench",
        description="Benchmark transformer parallel layouts (dp, fsdp, fsdp_sp, tp, sp, tp_sp, tsp): check "
        "them against a single-device reference, measure them, model them, sweep them locally or on Slurm, "
        "and report.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    measure.add_commands(sub)  # env, validate, bench, gpu-check
    analytic.add_commands(sub)  # predict, plan, calibrate
    sweep.add_commands(sub)  # run, status
    report.add_commands(sub)  # report
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (UsageError, FileNotFoundError) as exc:
        print(f"tspbench {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
