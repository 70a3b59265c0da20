"""The closed form's per-kernel and host costs (tspbench.analytic.timing) against the timeline's,
which charges them op by op on the step's traced events: what a profile's op_overhead_us and
host_overhead_us add to a step is the same in both models, and a GPU host launching slower than
the device runs bounds the step."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tspbench.analytic.hardware import load_hardware
from tspbench.analytic.predict import predict
from tspbench.analytic.profile_choice import choose_profile
from tspbench.analytic.timeline import timeline
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.core.trace import ATTENTION, COMPUTE, GEMM, VIEW, RankTrace, load_traces
from tspbench.measure.fake import fake_bench

TWO_LAYERS = replace(ModelConfig.preset("1b"), n_layers=2)
WORKLOAD = Workload(TWO_LAYERS, 1, 1024, "train", "none", "bfloat16", "cuda")


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> RankTrace:
    """The dp step of WORKLOAD, traced in the fake world."""
    path = Path(tmp_path_factory.mktemp("trace")) / "step.npz"
    choice = choose_profile("h100", device="cuda", measured=False)
    fake_bench(Layout("dp"), WORKLOAD, hardware=choice, trace_path=path)
    return load_traces(path)[0][0]


def both(hw, trace: RankTrace) -> tuple[float, float]:
    return predict(Layout("dp"), WORKLOAD, hw).step_time_s, timeline([trace], hw, 1).step_s


def test_op_overhead_adds_what_the_timeline_adds_where_bytes_are_counted(trace: RankTrace) -> None:
    """mi300x counts element-wise bytes from the code: every kernel pays op_overhead_us in both."""
    base = replace(load_hardware("mi300x"), op_overhead_us=0.0)
    assert not base.elementwise_passes
    more = replace(base, op_overhead_us=5.0)
    closed, replayed = (a - b for a, b in zip(both(more, trace), both(base, trace), strict=True))
    kernels = int(np.sum((trace.events["kind"] == COMPUTE) & (trace.events["cls"] != VIEW)))
    assert replayed == pytest.approx(kernels * 5e-6, rel=1e-9)
    assert closed == pytest.approx(replayed, rel=1e-9)


def test_measured_passes_hold_their_element_wise_kernels_fixed_cost(trace: RankTrace) -> None:
    """h200's passes are device time: op_overhead_us adds to its GEMM and attention kernels only."""
    base = replace(load_hardware("h200"), op_overhead_us=0.0)
    closed = both(replace(base, op_overhead_us=5.0), trace)[0] - both(base, trace)[0]
    ev = trace.events
    kernels = int(np.sum((ev["kind"] == COMPUTE) & np.isin(ev["cls"], (GEMM, ATTENTION))))
    assert closed == pytest.approx(kernels * 5e-6, rel=1e-9)


def test_host_time_per_op_adds_what_the_timeline_adds(trace: RankTrace) -> None:
    """host_overhead_us on every op the host dispatches, views too, in both models."""
    base = replace(load_hardware("h100"), op_overhead_us=0.0, host_overhead_us=0.0)
    more = replace(base, host_overhead_us=4.0)
    closed, replayed = (a - b for a, b in zip(both(more, trace), both(base, trace), strict=True))
    assert replayed == pytest.approx(int(np.sum(trace.events["kind"] == COMPUTE)) * 4e-6, rel=1e-9)
    assert closed == pytest.approx(replayed, rel=1e-9)


def test_a_host_slower_than_the_device_bounds_the_step(trace: RankTrace) -> None:
    """launch_us: a step of n ops takes n x launch_us where that is longer than its device time
    (a short step), and nothing more where the device is slower (the committed 1b 8K step)."""
    hw = replace(load_hardware("h200"), launch_us=1000.0)
    ops = int(np.sum(trace.events["kind"] == COMPUTE))
    assert predict(Layout("dp"), WORKLOAD, hw).compute_s == pytest.approx(ops * 1e-3, rel=1e-9)
    shipped = load_hardware("h200")
    big = replace(WORKLOAD, model=ModelConfig.preset("1b"), seq_len=8192)
    assert predict(Layout("dp"), big, shipped).step_time_s == pytest.approx(
        predict(Layout("dp"), big, replace(shipped, launch_us=0.0)).step_time_s, rel=1e-12
    )
