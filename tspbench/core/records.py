"""The flat record every point becomes (measured, executed in a fake world, or predicted).

One row per point, columns that pandas reads directly. The identifying part comes from the
layout and workload (``point_record``); communication is summarised the same way whoever
counted it (``comm_fields``). ``source`` says where the numbers come from:

    measured    a real run (``tspbench bench``, a local or Slurm sweep)
    fake        the real step executed under fake tensors and a fake process group
    predicted   the analytic model alone
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Protocol

from tspbench.core.fields import field_for
from tspbench.core.names import AXES
from tspbench.core.spec import Layout, Workload

SOURCES = ("measured", "fake", "predicted")


class Collective(Protocol):
    """What a summary needs of a counted collective (tspbench.dist.comm.CommRecord has it)."""

    op: str
    phase: str

    @property
    def bus_bytes(self) -> float: ...


def point_record(layout: Layout, workload: Workload, source: str = "measured") -> dict[str, object]:
    """The identifying part of a record: layout and workload, flat, and where its numbers come from."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    return {
        "strategy": layout.strategy,
        **{a: layout.degree(a) for a in AXES},
        "world_size": layout.world_size,
        **workload.to_dict(),
        "source": source,
    }


def busiest_comm(ranks: Iterable[dict]) -> list:
    """The collectives of the rank that moved the most bus bytes (``ranks``: dicts with "comm")."""
    return max(ranks, key=lambda r: sum(c.bus_bytes for c in r["comm"]))["comm"]


def comm_fields(records: Iterable[Collective], prefix: str = "comm") -> dict[str, float]:
    """Bus bytes per step in total, by op and by phase."""
    out: dict[str, float] = defaultdict(float)
    out[f"{prefix}_bytes_per_step"] = 0.0
    for r in records:
        out[f"{prefix}_bytes_per_step"] += r.bus_bytes
        out[f"{prefix}_{r.op}_bytes"] += r.bus_bytes
        out[f"{prefix}_{r.phase}_bytes"] += r.bus_bytes
    return dict(out)


def attention_kernel_field(ranks: list[dict]) -> str | None:
    """The attention kernels the ranks' measured step called (``attention_kernels`` of each
    rank's result, tspbench.model.attention), joined: a record's ``attention_kernel``."""
    return "+".join(sorted({k for r in ranks for k in r.get("attention_kernels", ())})) or None


WHOLE_UNITS = ("ranks", "rank", "sequences", "tokens", "steps", "step", "rounds")  # counts: integers
TEXT_FIELDS = ("strategy", "model", "mode", "recompute", "dtype", "device", "source", "status")


def record_problem(record: dict) -> str | None:
    """What is wrong with a stored record's values, or None (#45): every field with a unit
    (tspbench.core.fields) is a finite number >= 0 (a whole one where it counts ranks, tokens,
    sequences or steps), or a list of them, or None; the fields that name things are text. A
    record that says ``step_time_s: "abc"``, ``world_size: 0.5`` or ``peak_memory_bytes:
    Infinity`` would crash whatever sums or plots it; read here, it is a damaged file, named,
    like a truncated one."""
    for key in TEXT_FIELDS:
        if record.get(key) is not None and not isinstance(record[key], str):
            return f"{key}: expected text, got {record[key]!r:.80}"
    for key, value in record.items():
        known = field_for(str(key))
        if known is None or not known.unit or value is None or isinstance(value, dict):
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict):  # per-rank detail (peak_memory_by_rank): its own columns
                continue
            problem = _number_problem(item, known.unit)
            if problem:
                return f"{key}: expected {problem} ({known.unit}), got {value!r:.80}"
    return None


def _number_problem(item: object, unit: str) -> str | None:
    if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item) or item < 0:
        return "a finite number >= 0"
    if unit in WHOLE_UNITS and not isinstance(item, int):
        return "a whole number"
    return None
