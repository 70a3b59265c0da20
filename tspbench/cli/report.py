"""``tspbench report RESULTS_DIR [--out DIR]``: summary tables and figures from stored records.

A damaged run folder or step trace is left out and named on stderr (exit 2); the rest is drawn."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tspbench.cli.args import output_path


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="summary tables and figures from stored results")
    p.add_argument("results_dir", help="results/<experiment>, or a results root of several")
    p.add_argument("--out", help="output folder (default: RESULTS_DIR/report)")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from tspbench.report.build import report  # matplotlib: only when a report is drawn

    out = output_path(Path(args.out), "--out", folder=True) if args.out else None
    from tspbench.cli.sensitivity import band_finder, hinge_finder  # the model: break-evens, bands

    outputs = report(Path(args.results_dir), out, hinge_finder(), band_finder())
    for out in outputs.experiments or [outputs]:
        print(f"{out.out_dir}/: {written(out.tables, list(out.figures))}")
        if out.skipped:
            print(f"  not drawn: {', '.join(out.skipped)}")
        for note in out.notes:  # a measured study's times against its profile (#46)
            print(f"  warning: {note}")
    print(f"open {outputs.index}: every table and figure, with what each shows")
    for problem in outputs.damaged:  # left out, the rest reported: exit 2, the store needs attention
        print(f"skipped (damaged): {problem}", file=sys.stderr)
    return 2 if outputs.damaged else 0


def written(tables: list[Path], figures: list[str]) -> str:
    """What a report wrote in its folder: 'the summary table (summary.csv, summary.md); 6 figures,
    each as .png and .svg: memory_vs_seq, ...' (one table in two formats is not '2 tables')."""
    table = f"the summary table ({', '.join(p.name for p in tables)})" if tables else "no table"
    if not figures:
        return f"{table}; no figure"
    noun = "figure" if len(figures) == 1 else "figures"
    return f"{table}; {len(figures)} {noun}, each as .png and .svg: {', '.join(figures)}"
