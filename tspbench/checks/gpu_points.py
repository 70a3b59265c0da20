"""The GPU test set: every point measured on a GPU and committed under results/<gpu>/, scored by the
analytic model and the timeline on the shipped profile (out of sample) and on the calibration
made in the same run (gpu-check's profile, where the run has one).

    bench records   <run>/bench/*.json with a trace beside them (<name>.npz): step time,
                    against the analytic model (tspbench.analytic.predict) and the traced step
                    replayed (tspbench.analytic.replayed.reprice); decode records: TTFT and TPOT
                    p50 against the decode model
    decode TPOT     gpu-check's decode/tpot row (graphed) and the decode probe's graphed TPOT
                    (<run>/probes/decode_kernels.json): against the decode model

Every step also scores the analytic memory model against the allocator's peak the record holds
(``memory_model_error``; memory does not depend on the profile's rates), and says whether its
steps all peaked alike (``memory_steady``: nothing carried from one step to the next). An error is predicted /
measured - 1. Nothing is measured here: the records are read back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tspbench.analytic.decode import predict_decode
from tspbench.analytic.hardware import Hardware
from tspbench.analytic.predict import predict
from tspbench.analytic.profile_choice import named_profile
from tspbench.analytic.replayed import reprice
from tspbench.core.files import read_input_text, write_atomic
from tspbench.core.names import AXES
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.core.trace import load_traces
from tspbench.core.units import format_bytes

STEADY_BYTES = 1 << 20  # a step's peak within this of every other's: nothing carried across steps
DECODE_POINT = {"model": "7b", "batch": 4, "seq_len": 16384, "decode_tokens": 32, "dtype": "bfloat16"}


@dataclass
class Measured:
    """One measured number of a run and what it is."""

    run: str
    point: str
    what: str  # step, ttft, tpot
    seconds: float
    record: dict
    trace: Path | None = None


def layout_workload(record: dict) -> tuple[Layout, Workload]:
    """The point a stored record measured."""
    degrees = {axis: int(record.get(axis, 1)) for axis in AXES}
    layout = Layout(record["strategy"], **degrees)
    workload = Workload(
        ModelConfig.preset(record["model"]), int(record["batch"]), int(record["seq_len"]), record["mode"],
        record.get("recompute", "none"), record["dtype"], record["device"],
        decode_tokens=int(record.get("decode_tokens") or 0),
    )  # fmt: skip
    return layout, workload


def measured_points(run: Path) -> list[Measured]:
    """Everything of ``run`` that this test set scores (module doc)."""
    out: list[Measured] = []
    for path in sorted((run / "bench").glob("*.json")):
        record = json.loads(read_input_text(path))
        if record.get("status") != "completed":
            continue
        if record["mode"] == "decode":
            out += [
                Measured(run.name, path.stem, what, record[f"{what}_s"], record) for what in ("ttft", "tpot")
            ]
        else:
            trace = path.with_suffix(".npz")
            out.append(Measured(run.name, path.stem, "step", record["step_time_s"], record, trace))
    tpot = run / "gpu_check" / "decode_tpot.json"
    if tpot.is_file():
        graphed = json.loads(read_input_text(tpot))["details"].get("graphed") or {}
        if graphed.get("tpot_p50_s"):
            out.append(Measured(run.name, "gpu-check decode/tpot", "tpot", graphed["tpot_p50_s"], graphed))
    probe = run / "probes" / "decode_kernels.json"
    if probe.is_file() and "graphed_tpot_s" in (found := json.loads(read_input_text(probe))):
        record = {
            **DECODE_POINT,
            "strategy": "dp",
            "mode": "decode",
            "device": "cuda",
            "decode_cuda_graphs": True,
        }
        out.append(Measured(run.name, "decode probe", "tpot", found["graphed_tpot_s"], record))
    return out


def same_run_profile(run: Path) -> Hardware | None:
    """The profile gpu-check's calibrate wrote in ``run`` (gpu_check/profile.yaml), if it finished."""
    path = run / "gpu_check" / "profile.yaml"
    return named_profile(str(path)) if path.is_file() else None


