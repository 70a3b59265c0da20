"""GPU-hours and energy per token (tspbench.analytic.cost), by hand on small records (#43)."""

from __future__ import annotations

import pytest

from tspbench.analytic.cost import cost_fields, record_costs
from tspbench.analytic.hardware import load_hardware

TRAIN = {"status": "completed", "mode": "train", "source": "predicted", "hardware": "mi300x",
         "world_size": 8, "step_time_s": 2.0, "tokens_per_step": 16384, "device": "cuda"}  # fmt: skip


def test_training_hours_and_projected_energy_by_hand() -> None:
    out = record_costs(TRAIN)
    assert out["gpu_hours_per_btok"] == pytest.approx(8 * 2 / 16384 / 3600 * 1e9)  # 271.27
    assert out["gpu_hours_per_btok"] == pytest.approx(271.267, abs=1e-3)
    assert out["energy_per_token_j"] == pytest.approx(750 * 8 * 2 / 16384)  # 0.7324 J/token
    assert out["gpu_hours_source"] == "projected (analytic model on mi300x)"
    assert out["energy_per_token_source"] == "projected (mi300x board power, datasheet)"
    assert out["gpu_hours_per_mtok"] is None


def test_a_measured_step_is_measured_and_the_500w_profile_says_assumed() -> None:
    record = {**TRAIN, "source": "measured", "hardware": None, "predicted_hardware": "h100-96gb-500w"}
    out = record_costs(record)
    assert out["gpu_hours_source"] == "measured"
    assert out["energy_per_token_j"] == pytest.approx(500 * 8 * 2 / 16384)
    assert out["energy_per_token_source"] == "projected (h100-96gb-500w board power, assumed)"


def test_decode_counts_generated_tokens_and_keeps_a_measured_energy() -> None:
    record = {"status": "completed", "mode": "decode", "source": "measured", "world_size": 8, "dp": 2,
              "batch": 4, "tpot_s": 0.01, "energy_per_token_j": 2.5, "energy_source": "nvml",
              "predicted_hardware": "h200", "device": "cuda"}  # fmt: skip
    out = record_costs(record)
    assert out["gpu_hours_per_mtok"] == pytest.approx(8 * 0.01 / 8 / 3600 * 1e6)  # 8 sequences a step
    assert out["energy_per_token_j"] == 2.5
    assert out["energy_per_token_source"] == "measured (NVML)"
    projected = record_costs({**record, "energy_per_token_j": None, "energy_source": None})
    assert projected["energy_per_token_j"] == pytest.approx(700 * 8 * 0.01 / 8)


def test_no_time_no_cost_and_no_board_power_no_energy() -> None:
    assert set(record_costs({**TRAIN, "status": "oom"}).values()) == {None}
    fake = {**TRAIN, "source": "fake", "step_time_s": None}  # a fake world without a timeline
    assert set(record_costs(fake).values()) == {None}
    cpu = cost_fields({**TRAIN, "source": "measured"}, load_hardware("cpu"))
    assert cpu["gpu_hours_per_btok"] == pytest.approx(271.267, abs=1e-3)
    assert cpu["energy_per_token_j"] is None
    assert cpu["energy_per_token_source"] == "none: the cpu profile states no board power"
