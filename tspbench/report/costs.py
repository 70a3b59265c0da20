"""A report's cost columns: device-hours and energy per token, and decode's TTFT p99 (#43).

Records stored before these fields existed still have what they rest on (step time, tokens,
world size, the profile they were priced on), so the report computes them for every record
with the one function that finishes new records (tspbench.analytic.cost.record_costs): the
summaries of committed studies regenerate with them, no study re-run. A measured energy (a
meter's reading in the record) is kept; the rest is projected from the profile's board power,
and every value says which in its source column.

TTFT p99 is over the timed runs' prefills (``ttft_times_s``), beside TPOT p99; a run times one
prefill, so a point with one timed run has one TTFT and "TTFT timed runs" says so. A predicted
decode point has the model's one TTFT (no spread to take a percentile of).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from tspbench.analytic.cost import COST_FIELDS, record_costs
from tspbench.core.units import percentile


def add_costs(df: pd.DataFrame) -> None:
    """``COST_FIELDS`` (as analytic.cost computes them), ``ttft_p99`` and ``ttft_runs`` per row."""
    rows = [present(r) for r in df.to_dict("records")]
    costs = [record_costs(r) for r in rows]
    for name in COST_FIELDS:
        df[name] = [c[name] for c in costs]
    ttft = [ttft_p99(r) for r in rows]
    df["ttft_p99"] = pd.Series([t[0] for t in ttft], index=df.index, dtype=float)
    df["ttft_runs"] = pd.Series([t[1] for t in ttft], index=df.index, dtype="Int64")


def present(row: dict[str, Any]) -> dict[str, Any]:
    """A frame row as a record: the keys a record would not have (NaN) left out."""
    return {k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}


def ttft_p99(record: dict[str, Any]) -> tuple[float | None, int | None]:
    """(TTFT p99 in seconds, how many prefills it is over: None for the model's one figure)."""
    if record.get("mode") != "decode" or record.get("status") != "completed":
        return None, None
    times = record.get("ttft_times_s")
    if isinstance(times, (list, tuple)) and times:
        return float(record.get("ttft_p99_s") or percentile(list(times), 0.99)), len(times)
    value = record.get("ttft_s")
    return (float(value), None) if isinstance(value, (int, float)) else (None, None)


def cost_columns(df: pd.DataFrame, noun: str) -> dict[str, pd.Series]:
    """The summary's cost columns: hours per 1e9 tokens (train, prefill) and per 1e6 generated
    tokens (decode) where the study has such points, energy per token always, each beside the
    column that says measured or projected; decode's TTFT p99 beside TPOT p99."""
    decode = df["mode"] == "decode"
    out: dict[str, pd.Series] = {}
    if (~decode).any():
        out[f"{noun}-hours per 1e9 tokens"] = sig(df["gpu_hours_per_btok"])
    if decode.any():
        out[f"{noun}-hours per 1e6 generated tokens"] = sig(df["gpu_hours_per_mtok"])
    out[f"{noun}-hours source"] = df["gpu_hours_source"]
    out["energy per token (J)"] = sig(df["energy_per_token_j"])
    out["energy source"] = df["energy_per_token_source"]
    if decode.any():
        out["TTFT p99 (ms)"] = (df["ttft_p99"] * 1e3).round(1)
        out["TTFT timed runs"] = df["ttft_runs"]
        tpot = pd.to_numeric(df["tpot_p99_s"], errors="coerce") if "tpot_p99_s" in df else df["ttft_p99"] * 0
        out["TPOT p99 (ms)"] = (tpot.where(df["status"] == "completed") * 1e3).round(2)
    return out


def sig(values: pd.Series) -> pd.Series:
    """Four significant figures: hours per token span 1e-3 (a GPU) to 1e6 (a CPU rank)."""
    return pd.to_numeric(values, errors="coerce").apply(lambda v: float(f"{v:.4g}") if v == v else v)
