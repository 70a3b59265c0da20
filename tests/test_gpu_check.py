"""The GPU check script runs end to end (on CPU with a tiny model here, so it cannot rot)."""

from __future__ import annotations

import json
from pathlib import Path

from tspbench.cli import main


def test_gpu_check_smoke_run_on_cpu(tmp_path: Path) -> None:
    assert main(["gpu-check", "--device", "cpu", "--quick", "--out", str(tmp_path)]) == 0
    report = json.loads(next(tmp_path.glob("gpu_check_cpu_*.json")).read_text())
    assert max(report["offset_attention_rel_err"].values()) < 1e-5
    assert report["calibration"]["gemm_tflops"] > 0
    for point in report["strategies"]:
        assert point["status"] == "completed", point
        assert abs(point["predicted_memory_error"]) < 0.10, point


def test_gpu_check_refuses_without_a_gpu_unless_asked(tmp_path: Path) -> None:
    import torch

    if not torch.cuda.is_available():
        assert main(["gpu-check", "--out", str(tmp_path)]) == 2
