"""The element-wise time of a profiled single-device step (calibrate's element-wise passes),
and what torch.profiler records on this machine: an op's own time is its CPU time on a CPU, its
kernels' device time on a GPU (where the host's time would be launch time)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from tspbench.calibrate.probes import Rate
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.measure.runner import RankRun

GEMM_OPS = frozenset(  # and the wrappers that dispatch them
    {"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}
)
OPTIMIZER_REGION = "Optimizer.step#"


def elementwise_seconds(step: Callable[[], object]) -> tuple[float, float]:
    """(element-wise, optimizer) seconds of one ``step()``, by torch.profiler: the self time of
    every aten op that is not a GEMM, an attention kernel or a collective; the optimizer's
    region (AdamW: all element-wise) apart. Self time on the CPU, device time on a GPU (where the
    host's self time would be launch time)."""
    cuda = torch.cuda.is_available()
    with profile(activities=profiler_activities()) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    other = optimizer = 0.0
    for event in prof.key_averages():
        name = event.key
        if name.startswith(OPTIMIZER_REGION) and not cuda:
            optimizer += event.cpu_time_total * 1e-6
        elif name.startswith("aten::") and name not in GEMM_OPS and "attention" not in name:
            other += self_seconds(event, cuda)
    if cuda:  # a region has no device time of its own: its ops' kernels are summed
        optimizer = region_device_seconds(prof.events(), OPTIMIZER_REGION)
    return max(other - optimizer, 0.0), optimizer


def region_device_seconds(events, prefix: str) -> float:
    """Device seconds of the kernels of every op inside the regions named ``prefix...`` (on one
    H200 the optimizer's region itself showed none: results/h200/2026-12-04_149a5a5)."""
    total, stack = 0.0, [e for e in events if e.name.startswith(prefix)]
    while stack:
        event = stack.pop()
        total += 0.0 if event.name.startswith(prefix) else event.self_device_time_total
        stack.extend(event.cpu_children)
    return total * 1e-6


def profiler_activities() -> list[ProfilerActivity]:
    """What torch.profiler records here: the CPU, and the GPU's kernels where there is one."""
    return (
        [ProfilerActivity.CPU, ProfilerActivity.CUDA] if torch.cuda.is_available() else [ProfilerActivity.CPU]
    )


def self_seconds(event, cuda: bool) -> float:
    """An op's own time in a profile: its kernels' device time on a GPU, its CPU time elsewhere."""
    return (event.self_device_time_total if cuda else event.self_cpu_time_total) * 1e-6


def whole_seconds(event, cuda: bool) -> float:
    """An op's time with the ops it calls: its kernels' and theirs on a GPU, its CPU time elsewhere."""
    return (event.device_time_total if cuda else event.cpu_time_total) * 1e-6


def elementwise_rank(
    model: ModelConfig, tokens: int, repeats: int, device: str = "cpu", dtype: str = "float32"
) -> dict[str, Rate]:
    """Element-wise seconds of a single-device step of ``model`` at ``tokens`` tokens (a world of
    one rank): a training step's (optimizer apart), the optimizer's, and a forward's (prefill);
    each the median over ``repeats`` profiled steps after two warm-up steps."""
    runs = {
        mode: RankRun(Layout("dp"), Workload(model, 1, tokens, mode, "none", dtype, device))
        for mode in ("train", "infer")
    }
    for run in runs.values():
        run.step()
        run.step()
    samples: dict[str, list[float]] = {"train": [], "optimizer": [], "infer": []}
    for _ in range(repeats):
        train, optimizer = elementwise_seconds(runs["train"].step)
        samples["train"].append(train)
        samples["optimizer"].append(optimizer)
        samples["infer"].append(elementwise_seconds(runs["infer"].step)[0])
    return {k: Rate.of(v) for k, v in samples.items()}
