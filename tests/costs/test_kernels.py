"""The kernel count of a step (tspbench.costs.kernels) against the ops of the step itself, traced
in the fake world (every op the code runs, classed as the timeline prices it): the count comes
from tables, the expectation from executing the model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tspbench.analytic.profile_choice import choose_profile
from tspbench.checks.gpu_points import layout_workload
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.core.trace import ATTENTION, COMPUTE, ELEMENTWISE, GEMM, load_traces
from tspbench.costs.kernels import step_kernels
from tspbench.measure.fake import fake_bench


def traced_counts(workload: Workload, tmp_path: Path) -> tuple[int, int, int, int]:
    """(GEMM, attention, element-wise, no-kernel) compute events of the traced dp step."""
    profile = "h200" if workload.device == "cuda" else "cpu"
    choice = choose_profile(profile, device=workload.device, measured=False)
    path = tmp_path / "step.npz"
    fake_bench(Layout("dp"), workload, hardware=choice, trace_path=path)
    ev = load_traces(path)[0][0].events
    compute = ev["cls"][ev["kind"] == COMPUTE]
    kinds = [int(np.sum(compute == c)) for c in (GEMM, ATTENTION, ELEMENTWISE)]
    return kinds[0], kinds[1], kinds[2], int(compute.size) - sum(kinds)


CASES = [
    # (preset, layers, tokens, mode, recompute, dtype, device): two depths, each phase and dtype
    ("1b", 3, 512, "train", "none", "bfloat16", "cuda"),
    ("1b", 5, 512, "train", "full", "bfloat16", "cuda"),
    ("7b", 2, 256, "infer", "none", "bfloat16", "cuda"),
    ("1b", 6, 256, "train", "selective", "bfloat16", "cuda"),
    ("1b", 4, 256, "train", "op", "bfloat16", "cuda"),
    ("tiny", 4, 64, "train", "op", "float32", "cpu"),
    ("tiny-gqa", 3, 128, "train", "none", "bfloat16", "cuda"),
    ("tiny", 3, 64, "train", "full", "float32", "cpu"),
    ("tiny", 5, 64, "infer", "none", "float32", "cpu"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_the_count_is_the_traced_steps(case: tuple, tmp_path: Path) -> None:
    preset, layers, tokens, mode, recompute, dtype, device = case
    model = replace(ModelConfig.preset(preset), n_layers=layers)
    workload = Workload(model, 1, tokens, mode, recompute, dtype, device)
    k = step_kernels(workload)
    assert (k.gemm, k.attention, k.elementwise, k.views) == traced_counts(workload, tmp_path)


MEASURED = sorted(Path(__file__).resolve().parents[2].glob("results/h200/*/bench/*.npz"))


@pytest.mark.parametrize("path", MEASURED, ids=lambda p: f"{p.parents[1].name}-{p.stem}")
def test_the_count_is_the_kernels_of_the_steps_traced_on_the_h200(path: Path) -> None:
    """The steps traced on one H200 (committed): the same GEMM, attention and element-wise ops.
    (Their ops without a kernel, which cost no device time, are left out: the full-recomputation
    step at dd1d213 traced 3 views a layer more than today's code.)"""
    _, workload = layout_workload(json.loads(path.with_suffix(".json").read_text()))
    ev = load_traces(path)[0][0].events
    compute = ev["cls"][ev["kind"] == COMPUTE]
    k = step_kernels(workload)
    traced = tuple(int(np.sum(compute == c)) for c in (GEMM, ATTENTION, ELEMENTWISE))
    assert (k.gemm, k.attention, k.elementwise) == traced
