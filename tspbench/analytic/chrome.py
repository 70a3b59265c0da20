"""A replayed step as a Chrome trace (the JSON that ui.perfetto.dev and chrome://tracing open).

One process per rank; one track per compute stream (its ops, with FLOPs, bytes, shapes and
phase) and one per link (its collectives, with message bytes and group), and a track of the
layers' forward spans. Ops without a kernel (views, allocations) are left out. Times in us.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from tspbench.analytic.timeline import RankState, Timeline, op_times
from tspbench.core.files import write_atomic
from tspbench.core.trace import COMPUTE, VIEW

LINK_TRACKS = {"node": 1000, "nic": 1001}
LAYERS_TRACK = 999


def chrome_trace(tl: Timeline) -> dict[str, object]:
    """The trace events of every replayed rank (``traceEvents``), times in microseconds."""
    events: list[dict[str, object]] = []
    for rank, state in sorted(tl.replay.states.items()):
        trace = state.trace
        events.append(_meta("process_name", rank, 0, f"rank {rank}"))
        for stream in sorted(set(trace.events["stream"].tolist())):
            events.append(_meta("thread_name", rank, int(stream), f"compute: {trace.streams[int(stream)]}"))
        events += _ops(tl, rank)
        events += _collectives(state, rank)
        events += _layers(state, rank)
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(tl: Timeline, path: Path) -> Path:
    """The trace as JSON (gzip-compressed when ``path`` ends in .gz: both viewers open it)."""
    text = json.dumps(chrome_trace(tl), separators=(",", ":"))
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, gzip.compress(text.encode()) if path.suffix == ".gz" else text)


def _meta(kind: str, pid: int, tid: int, name: str) -> dict[str, object]:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}


def kernel_ops(tl: Timeline, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(event rows, start s, seconds) of the rank's compute ops that run a kernel (views and
    allocations left out), as the replay placed them on their stream."""
    ev = tl.replay.states[rank].trace.events
    start, seconds = op_times(tl.replay, rank)
    return np.flatnonzero((ev["kind"] == COMPUTE) & (ev["cls"] != VIEW)), start, seconds


def layer_spans(state: RankState) -> list[tuple[str, float, float]]:
    """(label, begin s, end s) of each layer forward the rank marked, in the order they ended."""
    out, open_at = [], {}
    for label, end, t in state.marks:
        if not end:
            open_at[label] = t
        elif label in open_at:
            out.append((label, open_at.pop(label), t))
    return out


def _ops(tl: Timeline, rank: int) -> list[dict[str, object]]:
    trace = tl.replay.states[rank].trace
    ev = trace.events
    keep, start, seconds = kernel_ops(tl, rank)
    phases = trace.phases
    return [
        {
            "ph": "X",
            "pid": rank,
            "tid": int(ev["stream"][i]),
            "ts": start[i] * 1e6,
            "dur": seconds[i] * 1e6,
            "name": trace.names[ev["name"][i]],
            "args": {
                "flops": float(ev["flops"][i]),
                "bytes": float(ev["nbytes"][i]),
                "shapes": trace.sigs[ev["sig"][i]] if ev["sig"][i] >= 0 else "",
                "phase": phases[ev["phase"][i]],
            },
        }
        for i in keep
    ]


def _collectives(state: RankState, rank: int) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for link, tid in LINK_TRACKS.items():
        if any(c.link == link for c in state.coll_of.values()):
            out.append(_meta("thread_name", rank, tid, f"link: {link}"))
    for row, coll in sorted(state.coll_of.items()):
        out.append(
            {
                "ph": "X",
                "pid": rank,
                "tid": LINK_TRACKS[coll.link],
                "ts": coll.start * 1e6,
                "dur": (coll.end - coll.start) * 1e6,
                "name": coll.op,
                "args": {
                    "bytes": coll.msg_bytes,
                    "group": coll.label,
                    "group_size": len(coll.ranks),
                    "issued_us": coll.issued[rank] * 1e6,
                    "trace_row": row,
                },
            }
        )
    return out


def _layers(state: RankState, rank: int) -> list[dict[str, object]]:
    """A span per layer forward, from its begin mark to its end mark."""
    out: list[dict[str, object]] = [
        {
            "ph": "X",
            "pid": rank,
            "tid": LAYERS_TRACK,
            "ts": begin * 1e6,
            "dur": (end - begin) * 1e6,
            "name": f"{label} forward",
        }
        for label, begin, end in layer_spans(state)
    ]
    if out:
        out.insert(0, _meta("thread_name", rank, LAYERS_TRACK, "layers"))
    return out
