"""calibrate's step figures: element-wise passes are seconds over the bytes of the step that ran."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tspbench.calibrate import step_figures
from tspbench.calibrate.probes import Rate
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.strategy import check_layout


def test_passes_on_a_gpu_are_over_the_bf16_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the profiled step runs in bf16: one second of element-wise work at 1 GB/s is
    1e9 bytes over the bf16 step's activation bytes (not float32's, which are twice as many)."""
    model = replace(ModelConfig.preset("tiny"), n_layers=2)
    monkeypatch.setattr(step_figures, "device_dtype", lambda: ("cuda", "bfloat16"))
    one_second = dict.fromkeys(("train", "infer", "optimizer"), Rate(1.0, 0.0, 1))
    monkeypatch.setattr(step_figures, "launch", lambda *a, **k: [one_second])
    passes = step_figures.elementwise_passes(step_figures.Recorder(), model, 256, 1e9, 1)
    workload = Workload(model, 1, 256, "train", "none", "bfloat16", "cuda")
    bf16 = check_layout(Layout("dp"), workload).for_analysis(Layout("dp"), workload)
    assert passes["train"] == pytest.approx(1e9 / (2 * bf16.elementwise_layer_bytes()), rel=1e-2)
