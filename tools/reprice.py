"""Re-price stored records' timelines from their kept traces (trace.npz beside each record).

The timeline is a model: the same traced step replayed with the current code and hardware
profile gives its current numbers, with no step run again. For every record of the folders
given that has a trace.npz, its ``timeline_*`` fields (and ``timeline_step_time_error`` where it
was measured) are recomputed on the record's own ``timeline_hardware``.

    python -m tools.reprice results/cpu_reference results/cpu_out_of_sample
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tspbench.analytic.hardware import load_hardware
from tspbench.analytic.timeline import timeline
from tspbench.core.trace import load_traces
from tspbench.sweep.store import write_json, write_tables


def reprice(run: Path) -> bool:
    record_path, trace_path = run / "result.json", run / "trace.npz"
    if not (record_path.is_file() and trace_path.is_file()):
        return False
    record = json.loads(record_path.read_text())
    traces, _ = load_traces(trace_path)
    name = record.get("timeline_hardware") or "cpu"
    tl = timeline(traces, load_hardware(name), record["world_size"])
    record = {k: v for k, v in record.items() if not k.startswith("timeline_")}
    record.update({"timeline_hardware": name, **tl.to_record()})
    if record.get("step_time_s"):
        record["timeline_step_time_error"] = record["timeline_step_time_s"] / record["step_time_s"] - 1
    write_json(record_path, record)
    return True


def main(folders: list[str]) -> int:
    for folder in folders:
        done = sum(reprice(run) for run in sorted(Path(folder).iterdir()) if run.is_dir())
        write_tables(folder)  # records.csv and .parquet follow the records
        print(f"{folder}: {done} records re-priced")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
