"""``tspbench check backtest`` (or ``tspbench backtest``): published GPU runs predicted by the
model, and the error.

Reads the published-measurements file (default results/published/published.yaml) and the
fake-world records stored beside it, predicts every entry the project can express with each
profile of its hardware, prints the table and writes backtest.csv, .md and the figure.
``--execute`` first runs the fake world for points that have no record (minutes); ``--fit``
prints the calibrated profiles' fitted number as the calibration entries give it, and with
``--write`` writes each calibrated profile from it (over its file).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tspbench.cli.args import output_path
from tspbench.core.errors import UsageError
from tspbench.core.files import write_atomic

DEFAULT_FILE = Path("results/published/published.yaml")
WHAT = {
    "assumed": "shipped profile",
    "measured": "Hopper-measured profile",
    "calibrated": "calibrated profile",
    "timeline": "timeline (shipped profile)",
}
HELP = "predict published GPU runs and report the model's error"


def add_commands(sub: argparse._SubParsersAction) -> None:
    """``tspbench backtest``: the same command as ``tspbench check backtest``."""
    add_arguments(sub.add_parser("backtest", help=HELP + " (= tspbench check backtest)"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--file", type=Path, default=DEFAULT_FILE, help=f"published measurements (default {DEFAULT_FILE})"
    )
    p.add_argument("--out", type=Path, help="folder for backtest.csv/.md/.png (default: the file's folder)")
    p.add_argument(
        "--execute", action="store_true", help="run the fake world for entries without a stored record"
    )
    p.add_argument("--rerun", action="store_true", help="with --execute: run every entry again")
    p.add_argument(
        "--fit", action="store_true", help="print the calibrated profiles' fitted numbers and exit"
    )
    p.add_argument("--write", action="store_true", help="with --fit: write the calibrated profiles")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=cmd_backtest)


def cmd_backtest(args: argparse.Namespace) -> int:
    from tspbench.analytic.hardware import find_profile
    from tspbench.analytic.profile_choice import named_profile
    from tspbench.checks.backtest import backtest_rows
    from tspbench.checks.backtest_fit import calibrated_profile, fit_profiles
    from tspbench.checks.backtest_score import summarize
    from tspbench.checks.published import load_published

    check_flags(args)
    published = load_published(args.file)
    results = args.file.parent
    if args.fit:
        for name, fit in fit_profiles(published).items():
            held = named_profile(name).elementwise_passes["train"]
            cells = ", ".join(f"{k} {v:.2f}" for k, v in fit["entries"].items())
            fitted = fit["train_passes"]
            print(f"{name}: train passes {fitted:.2f} (from {cells}; on {fit['from']}); profile holds {held}")
            if args.write:
                path = find_profile(name)
                write_atomic(path, calibrated_profile(name, fit))  # whole or not at all, one line if not
                print(f"wrote {path}")
        return 0
    out = output_path(args.out or results, "--out", folder=True)
    if args.execute or args.rerun:
        from tspbench.checks.published_fake import execute_published

        execute_published(published, results, args.rerun, say=print)
    rows = backtest_rows(published, results)
    summary = [vars(s) | {"median_abs": s.median_abs, "worst": s.worst} for s in summarize(rows)]
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=2, default=str))
    else:
        print_table(rows, summary)
    from tspbench.report.backtest import write_backtest  # matplotlib: only when files are written

    written = write_backtest(rows, summary, out)
    if not args.json:
        print(f"wrote {', '.join(str(p) for p in written)}")
    damaged = list(dict.fromkeys(p for r in rows for p in r.get("damaged") or ()))
    for problem in damaged:  # predicted without the damaged file; exit 2: the records need attention
        print(f"skipped (damaged): {problem}", file=sys.stderr)
    return 2 if damaged else 0


def check_flags(args: argparse.Namespace) -> None:
    """Flags that would do nothing together, refused rather than ignored (#45): ``--write``
    writes what ``--fit`` fitted; ``--fit`` prints its numbers and stops, so the flags of the
    backtest proper (``--execute``, ``--rerun``, ``--out``) would be silently dropped."""
    if args.write and not args.fit:
        raise UsageError("--write is for --fit (it writes the fitted profiles); add --fit or drop --write")
    given = (("--execute", args.execute), ("--rerun", args.rerun), ("--out", args.out), ("--json", args.json))
    ignored = [flag for flag, on in given if on]
    if args.fit and ignored:
        raise UsageError(f"--fit prints the fitted numbers and stops: {', '.join(ignored)} would do nothing")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _abs(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _tps(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def print_table(rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> None:
    kinds = ("assumed", "measured", "calibrated")
    print(
        f"{'entry':<28} {'role':<11} {'layout (published)':<24} {'published':>9} "
        + " ".join(f"{k[:8]:>8} {'error':>7}" for k in kinds)
        + f"  {'mem GiB pub/model/fake':<24} terms that differ (calibrated - measured)"
    )
    for r in (r for r in rows if r["predicted"]):
        mem = "/".join(
            "-" if v is None else f"{v:.1f}"
            for v in (r["published_memory_gib"], r["measured_predicted_memory_gib"], r["fake_allocated_gib"])
        ) + ("" if r["measured_fits"] else " OOM")
        layout = r["published_layout"] + (" +compile" if r["compile"] else "")
        cells = " ".join(
            f"{_tps(r[f'{k}_tokens_per_s_per_gpu']):>8} {_pct(r[f'{k}_error']):>7}" for k in kinds
        )
        print(
            f"{r['id']:<28} {r['role']:<11} {layout:<24} {_tps(r['published_tokens_per_s_per_gpu']):>9} "
            f"{cells}  {mem:<24} {r.get('terms_differ') or ''}"
        )
    listed = [r for r in rows if not r["predicted"]]
    print(f"listed, not predicted ({len(listed)}):")
    for r in listed:
        print(f"  {r['id']:<30} {r['not_predicted'][:100]}")
    for s in summary:
        print(
            f"{WHAT[s['kind']]}, {s['sample']}: {len(s['ids'])} entries, median |error| "
            f"{_abs(s['median_abs'])}, worst {_pct(s['worst'])}"
        )
