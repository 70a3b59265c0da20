"""Re-price stored records from their kept traces (trace.npz beside each record): the results
store's side of tspbench.analytic.replayed.reprice.

The timeline is a model: the same traced step replayed with the current code and hardware
profile gives its current numbers, with no step run again. For every record of the folders
given that has a trace.npz, its ``timeline_*`` fields (and ``timeline_step_time_error`` where it
was measured) are recomputed on the record's own ``timeline_hardware``. ``with_predictions`` also
recomputes the analytic model's ``predicted_*`` fields on the record's ``predicted_hardware``,
traced or not (a decode record keeps no trace; the decode model prices it):
only for folders whose steps the current code executed (the model describes the code as it is;
a measured step of older code keeps the predictions made beside it).

    tspbench check reprice results/cpu_reference results/cpu_out_of_sample
    tspbench check reprice --predictions results/paper_throughput_fake
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path

from tspbench.analytic.hardware import Hardware
from tspbench.analytic.profile_choice import named_profile, profile_name
from tspbench.analytic.replayed import reprice, repriced_record
from tspbench.core.errors import UsageError
from tspbench.core.files import read_input_text
from tspbench.core.trace import load_traces
from tspbench.measure.bench import predictions
from tspbench.sweep.damage import DamagedResults, read_run
from tspbench.sweep.points import Point
from tspbench.sweep.store import write_json, write_tables

Profiles = Callable[[str], Hardware]  # a profile by the name a record gives, loaded once per study


def reprice_study(folder: Path, with_predictions: bool = False) -> int:
    """Re-price every run of an experiment folder (``reprice_run``), then its tables
    (records.csv and .parquet follow the records); returns how many records were re-priced. Each
    profile the records name is loaded once."""
    if not folder.is_dir():
        raise UsageError(f"{folder}: not an experiment folder (results/<experiment>)")
    runs = [run for run in sorted(folder.iterdir()) if run.is_dir()]
    bad = [files for files in map(read_run, runs) if files.problems]
    if bad:  # as status names them, before anything is re-priced (#45)
        raise DamagedResults(bad)
    if not any((run / "point.json").is_file() for run in runs):  # no tables written for nothing
        raise UsageError(f"{folder}: not an experiment folder (no <run>/point.json under it)")
    profiles = cache(named_profile)
    done = sum(reprice_run(run, with_predictions, profiles) for run in runs)
    write_tables(folder)
    return done


def reprice_run(run: Path, with_predictions: bool = False, profiles: Profiles = named_profile) -> bool:
    """Re-price one run's record in place, on the profiles it names: its timeline where it kept a
    trace, and with ``with_predictions`` its model's fields (decode records keep no trace: only
    those). True where anything was re-priced."""
    record_path, trace_path = run / "result.json", run / "trace.npz"
    if not record_path.is_file():
        return False
    record = json.loads(read_input_text(record_path))
    priced, traced = with_predictions and bool(record.get("predicted_hardware")), trace_path.is_file()
    if not (priced or traced):
        return False
    if priced:
        point = Point.from_json(json.loads(read_input_text(run / "point.json")))
        hw = profiles(record["predicted_hardware"])
        record.update(predictions(point.layout, point.workload, record, hw))
    write_json(record_path, with_timeline(record, trace_path, profiles) if traced else record)
    return True


def with_timeline(record: dict, trace_path: Path, profiles: Profiles = named_profile) -> dict:
    """``record`` with its ``timeline_*`` fields replayed again from ``trace_path`` on the
    profile it names."""
    traces, _ = load_traces(trace_path)
    name = profile_name(record)
    return repriced_record(record, reprice(record, traces, profiles(name)), name)
