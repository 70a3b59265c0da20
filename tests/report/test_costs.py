"""The summary's cost columns on synthetic records, old ones without the fields included (#43)."""

from __future__ import annotations

import pandas as pd
import pytest

from tspbench.report.frame import prepare
from tspbench.report.tables import summary_table

BASE = {"strategy": "tsp", "tsp": 8, "world_size": 8, "model": "7b", "batch": 1, "seq_len": 2048,
        "recompute": "none", "dtype": "bfloat16", "device": "cuda", "status": "completed"}  # fmt: skip


def test_training_summary_has_hours_and_energy_with_their_sources() -> None:
    records = [
        {**BASE, "mode": "train", "source": "predicted", "hardware": "mi300x", "step_time_s": 2.0,
         "tokens_per_step": 16384},
        {**BASE, "mode": "train", "source": "predicted", "hardware": "mi300x", "status": "oom"},
    ]  # fmt: skip
    table = summary_table(prepare(pd.DataFrame(records)))
    done, oom = table.iloc[0], table.iloc[1]
    assert done["GPU-hours per 1e9 tokens"] == pytest.approx(271.3)
    assert done["energy per token (J)"] == pytest.approx(0.7324)
    assert done["GPU-hours source"] == "projected (analytic model on mi300x)"
    assert done["energy source"] == "projected (mi300x board power, datasheet)"
    assert pd.isna(oom["GPU-hours per 1e9 tokens"]) and pd.isna(oom["energy per token (J)"])
    assert "TTFT p99 (ms)" not in table


def test_decode_summary_keeps_measured_energy_and_has_ttft_p99() -> None:
    record = {**BASE, "mode": "decode", "source": "measured", "tsp": 1, "dp": 8, "batch": 2,
              "tpot_s": 0.01, "tpot_p99_s": 0.02, "ttft_times_s": [0.5, 0.7, 0.6],
              "energy_per_token_j": 3.25, "energy_source": "nvml", "predicted_hardware": "h200"}  # fmt: skip
    table = summary_table(prepare(pd.DataFrame([record])))
    row = table.iloc[0]
    assert row["energy per token (J)"] == 3.25 and row["energy source"] == "measured (NVML)"
    assert row["GPU-hours per 1e6 generated tokens"] == pytest.approx(8 * 0.01 / 16 / 3600 * 1e6, rel=1e-3)
    assert row["GPU-hours source"] == "measured"
    assert row["TTFT p99 (ms)"] == pytest.approx(698.0, abs=0.5) and row["TTFT timed runs"] == 3
    assert row["TPOT p99 (ms)"] == 20.0