def predicted(m: Measured, hw: Hardware) -> tuple[float, float | None]:
    """(the model's seconds, the timeline's seconds or None) for ``m`` on ``hw``."""
    record = m.record
    if m.what in ("ttft", "tpot"):
        layout = Layout("dp")
        p = predict_decode(
            layout, ModelConfig.preset(record["model"]), int(record["batch"]), int(record["seq_len"]),
            int(record["decode_tokens"]), record["dtype"], hw,
        )  # fmt: skip
        return (p.ttft_s if m.what == "ttft" else p.tpot_s(50)), None
    layout, workload = layout_workload(record)
    model = predict(layout, workload, hw).step_time_s
    replay = None
    if m.trace is not None and m.trace.is_file():
        traces, _ = load_traces(m.trace)
        replay = reprice(record, traces, hw).step_s
    return model, replay


def memory_error(m: Measured, hw: Hardware) -> float | None:
    """The analytic model's peak over the allocator's peak of a measured step, minus 1; None for
    decode (its record's peak is the decode model's to score) or a record without a peak."""
    measured = m.record.get("peak_memory_bytes")
    if m.what != "step" or not measured:
        return None
    layout, workload = layout_workload(m.record)
    return predict(layout, workload, hw).memory.peak_bytes / measured - 1


def score(root: Path, shipped: Hardware) -> list[dict]:
    """One row per measured number under ``root`` (a results/<gpu>/ folder of runs)."""
    rows = []
    for run in sorted(p for p in root.iterdir() if p.is_dir()):
        calibrated = same_run_profile(run)
        for m in measured_points(run):
            row = {"run": m.run, "point": m.point, "what": m.what, "measured_s": m.seconds,
                   "attention_kernel": m.record.get("attention_kernel") or ""}  # fmt: skip
            if (memory := memory_error(m, shipped)) is not None:
                steps = m.record.get("peak_memory_step_bytes") or [0]
                row |= {"peak_memory_bytes": m.record["peak_memory_bytes"], "memory_model_error": memory,
                        "memory_steady": max(steps) - min(steps) <= STEADY_BYTES}  # fmt: skip
            for label, hw in (("shipped", shipped), ("same_run", calibrated)):
                if hw is None:
                    continue
                model, replay = predicted(m, hw)
                row[f"model_{label}_error"] = model / m.seconds - 1
                if replay is not None:
                    row[f"timeline_{label}_error"] = replay / m.seconds - 1
            rows.append(row)
    return rows


COLUMNS = ("model_shipped_error", "timeline_shipped_error", "model_same_run_error", "timeline_same_run_error")


def scores_table(rows: list[dict]) -> str:
    """The rows as a markdown table (errors in %, '-' where a model or profile does not apply)."""
    models = "model, shipped | timeline, shipped | model, same run | timeline, same run"
    lines = [
        f"| run | point | kernel | measured | allocator peak | memory model | {models} |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        unit = 1e3 if r["what"] == "tpot" else 1
        measured = f"{r['what']} {r['measured_s'] * unit:.4g} {'ms' if unit > 1 else 's'}"
        peak = format_bytes(r["peak_memory_bytes"]) if "memory_model_error" in r else "-"
        memory = f"{r['memory_model_error']:+.1%}" if "memory_model_error" in r else "-"
        cells = [f"{r[c]:+.1%}" if c in r else "-" for c in COLUMNS]
        first = [r["run"], r["point"], r["attention_kernel"] or "-", measured, peak, memory]
        lines.append("| " + " | ".join(first + cells) + " |")
    return "\n".join(lines) + "\n"


def write_scores(rows: list[dict], out: Path) -> list[Path]:
    """scores.csv and scores.md in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "scores.csv", pd.DataFrame(rows).to_csv(index=False))
    write_atomic(out / "scores.md", scores_table(rows))
    return [out / "scores.csv", out / "scores.md"]
