"""The TSP overlap study (tspbench.checks.overlap) runs end to end: one round at world size 2,
so it cannot rot. The study itself interleaves its variants over many rounds:
``tspbench check overlap`` (``make bench`` runs it)."""

from __future__ import annotations

import math

from tspbench.checks.overlap import VARIANTS, study


def test_overlap_study_runs_every_variant() -> None:
    rows = study((2,), rounds=1)
    assert {r["kind"] for r in rows} == {"mlp", "attn"}
    for row in rows:
        assert all(row[f"{v}_ms"] > 0 for v in VARIANTS)
        assert math.isfinite(row["hidden_fraction"])
