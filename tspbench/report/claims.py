"""The judges of the ledger (tspbench.report.ledger): one function per claim of the paper, each
reading records by their columns only, so the same code judges projected, fake-world and
measured records. Thresholds are stated where they are used ("about equal": within 15%;
"far below": at most half; "competitive": at least 0.9x; "hides": at most 10% of the step
exposed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

STRENGTH = {"measured": 3, "fake": 2, "predicted": 1}
# For speed a fake-world record is a projection too (the timeline's replay of the executed step);
# the analytic model's is preferred, since the hinges (tspbench.analytic.sensitivity) re-price it.
SPEED_STRENGTH = {"measured": 3, "predicted": 2, "fake": 1}
GIB = 2**30
PAPER_LAYOUTS = ("tp", "sp", "tp_sp", "tsp")  # FSDP+SP is this project's addition
EQUAL, FAR, COMPETITIVE, HIDDEN = 0.15, 0.5, 0.9, 0.10


@dataclass(frozen=True)
class Comparison:
    """Two layouts at one point, as ``tspbench sensitivity`` takes them (``tsp:8,dp2``)."""

    hardware: str
    model: str
    seq_len: int
    mode: str
    recompute: str
    batch: int
    layout: str
    against: str


@dataclass(frozen=True)
class Hinge:
    """One figure a projected verdict rests on and where the faster layout changes."""

    figure: str
    value: float
    unit: str
    provenance: str
    break_even: float | None  # inside the figure's range
    beyond: float | None  # past it (the verdict holds over the whole range)


@dataclass
class Claim:
    """One row of the ledger."""

    key: str  # 'a' .. 'i'
    claim: str
    verdict: str  # 'holds', 'holds only where ...', 'does not hold ...', 'not testable here ...'
    evidence: str
    numbers: str
    paper: str = ""  # the paper's numbers, second-hand
    explain: str = ""  # what could explain a difference
    comparisons: list[Comparison] = field(default_factory=list)
    hinges: list[tuple[Comparison, list[Hinge]]] = field(default_factory=list)


# ----------------------------------------------------------------------------- reading records


def strongest(
    studies: Mapping[str, pd.DataFrame], names: Sequence[str], speed: bool = False
) -> pd.DataFrame | None:
    """The study among ``names`` whose records carry the strongest evidence (measured, then
    executed in a fake world, then projected; for ``speed``, SPEED_STRENGTH); None where none is
    stored."""
    rank = SPEED_STRENGTH if speed else STRENGTH
    found = [studies[n] for n in names if n in studies and len(studies[n])]
    return max(found, key=lambda df: max(rank.get(s, 0) for s in df["source"].unique()), default=None)


def evidence(df: pd.DataFrame, speed: bool) -> str:
    """What the numbers are, from the records' ``source`` (and the profile they name)."""
    source = max(df["source"].unique(), key=lambda s: STRENGTH.get(s, 0))
    if source == "measured":
        device = df.get("env_device_name", pd.Series(["a GPU"])).dropna()
        return f"measured on {device.iloc[0] if len(device) else 'the cluster'}"
    hw = str(df["hardware"].iloc[0])
    if source == "fake":
        replay = df.get("timeline_hardware", df["hardware"]).iloc[0]
        return (
            f"time projected by the timeline on the {replay} profile" if speed else "executed in a fake world"
        )
    return f"projected on the {hw} profile"


def label(row: pd.Series) -> str:
    """'TSP 8', 'TP+SP 2x4', 'FSDP+SP 8', with 'x dp N' where data parallel."""
    s = str(row["strategy"])
    degrees = {"tp_sp": f"{row['tp']}x{row['sp']}", "fsdp_sp": f"{row['sp']}"}.get(s, f"{row.get(s, '')}")
    name = {"tp_sp": "TP+SP", "fsdp_sp": "FSDP+SP"}.get(s, s.upper())
    return f"{name} {degrees}" + (f" x dp {row['dp']}" if int(row.get("dp", 1)) > 1 else "")


def cli_layout(row: pd.Series) -> str:
    """The layout as ``tspbench sensitivity`` reads it: 'tp_sp:2x4', 'tsp:8,dp2'."""
    s = str(row["strategy"])
    degrees = {"tp_sp": f"{row['tp']}x{row['sp']}", "fsdp_sp": f"{row['sp']}"}.get(s, f"{row.get(s, 1)}")
    return f"{s}:{degrees}" + (f",dp{row['dp']}" if int(row.get("dp", 1)) > 1 else "")


def degree(row: pd.Series) -> int:
    """Ranks of one model-parallel replica (TSP's D; TP+SP's T x S)."""
    return int(row["world_size"]) // int(row.get("dp", 1)) // int(row.get("fsdp", 1))


def fits(df: pd.DataFrame) -> pd.Series:
    """Points that ran and fit the device: completed, and (a fake world does not run out of
    memory) a peak within the record's usable capacity."""
    peak = pd.to_numeric(df["peak_memory_bytes"], errors="coerce")
    empty = pd.Series(index=df.index, dtype=float)
    capacity = pd.to_numeric(df.get("capacity_bytes", empty), errors="coerce")
    return (df["status"] == "completed") & ~(peak > capacity)


def speed(df: pd.DataFrame) -> pd.Series:
    """Tokens/s per GPU: measured or projected by the model; for fake-world records, the
    timeline's replay of the executed step on its profile."""
    if (df["source"] == "fake").all():  # its own wall time is of fake tensors: no time at all
        return df["tokens_per_step"] / df["timeline_step_time_s"] / df["world_size"]
    return df["tokens_per_s_per_gpu"].astype(float)


def comparison(row: pd.Series, other: pd.Series) -> Comparison:
    point = (str(row["hardware"]), str(row["model"]), int(row["seq_len"]), str(row["mode"]))
    return Comparison(*point, str(row["recompute"]), int(row["batch"]), cli_layout(row), cli_layout(other))


def gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.1f} GiB"


def tokens(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else f"{n:,}"


def only_where(good: Sequence[str], bad: Sequence[str]) -> str:
    """'holds', 'does not hold', or 'holds only where <good>; not at <bad>'."""
    if not bad:
        return "holds"
    if not good:
        return "does not hold"
    return f"holds only at {', '.join(good)}; not at {', '.join(bad)}"
