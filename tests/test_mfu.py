"""Measured MFU in bench records and the report.

One real point (tiny preset, TP 2 on CPU, one timed step): its ``mfu`` must be the model FLOPs
per second per rank over the peak of the profile the test reads itself (the ``cpu`` profile's
``peak_tflops``), the record must name the FLOP convention and where the peak comes from, and
the report's summary must show the figure for the measured row. GPU names pick their shipped
profile; a GPU without one gets no MFU and a reason, never a CPU or a wrong GPU's peak.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from tspbench.analytic.mfu import device_profile
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.measure.bench import bench
from tspbench.report.frame import prepare
from tspbench.report.tables import summary_table

pytestmark = pytest.mark.slow  # multi-rank runs, sweeps or Slurm: make test, not make check

PROFILES = Path(__file__).resolve().parents[1] / "tspbench" / "analytic" / "profiles"
LAYOUT = Layout("tp", tp=2)


@pytest.fixture(scope="module")
def record() -> dict:
    workload = Workload(ModelConfig.preset("tiny"), 1, 256, "train", dtype="float32")
    out = bench(LAYOUT, workload, steps=1, warmup=1, hardware="cpu")
    assert out["status"] == "completed", out["error"]
    return out


def cpu_peak_tflops() -> float:
    return yaml.safe_load((PROFILES / "cpu.yaml").read_text())["peak_tflops"]


def test_measured_mfu_is_model_flops_per_second_per_rank_over_the_cpu_peak(record: dict) -> None:
    peak = cpu_peak_tflops()
    per_rank = record["model_flops_per_step"] / record["step_time_s"] / record["world_size"]
    assert record["mfu"] == pytest.approx(per_rank / (peak * 1e12), rel=1e-12)
    assert record["mfu_peak_tflops"] == peak
    predicted = record["model_flops_per_step"] / record["predicted_step_time_s"] / record["world_size"]
    assert record["predicted_mfu"] == pytest.approx(predicted / (peak * 1e12), rel=1e-12)
    assert "causal attention as half the S x S square" in record["mfu_flop_convention"]
    assert record["mfu_peak_source"].startswith("cpu profile")
    assert "GEMM rate" in record["mfu_peak_source"]  # no datasheet peak on a CPU: said so


def test_the_report_summary_shows_mfu_for_measured_rows(record: dict) -> None:
    table = summary_table(prepare(pd.DataFrame([record])))
    assert list(table["source"]) == ["measured"]
    assert table["MFU (%)"].iloc[0] == round(record["mfu"] * 100, 1)


@pytest.mark.parametrize(
    ("device", "hardware", "name", "profile"),
    [
        ("cuda", None, "NVIDIA H200", "h200"),
        ("cuda", None, "NVIDIA A100-SXM4-80GB", "a100"),
        ("cuda", "mi300x", "AMD Instinct MI300X", "mi300x"),
        ("cpu", "mi300x", "x86_64", "cpu"),  # a GPU's profile does not describe a CPU run
    ],
)
def test_the_peak_is_the_profile_of_the_device_the_point_ran_on(
    device: str, hardware: str | None, name: str, profile: str
) -> None:
    hw, why = device_profile(device, hardware, name)
    assert hw is not None and why.startswith(f"{profile} profile")
    assert hw.peak_tflops == yaml.safe_load((PROFILES / f"{profile}.yaml").read_text())["peak_tflops"]


def test_a_gpu_without_a_profile_gets_no_mfu_and_a_reason() -> None:
    hw, why = device_profile("cuda", None, "Some Future GPU")
    assert hw is None and "no hardware profile for 'Some Future GPU'" in why and "--hardware" in why
