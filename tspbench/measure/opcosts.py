"""What an op costs on this host, measured: the timeline's per-op terms (tspbench.analytic.timeline).

A step of the model is run twice more after warm-up: once traced (tspbench.measure.trace: each
op's name, bytes and FLOPs as the replay sees them) and once under torch.profiler (each aten op's
self time). Grouped by op name, the two give per name: calls, bytes, FLOPs and seconds. Then

    element-wise ops   seconds = calls x op_overhead + bytes / bandwidth      (least squares,
                       relative error, over every element-wise op name)
    GEMMs              seconds = calls x op_overhead + FLOPs / rate
    host               what a step spends outside every traced op's aten kernel (Python, the
                       autograd engine, dispatch, composite ops' wrappers), per traced op

``kind_seconds`` groups a profiled step's self time by the replay's cost classes, which is what
the replayed compute of each kind is held against (the timeline's op-level check).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.core.trace import CLASS_NAMES, COMPUTE, ELEMENTWISE, GEMM, RankTrace, op_class
from tspbench.measure.runner import RankRun
from tspbench.measure.trace import StepRecorder


@dataclass
class OpTotals:
    """One op name's calls, bytes and FLOPs in a traced step, and its profiled self seconds."""

    calls: int = 0
    nbytes: float = 0.0
    flops: float = 0.0
    seconds: float = 0.0


def traced(step: Callable[[], object], rank: int = 0) -> RankTrace:
    with StepRecorder(rank) as recorder:
        step()
    return recorder.trace()


def profiled(step: Callable[[], object]) -> dict[str, float]:
    """Self CPU seconds of every aten op of one ``step()``, by name (no ``aten::``, no overload)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    out: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        if event.key.startswith("aten::"):
            out[event.key.removeprefix("aten::")] += event.self_cpu_time_total * 1e-6
    return dict(out)


def totals(trace: RankTrace, seconds: dict[str, float]) -> dict[str, OpTotals]:
    """Per op name of the trace's compute events: calls, bytes, FLOPs, and profiled seconds."""
    ev = trace.events[trace.events["kind"] == COMPUTE]
    out: dict[str, OpTotals] = defaultdict(OpTotals)
    for name, nbytes, flops in zip(ev["name"], ev["nbytes"], ev["flops"], strict=True):
        t = out[trace.names[name]]
        t.calls += 1
        t.nbytes += float(nbytes)
        t.flops += float(flops)
    for name, t in out.items():
        t.seconds = seconds.get(name, 0.0)
    return dict(out)


def kind_seconds(trace: RankTrace, seconds: dict[str, float]) -> dict[str, float]:
    """A profiled step's aten self time by the replay's cost classes, for the op names the trace
    has (what the profiler shows of composite ops' wrappers is host time, not a kind)."""
    names = {trace.names[i] for i in set(trace.events["name"][trace.events["kind"] == COMPUTE].tolist())}
    out: dict[str, float] = defaultdict(float)
    for name in names:
        out[CLASS_NAMES[op_class(name)]] += seconds.get(name, 0.0)
    return dict(out)


def fit_elementwise(ops: dict[str, OpTotals]) -> tuple[float, float]:
    """(op overhead s, bandwidth bytes/s) of the element-wise ops: seconds = calls a + bytes / b,
    least squares in relative error over op names with time, a and 1/b kept non-negative."""
    rows = [t for name, t in ops.items() if op_class(name) == ELEMENTWISE and t.seconds > 0 and t.calls]
    if len(rows) < 2:
        raise ValueError("too few element-wise ops to fit an overhead and a bandwidth")
    a = np.array([[t.calls / t.seconds, t.nbytes / t.seconds] for t in rows])
    coef, *_ = np.linalg.lstsq(a, np.ones(len(rows)), rcond=None)
    overhead, inverse_bandwidth = max(coef[0], 0.0), max(coef[1], 1e-15)
    return overhead, 1 / inverse_bandwidth


def gemm_rate(ops: dict[str, OpTotals], overhead: float) -> float:
    """FLOPs per second of the GEMMs, their per-call overhead taken out."""
    rows = [t for name, t in ops.items() if op_class(name) == GEMM and t.flops > 0]
    busy = sum(t.seconds - overhead * t.calls for t in rows)
    return sum(t.flops for t in rows) / busy if busy > 0 else float("nan")


def host_seconds(wall_s: float, trace: RankTrace, seconds: dict[str, float]) -> float:
    """Seconds per traced op that the step spends outside the traced ops' aten kernels."""
    names = {trace.names[i] for i in set(trace.events["name"].tolist())}
    kernels = sum(seconds.get(n, 0.0) for n in names)
    ops = int((trace.events["kind"] == COMPUTE).sum())
    return max(wall_s - kernels, 0.0) / max(ops, 1)


def step_costs(step: Callable[[], object], repeats: int) -> dict[str, object]:
    """Everything above for ``step`` (after the caller's warm-up): medians over ``repeats``."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    trace = traced(step, rank)
    walls, profiles = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        walls.append(time.perf_counter() - start)
        profiles.append(profiled(step))
    names = set().union(*profiles)
    seconds = {n: statistics.median(p.get(n, 0.0) for p in profiles) for n in names}
    ops = totals(trace, seconds)
    overhead, bandwidth = fit_elementwise(ops)
    by_op = {
        name: t.nbytes / (t.seconds - overhead * t.calls) / 1e9
        for name, t in ops.items()
        if op_class(name) == ELEMENTWISE and t.nbytes > 0 and t.seconds > overhead * t.calls
    }
    return {
        "by_op": by_op,
        "op_overhead_us": overhead * 1e6,
        "elementwise_bandwidth_gbs": bandwidth / 1e9,
        "gemm_tflops": gemm_rate(ops, overhead) / 1e12,
        "host_overhead_us": host_seconds(statistics.median(walls), trace, seconds) * 1e6,
        "kinds": kind_seconds(trace, seconds),
        "wall_s": statistics.median(walls),
        "ops": len(trace),
    }


def timeline_costs_rank(model: ModelConfig, tokens: int, repeats: int) -> dict[str, object]:
    """On a launched world of one rank: the timeline's per-op terms of a training step of
    ``model`` at ``tokens`` tokens (after two warm-up steps), as profile fields."""
    run = RankRun(Layout("dp"), Workload(model, 1, tokens, "train", dtype="float32"))
    run.step()
    run.step()
    costs = step_costs(run.step, repeats)
    return {
        "op_overhead_us": round(float(costs["op_overhead_us"]), 3),
        "host_overhead_us": round(float(costs["host_overhead_us"]), 2),
        "step_gemm_tflops": round(float(costs["gemm_tflops"]), 6),
        "elementwise_by_op": {name: round(float(gbs), 3) for name, gbs in sorted(costs["by_op"].items())},
    }


def profiled_rank(layout: Layout, workload: Workload, repeats: int) -> dict[str, object]:
    """On every rank of a launched world: a traced step and the median profiled self time by op
    name over ``repeats`` steps (after two warm-up steps), for the op-level check."""
    run = RankRun(layout, workload)
    run.step()
    run.step()
    trace = traced(run.step, dist.get_rank() if dist.is_initialized() else 0)
    profiles = [profiled(run.step) for _ in range(repeats)]
    names = set().union(*profiles)
    return {"trace": trace, "seconds": {n: statistics.median(p.get(n, 0.0) for p in profiles) for n in names}}
