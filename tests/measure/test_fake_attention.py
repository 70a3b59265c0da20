"""The fake world's simulated GPU runs the attention kernel of the GPU its profile describes:
cuDNN's on an H100 or H200 (sm90, SDPA's first choice there), ROCm's flash on an MI300X, forward
and backward, at an offset (TSP's query chunks) and as causal squares, and the record says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from tspbench.analytic.profile_choice import choose_profile
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.core.trace import load_traces
from tspbench.measure.fake import fake_bench

CUDNN = {"_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward"}
FLASH = {"_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "hardware, kernel, ops", [("h100", "cudnn", CUDNN), ("h200", "cudnn", CUDNN), ("mi300x", "flash", FLASH)]
)
def test_a_simulated_gpu_runs_its_profiles_attention_kernel(
    tmp_path: Path, hardware: str, kernel: str, ops: set[str]
) -> None:
    workload = Workload(ModelConfig.preset("tiny"), 1, 256, "train", "none", "bfloat16", "cuda")
    path = tmp_path / "trace.npz"
    profile = choose_profile(hardware, device="cuda", measured=False)
    record = fake_bench(Layout("tsp", tsp=2), workload, hardware=profile, trace_path=path)
    assert record["status"] == "completed", record.get("error")
    assert record["attention_kernel"] == kernel
    traces, _ = load_traces(path)
    names = {name for trace in traces for name in trace.names}
    assert ops <= names
    assert not (CUDNN | FLASH) - ops & names
