"""Measured MFU in bench records and the report.

One real point (tiny preset, TP 2 on CPU, one timed step): its ``mfu`` must be the model FLOPs
per second per rank over the peak of the profile the test reads itself (the ``cpu`` profile's
``peak_tflops``), the record must name the FLOP convention and where the peak comes from, and
the report's summary must show the figure for the measured row. GPU names pick their shipped
profile; a GPU without one, or a run priced on another kind of device's profile, gets no MFU
and a reason, never a CPU's or a wrong GPU's peak.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from tspbench.analytic.mfu import mfu_fields
from tspbench.analytic.profile_choice import choose_profile
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.measure.bench import bench
from tspbench.report.frame import prepare
from tspbench.report.tables import summary_table

pytestmark = pytest.mark.slow  # multi-rank runs, sweeps or Slurm: make test, not make check

PROFILES = Path(__file__).resolve().parents[2] / "tspbench" / "analytic" / "profiles"
LAYOUT = Layout("tp", tp=2)
A_STEP = {"model_flops_per_step": 1e15, "step_time_s": 1.0}


@pytest.fixture(scope="module")
def record() -> dict:
    workload = Workload(ModelConfig.preset("tiny"), 1, 256, "train", dtype="float32")
    host = choose_profile(None, device="cpu", measured=True)  # the device's profile: cpu
    out = bench(LAYOUT, workload, host, steps=1, warmup=1)
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
    ("device", "named", "name", "profile"),
    [
        ("cuda", None, "NVIDIA H200", "h200"),
        ("cuda", None, "NVIDIA A100-SXM4-80GB", "a100"),
        ("cuda", "mi300x", "AMD Instinct MI300X", "mi300x"),
        ("cpu", None, "x86_64", "cpu"),
    ],
)
def test_the_peak_is_the_profile_of_the_device_the_point_ran_on(
    device: str, named: str | None, name: str, profile: str
) -> None:
    choice = choose_profile(named, device=device, device_name=name, measured=True)
    out = mfu_fields(LAYOUT, A_STEP, choice)
    assert out["mfu_peak_source"].startswith(f"{profile} profile") and out["mfu"] is not None
    assert out["mfu_peak_tflops"] == yaml.safe_load((PROFILES / f"{profile}.yaml").read_text())["peak_tflops"]


@pytest.mark.parametrize(
    ("device", "named", "name"),
    [("cuda", None, "Some Future GPU"), ("cpu", "mi300x", "x86_64")],  # no profile; a GPU's for a CPU run
)
def test_a_profile_that_is_not_the_devices_gives_no_mfu_and_a_reason(
    device: str, named: str | None, name: str
) -> None:
    choice = choose_profile(named, device=device, device_name=name, measured=True)
    out = mfu_fields(LAYOUT, A_STEP, choice)
    assert out["mfu"] is None and out["mfu_peak_tflops"] is None
    assert "does not describe the device" in out["mfu_peak_source"], out["mfu_peak_source"]
    assert named or ("'Some Future GPU'" in choice.reason and "--hardware" in choice.reason)
