"""Re-price stored records' timelines from their kept traces (trace.npz beside each record).

The timeline is a model: the same traced step replayed with the current code and hardware
profile gives its current numbers, with no step run again. For every record of the folders
given that has a trace.npz, its ``timeline_*`` fields (and ``timeline_step_time_error`` where it
was measured) are recomputed on the record's own ``timeline_hardware``. ``--predictions`` also
recomputes the analytic model's ``predicted_*`` fields on the record's ``predicted_hardware``,
traced or not (a decode record keeps no trace; the decode model prices it):
only for folders whose steps the current code executed (the model describes the code as it is;
a measured step of older code keeps the predictions made beside it).

    python -m tools.reprice results/cpu_reference results/cpu_out_of_sample
    python -m tools.reprice --predictions results/paper_throughput_fake
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tspbench.analytic.hardware import load_hardware
from tspbench.analytic.timeline import timeline
from tspbench.core.trace import load_traces
from tspbench.measure.bench import predictions
from tspbench.sweep.points import Point
from tspbench.sweep.store import write_json, write_tables


def reprice(run: Path, with_predictions: bool = False) -> bool:
    """Re-price one run's record in place: its timeline where it kept a trace, and with
    ``with_predictions`` its model's fields (decode records keep no trace: only those). True
    where anything was re-priced."""
    record_path, trace_path = run / "result.json", run / "trace.npz"
    if not record_path.is_file():
        return False
    record = json.loads(record_path.read_text())
    priced, traced = with_predictions and bool(record.get("predicted_hardware")), trace_path.is_file()
    if not (priced or traced):
        return False
    if priced:
        point = Point.from_json(json.loads((run / "point.json").read_text()))
        record.update(predictions(point.layout, point.workload, record, record["predicted_hardware"]))
    write_json(record_path, with_timeline(record, trace_path) if traced else record)
    return True


def with_timeline(record: dict, trace_path: Path) -> dict:
    """``record`` with its ``timeline_*`` fields replayed again from ``trace_path``."""
    traces, _ = load_traces(trace_path)
    name = record.get("timeline_hardware") or "cpu"
    tl = timeline(traces, load_hardware(name), record["world_size"])
    record = {k: v for k, v in record.items() if not k.startswith("timeline_")}
    record.update({"timeline_hardware": name, **tl.to_record()})
    if record.get("step_time_s"):
        record["timeline_step_time_error"] = record["timeline_step_time_s"] / record["step_time_s"] - 1
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--predictions", action="store_true", help="also the analytic model's fields")
    args = parser.parse_args()
    for folder in args.folders:
        done = sum(reprice(run, args.predictions) for run in sorted(folder.iterdir()) if run.is_dir())
        write_tables(folder)  # records.csv and .parquet follow the records
        print(f"{folder}: {done} records re-priced")


if __name__ == "__main__":
    main()
