"""The backtest's errors by sample (tspbench.checks.backtest makes the rows they are read from).

A profile fitted to some entries cannot be scored on them: the shipped and the Hopper-measured
profiles fitted nothing, so every entry they predict is out of sample; the calibrated profiles are
in sample on the ``calibration`` entries and out of sample on the ``test`` ones only. The
timeline's errors (on the shipped profiles) are a group of their own. Kept apart from the rows so
what counts as in or out of sample is stated in one place.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from tspbench.checks.backtest import PROFILE_KINDS


@dataclass(frozen=True)
class ErrorSummary:
    """Errors of one profile kind over one group of entries."""

    kind: str  # a PROFILE_KINDS (the analytic model's time), or timeline (on the shipped profile)
    sample: str  # "in-sample" (calibration entries, calibrated profile) or "out-of-sample"
    ids: list[str]
    errors: list[float]

    @property
    def median_abs(self) -> float | None:
        return statistics.median(abs(x) for x in self.errors) if self.errors else None

    @property
    def worst(self) -> float | None:
        return max(self.errors, key=abs) if self.errors else None


def summarize(rows: list[dict[str, Any]]) -> list[ErrorSummary]:
    """Throughput errors in and out of sample: the shipped and the Hopper-measured profiles
    fitted nothing, so all their entries are out of sample; the calibrated ones are in sample on
    the calibration entries only."""
    out = []
    for kind in PROFILE_KINDS:
        fitted = kind == "calibrated"
        groups = {"in-sample": "calibration", "out-of-sample": "test"} if fitted else {"out-of-sample": None}
        for sample, role in groups.items():
            scored = [r for r in rows if r.get(f"{kind}_error") is not None and role in (None, r["role"])]
            out.append(
                ErrorSummary(kind, sample, [r["id"] for r in scored], [r[f"{kind}_error"] for r in scored])
            )
    # the timeline on the shipped profiles: nothing of it was fitted to these runs
    timed = [r for r in rows if r.get("assumed_timeline_error") is not None]
    out.append(
        ErrorSummary(
            "timeline",
            "out-of-sample",
            [r["id"] for r in timed],
            [r["assumed_timeline_error"] for r in timed],
        )
    )
    return out
