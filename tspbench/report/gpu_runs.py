"""Runs on a lent GPU in the report: each folder under ``<results>/<gpu>/<date>_<commit>/`` (what
tools/h200_session.sh brings back, a README.md beside it) as one section of
``<out>/gpu_runs.md``: its gpu-check summary (``gpu_check/summary*.md``, as gpu-check wrote it)
and its bench records (``bench/*.json``), measured beside the analytic model and the timeline on
the profile each record names. A record that does not read back is named, not drawn.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from tspbench.core.errors import DamagedFileError
from tspbench.core.files import read_input_text, write_atomic
from tspbench.core.records import record_problem
from tspbench.report.tables import markdown

GPU_FOLDERS = ("h200",)  # results/<name>/: runs on a lent GPU of that kind


def gpu_run_folders(results_root: Path) -> list[Path]:
    """Every run folder under the results root's GPU folders, oldest name first."""
    runs = [p for name in GPU_FOLDERS for p in sorted((results_root / name).glob("*")) if p.is_dir()]
    return [p for p in runs if any(p.glob("gpu_check/summary*.md")) or any(p.glob("bench/*.json"))]


def bench_row(path: Path) -> dict[str, object]:
    """One measured point: what ran, its step time and the two models' signed errors in percent."""
    r = json.loads(read_input_text(path))  # a regular file, bounded, UTF-8 (#45)
    if not isinstance(r, dict) or (problem := record_problem(r)):
        raise ValueError(problem or "not a record (expected a mapping)")
    pct = lambda x: None if x is None else 100 * x  # noqa: E731
    decode = f", TPOT {1e3 * r['tpot_s']:.1f} ms" if r["mode"] == "decode" and r.get("tpot_s") else ""
    return {
        "record": path.name,
        "point": f"{r['model']} {r['strategy']} {r['mode']} {r['seq_len']}, "
        f"recompute {r['recompute']}{decode}",
        "status": r["status"],
        "attention": r.get("attention_kernel") or "",
        "step ms": 1e3 * r["step_time_s"] if r.get("step_time_s") and not decode else None,
        "prediction error % (analytic)": pct(r.get("predicted_step_time_error")),
        "prediction error % (timeline)": pct(r.get("timeline_step_time_error")),
        "profile": r.get("predicted_hardware") or "",
    }


def gpu_runs_section(run: Path, out_dir: Path, damaged: list[str]) -> list[str]:
    lines = [f"## {run.parent.name}/{run.name}", ""]
    readme = next((p for p in (run / "README.md", run.parent / "README.md") if p.is_file()), None)
    if readme is not None:
        lines += [f"What ran and what it showed: [{readme.name}]({os.path.relpath(readme, out_dir)}).", ""]
    for summary in sorted(run.glob("gpu_check/summary*.md")):
        try:
            lines += [f"gpu-check ({summary.name}):", "", read_input_text(summary).strip(), ""]
        except DamagedFileError as exc:  # a damaged page is named; the rest is written
            damaged.append(str(exc))
    rows = []
    for path in sorted(run.glob("bench/*.json")):
        try:
            rows.append(bench_row(path))
        except DamagedFileError as exc:
            damaged.append(str(exc))
        except (ValueError, KeyError, TypeError) as exc:
            damaged.append(f"{path}: {type(exc).__name__}: {exc}")
    if rows:
        lines += ["Bench points, measured, with the models' errors (predicted / measured - 1):", ""]
        lines += [markdown(pd.DataFrame(rows)), ""]
    return lines


SCORES_INTRO = "Predicted / measured - 1, on the shipped profile and on the run's calibration:"
OP_SCORES_INTRO = "A step's device time by kind, measured, against the same step replayed:"


def test_set_section(results_root: Path, out_dir: Path) -> list[str]:
    """Each GPU folder's scores.md (``tspbench check gpu-points``: every measured point scored on
    the shipped profile and on its run's calibration) and op_scores.md (the op-level test set),
    where it has them."""
    lines = []
    for name in GPU_FOLDERS:
        tables = (
            ("scores.md", f"## The {name} test set", ", `tspbench check gpu-points`", SCORES_INTRO),
            ("op_scores.md", "### Op level", "", OP_SCORES_INTRO),
        )
        for file, title, command, intro in tables:
            path = results_root / name / file
            if path.is_file():
                link = f"[{file}]({os.path.relpath(path, out_dir)})"
                text = read_input_text(path).strip()
                lines += [f"{title} ({link}{command})", "", intro, "", text, ""]
    return lines


def write_gpu_runs(results_root: Path, out_dir: Path) -> tuple[Path | None, list[str]]:
    """``<out>/gpu_runs.md`` for the GPU run folders under ``results_root`` (None where there are
    none), and the files that did not read back."""
    runs = gpu_run_folders(results_root)
    if not runs:
        return None, []
    damaged: list[str] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = ["# Measured on a lent GPU", "", "Each folder's own records; nothing here is projected.", ""]
    try:
        lines += test_set_section(results_root, out_dir)
    except DamagedFileError as exc:  # named; the runs' sections and the root index still written
        damaged.append(str(exc))
    for run in runs:
        lines += gpu_runs_section(run, out_dir, damaged)
    return write_atomic(out_dir / "gpu_runs.md", "\n".join(lines).rstrip() + "\n"), damaged
