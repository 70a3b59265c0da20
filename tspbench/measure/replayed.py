"""A measured point's step traces, replayed on its hardware profile: the record's ``timeline_``
fields, and the traces kept beside it (a .npz to replay again, or a Chrome trace to look at)."""

from __future__ import annotations

from pathlib import Path

from tspbench.analytic.chrome import write_chrome_trace
from tspbench.analytic.hardware import load_hardware
from tspbench.analytic.timeline import Timeline, timeline
from tspbench.core.errors import OutputError
from tspbench.core.spec import Layout, Workload
from tspbench.core.trace import RankTrace, save_traces


def default_hardware(workload: Workload) -> str:
    """The profile a point is priced on when none is named: the paper's MI300X for a (simulated)
    GPU, this kind of host for CPU runs."""
    return "mi300x" if workload.device == "cuda" else "cpu"


def timeline_fields(
    layout: Layout,
    workload: Workload,
    traces: list[RankTrace],
    hardware: str | None,
    trace_path: Path | None = None,
) -> dict[str, object]:
    """``timeline_*`` fields from replaying ``traces`` on ``hardware`` (default_hardware when None);
    with ``trace_path`` the traces are written there too: ``.npz`` (every rank's events, to replay
    on another profile: ``tspbench trace``), else a Chrome trace (``.json`` or ``.json.gz``). A
    trace that cannot be written (a full disk) leaves ``trace_error`` in the record, not an
    exception that would lose the measurement."""
    if not traces:
        return {}
    name = hardware or default_hardware(workload)
    tl = timeline(traces, load_hardware(name), layout.world_size)
    out: dict[str, object] = {"timeline_hardware": name, **tl.to_record()}
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
