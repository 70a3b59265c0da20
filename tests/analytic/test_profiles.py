"""The shipped hardware profiles as data: the h200's measured element-wise passes follow from the
committed measurement over the bytes of the step that ran (bf16), and every figure of every GPU
profile says where it comes from."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tspbench.analytic.hardware import load_hardware
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.strategy import check_layout

ROOT = Path(__file__).resolve().parents[2]
PARTS = str(ROOT / "results/h200/2026-12-04_149a5a5/probes/calibrate_parts_{}.json")
SEVEN_B_4 = replace(ModelConfig.preset("7b"), n_layers=4, name="7b-4layers")


def _sized(tokens: int, mode: str):
    """The analytic sizes of the bf16 step calibrate profiled on the H200 (one rank, whole model)."""
    workload = Workload(SEVEN_B_4, 1, tokens, mode, "none", "bfloat16", "cuda")
    return check_layout(Layout("dp"), workload).for_analysis(Layout("dp"), workload)


def test_h200_passes_are_the_measured_seconds_over_the_bf16_step_bytes() -> None:
    """Element-wise seconds (8K and 32K, the committed files) = a + activation bytes x passes / HBM:
    two sizes, two unknowns; the forward at 32K alone. Bytes in the dtype the step ran in."""
    hw = load_hardware("h200")
    files = {k: Path(PARTS.format(k)) for k in ("8k", "32k")}
    seconds = {k: json.loads(f.read_text())["elementwise"]["result"] for k, f in files.items()}
    bw = hw.hbm_bandwidth_gbs * 1e9
    train = [4 * _sized(n, "train").elementwise_layer_bytes() for n in (8192, 32768)]
    per_byte = (seconds["32k"]["train"] - seconds["8k"]["train"]) / (train[1] - train[0])  # s per byte
    intercept_s = seconds["8k"]["train"] - per_byte * train[0]
    params = _sized(8192, "train").predict_memory().persistent["parameters"]
    forward = 4 * _sized(32768, "infer").elementwise_layer_bytes()
    assert hw.elementwise_passes["train"] == pytest.approx(per_byte * bw, abs=0.01)
    assert hw.elementwise_passes["optimizer"] == pytest.approx(intercept_s * bw / params, abs=0.01)
    assert hw.elementwise_passes["infer"] == pytest.approx(seconds["32k"]["infer"] * bw / forward, abs=0.01)


def test_h200_optimizer_passes_agree_with_what_adamw_moves() -> None:
    """The fitted intercept, as passes over the bf16 parameter bytes, is within 5% of the 96 bytes
    per bf16 parameter the optimizer's code moves (48 passes over its 2 bytes)."""
    assert load_hardware("h200").elementwise_passes["optimizer"] == pytest.approx(96 / 2, rel=0.05)
