"""The TSP overlap study (benchmarks/overlap_study.py) runs end to end: one round at world
size 2, so it cannot rot. The study itself interleaves its variants over many rounds:
``python benchmarks/overlap_study.py`` (``make bench`` runs it)."""

from __future__ import annotations

import math

from overlap_study import VARIANTS, study


def test_overlap_study_runs_every_variant() -> None:
    rows = study((2,), rounds=1)
    assert {r["kind"] for r in rows} == {"mlp", "attn"}
    for row in rows:
        assert all(row[f"{v}_ms"] > 0 for v in VARIANTS)
        assert math.isfinite(row["hidden_fraction"])
