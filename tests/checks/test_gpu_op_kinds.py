"""The op-level test set (tspbench.checks.gpu_op_kinds): the committed H200 probe's device time by
kind against the same step replayed on the shipped profile and on its run's calibration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tspbench.analytic.hardware import load_hardware
from tspbench.checks.gpu_op_kinds import score, table, within_goal

H200 = Path(__file__).resolve().parents[2] / "results" / "h200"
RUN = "2026-12-04_dd1d213"


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return score(H200, load_hardware("h200")).kinds


def test_every_probed_strategy_and_kind_is_a_row_with_the_probe_s_seconds(rows: list[dict]) -> None:
    probe = json.loads((H200 / RUN / "probes" / "op_kinds.json").read_text())
    for entry in probe:
        for kind in ("gemm", "attention", "elementwise"):
            key = (RUN, entry["strategy"], kind)
            row = next(r for r in rows if (r["run"], r["strategy"], r["kind"]) == key)
            assert row["measured_s"] == entry["seconds_by_kind"][kind]
            assert row["shipped_error"] == pytest.approx(row["replayed_shipped_s"] / row["measured_s"] - 1)
    assert len([r for r in rows if r["run"] == RUN]) == 3 * len(probe)


def test_the_replayed_gemms_are_the_hand_counted_work_of_the_probed_step(rows: list[dict]) -> None:
    """The 7B cut to 4 layers, 8,192 tokens, one training step: per layer q, k, v, o (h x h) and the
    gated MLP's three h x 4h matrices, 16 h^2 weights, plus the LM head (h x vocab); 2 FLOPs per
    weight per token forward, 4 backward; 7 matmuls per layer forward and 14 backward, the head's
    3. Priced at the profile's step GEMM rate plus its per-op overhead: the replay's GEMM seconds."""
    h, vocab, layers, tokens = 4096, 32000, 4, 8192
    flops = 6 * tokens * (layers * 16 * h * h + h * vocab)
    calls = layers * 21 + 3
    hw = load_hardware("h200")
    expected = flops / (hw.step_gemm_rate * 1e12) + calls * hw.op_overhead_us * 1e-6
    dp = next(r for r in rows if (r["run"], r["strategy"], r["kind"]) == (RUN, "dp", "gemm"))
    assert dp["replayed_shipped_s"] == pytest.approx(expected, rel=1e-9)


def test_gemm_and_attention_hold_at_the_op_level_on_the_shipped_profile(rows: list[dict]) -> None:
    """What the GPU test set shows per kind: the shipped h200 profile prices the GEMMs and the
    attention of every probed step within 10% of their device time."""
    goal = within_goal(rows)
    assert goal["gemm"] and goal["attention"]


def test_the_table_has_a_line_per_row(rows: list[dict]) -> None:
    lines = table(rows).splitlines()
    assert len(lines) == len(rows) + 2 and all(line.count("|") == 11 for line in lines)
