"""The terminal's tables of stored points (``tspbench status``, the table after ``tspbench run``):
what each point is, where its numbers come from, its status and headline numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from tspbench.core.names import AXES
from tspbench.core.units import format_bytes, readable_sizes
from tspbench.sweep.damage import RunFiles
from tspbench.sweep.store import load

STATUS_COLUMNS = ("run_id", "strategy", *AXES, "world_size", "seq_len", "batch", "mode", "recompute")


def status_table(path: str | Path, damaged: list[RunFiles] | None = None) -> pd.DataFrame:
    """One compact row per point: what it is, its status, attempts and headline numbers; damaged
    folders (appended to ``damaged`` when given) as rows of status ``corrupt``."""
    bad: list[RunFiles] = []
    frame = load(path, bad)
    if damaged is not None:
        damaged.extend(bad)
    if bad:
        rows = [{"experiment": f.run.parent.name, "run_id": f.run.name, "status": "corrupt"} for f in bad]
        errors = [f.problems[0] for f in bad]
        frame = pd.concat([frame, pd.DataFrame(rows).assign(attempt=0, error=errors)], ignore_index=True)
    if frame.empty:
        return frame
    columns = [c for c in ("experiment", *STATUS_COLUMNS) if c in frame]
    table = frame[columns].copy()
    for col in (*AXES, "world_size", "seq_len", "batch"):
        if col in table:  # a corrupt row has none: whole numbers still print as 2, not 2.0
            table[col] = table[col].astype("Int64")
    table["status"] = frame["status"]
    method = frame["method"].map(SOURCES) if "method" in frame else ""  # a point not yet run: its method
    table["source"] = frame["source"].fillna(method) if "source" in frame else method
    table["attempt"] = frame["attempt"]
    table = table.join(headline(frame).drop(columns="tok/s/gpu", errors="ignore"))
    table["error"] = frame["error"].map(lambda e: _first_line(readable_sizes(e) if isinstance(e, str) else e))
    if table["experiment"].nunique() == 1:
        table = table.drop(columns="experiment")
    return table


SOURCES = {"measure": "measured", "fake": "fake", "predict": "predicted"}  # a record's source, by method


def headline(frame: pd.DataFrame) -> pd.DataFrame:
    """step_ms, tok/s/gpu and peak as the terminal tables show them: a point that did not complete
    has no step time or throughput (an OOM's projected step did not fit: summary.csv leaves it
    blank too, #46)."""
    done, out = frame["status"] == "completed", pd.DataFrame(index=frame.index)
    for col, src, scale in (("step_ms", "step_time_s", 1e3), ("tok/s/gpu", "tokens_per_s_per_gpu", 1)):
        if src in frame:
            out[col] = (pd.to_numeric(frame[src], errors="coerce") * scale).round(1).where(done)
    if "peak_memory_bytes" in frame:
        peak = pd.to_numeric(frame["peak_memory_bytes"], errors="coerce")
        out["peak"] = peak.map(lambda b: "" if pd.isna(b) else format_bytes(b))
    return out


def _first_line(text: Any, width: int = 60) -> str:
    if not isinstance(text, str) or not text:
        return ""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."
