"""The shipped hardware profiles as data: the h200's measured element-wise passes follow from the
committed measurement over the bytes of the step that ran (bf16), and every figure of every GPU
profile says where it comes from."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from tspbench.analytic.hardware import available_hardware, find_profile, load_hardware
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


KINDS = ("datasheet", "assumed", "measured", "carried", "fitted")
GPU_PROFILES = [n for n in available_hardware() if load_hardware(n).cores_per_node is None]


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_every_figure_of_a_gpu_profile_says_where_it_comes_from(name: str) -> None:
    """Each key a shipped GPU profile sets has a provenance that starts with its kind (fitted:
    only the calibrated profiles backtest --fit wrote), and one carried from another GPU's
    measurement names the ratio it was carried at."""
    data = yaml.safe_load(find_profile(name).read_text())
    hw = load_hardware(name)
    for key in sorted(set(data) - {"name", "description", "sources", "provenance"}):
        source = hw.source_of(key)
        assert source.startswith(KINDS), f"{name}.{key}: {source[:60]!r}"
        assert not source.startswith("fitted") or "calibrated" in name, f"{name}.{key} is a fit"
        if source.startswith("carried"):
            assert re.search(r"ratio (1\b|\d[\d.]* / [\d.]+|[\d.]+)", source), f"{name}.{key}: no ratio"


def test_the_h100_carries_the_h200_measurement_at_the_stated_ratios() -> None:
    """Compute at ratio 1 (the same SMs and clocks), HBM at the datasheets' 3.35 / 4.8 TB/s."""
    h100, h200 = load_hardware("h100"), load_hardware("h200")
    assert (h100.gemm_tflops, h100.step_gemm_tflops) == (h200.gemm_tflops, h200.step_gemm_tflops)
    assert h100.attention_causal_by_size == h200.attention_causal_by_size
    assert h100.hbm_bandwidth_gbs == pytest.approx(h200.hbm_bandwidth_gbs * 3.35 / 4.8, rel=1e-6)
    assert h100.elementwise_passes == h200.elementwise_passes
    assert "carried" not in " ".join(load_hardware("mi300x").provenance.values())
