"""A point's step traces, replayed on a hardware profile: the record's ``timeline_`` fields, and
the traces kept beside it (a .npz to replay again, or a Chrome trace to look at).

``reprice`` is the one place a traced step becomes a timeline. A fresh measurement is priced by
it (bench, the fake world: ``timeline_fields``), and so is every stored one: the results store's
re-pricing (tspbench.sweep.reprice), ``tspbench replay``, the report's Gantt figure and the
models' checks (tspbench.checks), so a stored record re-prices to the numbers it was measured
with. It lives here, in measure, rather than beside the results store (tspbench.sweep.store)
because measure prices the fresh records and sits below the store in the layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tspbench.analytic.chrome import write_chrome_trace
from tspbench.analytic.hardware import Hardware
from tspbench.analytic.profile_choice import HardwareChoice
from tspbench.analytic.timeline import Timeline, timeline
from tspbench.core.errors import OutputError
from tspbench.core.spec import Layout, Workload
from tspbench.core.trace import RankTrace, save_traces


def reprice(record: Mapping[str, Any], traces: list[RankTrace], hw: Hardware) -> Timeline:
    """The timeline of ``record``'s traced step (``traces``, kept beside it) on the profile ``hw``,
    replayed in the record's world (its ``world_size``). Any mapping with a ``world_size`` does:
    a result.json, a report row, a trace file's metadata, an op-level check's row."""
    return timeline(traces, hw, int(record["world_size"]))


def repriced_record(record: Mapping[str, Any], tl: Timeline, hardware: str) -> dict[str, Any]:
    """``record`` with its ``timeline_*`` fields replaced by ``tl``'s (priced on ``hardware``), and
    ``timeline_step_time_error`` where the step was measured."""
    out = {k: v for k, v in record.items() if not k.startswith("timeline_")}
    out.update({"timeline_hardware": hardware, **tl.to_record()})
    if out.get("step_time_s"):
        out["timeline_step_time_error"] = out["timeline_step_time_s"] / out["step_time_s"] - 1
    return out


def timeline_fields(
    layout: Layout,
    workload: Workload,
    traces: list[RankTrace],
    choice: HardwareChoice,
    trace_path: Path | None = None,
) -> dict[str, object]:
    """``timeline_*`` fields from replaying ``traces`` on the point's profile (``timeline_hardware``
    names it: a stored record is re-priced on it, tspbench.analytic.profile_choice.record_profile);
    with ``trace_path`` the traces are written there too: ``.npz`` (every rank's events, to replay
    on another profile: ``tspbench replay``), else a Chrome trace (``.json`` or ``.json.gz``). A
    trace that cannot be written (a full disk) leaves ``trace_error`` in the record, not an
    exception that would lose the measurement."""
    if not traces:
        return {}
    tl = reprice({"world_size": layout.world_size}, traces, choice.hardware)
    out: dict[str, object] = {"timeline_hardware": choice.label, **tl.to_record()}
    if trace_path is not None:
        try:
            out["trace_path"] = str(write_traces(tl, traces, Path(trace_path), layout, workload))
        except OutputError as exc:  # the measurement stands: the record says why no trace came
            out["trace_error"] = str(exc)
    return out


def write_traces(
    tl: Timeline, traces: list[RankTrace], path: Path, layout: Layout, workload: Workload
) -> Path:
    if path.suffix == ".npz":
        meta = {"layout": layout.to_dict(), "world_size": layout.world_size, "model": workload.model.name}
        return save_traces(path, traces, meta)
    return write_chrome_trace(tl, path)
