"""What an op costs on this host, measured: the timeline's per-op terms (tspbench.analytic.timeline).

A step of the model is run twice more after warm-up: once traced (tspbench.measure.trace: each
op's name, bytes and FLOPs as the replay sees them) and once under torch.profiler (each op the
trace records timed whole, with the ops it calls; every other aten op by its self time: see
``whole_op_seconds``). Grouped by op name, the two give per name: calls, bytes, FLOPs and
seconds. Then

    element-wise ops   seconds = calls x op_overhead + bytes / bandwidth      (least squares,
                       relative error, over every element-wise op name)
    GEMMs              seconds = calls x op_overhead + FLOPs / rate
    host               what a step spends outside every traced op's aten kernel (Python, the
                       autograd engine, dispatch, composite ops' wrappers), per traced op; for
                       the profile measured on the same step at HOST_TOKENS tokens, where the
                       kernels do not drown it (host_seconds_per_op)

``kind_seconds`` groups a profiled step's self time by the replay's cost classes, which is what
the replayed compute of each kind is held against (the timeline's op-level check).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch.autograd import DeviceType
from torch.profiler import profile

from tspbench.calibrate.opclock import OpClock
from tspbench.calibrate.profiled import profiler_activities, self_seconds, whole_seconds
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.core.trace import ATTENTION, CLASS_NAMES, COMPUTE, ELEMENTWISE, GEMM, RankTrace, op_class
from tspbench.measure import schedstat
from tspbench.measure.runner import RankRun
from tspbench.measure.trace import StepRecorder

# An op's own bandwidth is kept only where its calls move this much each: below it a call's time is
# its overhead, and the rate would price that op's big calls in other layouts absurdly low.
MIN_BYTES_PER_CALL = 1 << 20
# The host's time per op is measured on a step this short (its kernels a small part of it), the
# median of this many steps' residuals at least.
HOST_TOKENS, HOST_REPEATS = 128, 9


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


def profiled(step: Callable[[], object], whole: Collection[str] = ()) -> dict[str, float]:
    """Seconds of every aten op of one ``step()``, by name (no ``aten::``, no overload): its CPU
    time, or on a GPU its kernels' device time (``attention_kernels_unattributed`` adds the
    attention kernels the profiler ties to no op). An op named in ``whole`` (those a trace
    records) is timed whole, with the ops it calls, which then count under its name and not
    their own (``whole_op_seconds``); every other op by its self time."""
    cuda = torch.cuda.is_available()
    with profile(activities=profiler_activities()) as prof:
        synced(step)
    out: dict[str, float] = defaultdict(float)
    if whole:
        out.update(whole_op_seconds(prof.events(), frozenset(whole), cuda))
    else:
        for event in prof.key_averages():
            if event.key.startswith("aten::"):
                out[event.key.removeprefix("aten::")] += self_seconds(event, cuda)
    if cuda:
        out[UNATTRIBUTED_ATTENTION] += attention_kernels_unattributed(prof.key_averages(), out)
    return dict(out)


def whole_op_seconds(events, whole: frozenset[str], cuda: bool) -> dict[str, float]:
    """Per aten op name: the whole time (self and callees) of every outermost call of an op in
    ``whole``, and the self time of every other op outside those. A trace records an op whole
    and prices its bytes: ``_to_copy`` calls ``copy_`` inside, and by self time its conversion's
    time would count as ``copy_``'s, pricing the step's own ``copy_`` calls as if they moved it."""
    out: dict[str, float] = defaultdict(float)
    stack = [e for e in events if e.cpu_parent is None]
    while stack:
        event = stack.pop()
        name = event.name.removeprefix("aten::") if event.name.startswith("aten::") else None
        if name in whole:
            out[name] += whole_seconds(event, cuda)
            continue
        if name is not None:
            out[name] += self_seconds(event, cuda)
        stack.extend(event.cpu_children)
    return dict(out)


def traced_names(trace: RankTrace) -> frozenset[str]:
    """The op names of ``trace``'s compute events."""
    compute = trace.events["name"][trace.events["kind"] == COMPUTE]
    return frozenset(trace.names[i] for i in set(compute.tolist()))


# On one H200 (torch 2.11, cuDNN 9.19) torch.profiler gave cuDNN's attention op no device time: its
# kernels ran, tied to no aten op (results/h200/2026-12-04_149a5a5, calibrate_parts).
UNATTRIBUTED_ATTENTION = "_scaled_dot_product_cudnn_attention"
ATTENTION_KERNEL_WORDS = ("sdpa", "fmha", "flash", "attn", "attention")


def attention_kernels_unattributed(averages, by_op: dict[str, float]) -> float:
    """Device seconds of the GPU kernels named like attention beyond what the attention ops own."""
    kernels = sum(
        e.device_time_total * 1e-6
        for e in averages
        if not e.key.startswith("aten::") and e.device_type == DeviceType.CUDA
        and any(w in e.key.lower() for w in ATTENTION_KERNEL_WORDS)
    )  # fmt: skip
    owned = sum(seconds for name, seconds in by_op.items() if op_class(name) == ATTENTION)
    return max(kernels - owned, 0.0)


def synced(step: Callable[[], object]) -> None:
    """``step()``, waiting for the GPU's work where there is one."""
    step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def wall_seconds(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    synced(step)
    return time.perf_counter() - start


def clocked(step: Callable[[], object]) -> dict[str, dict[str, float]]:
    """Wall and on-core seconds of every aten op of one ``step()``, by name (tspbench.calibrate.opclock)."""
    with OpClock() as clock:
        step()
    return {"wall": dict(clock.wall_s), "cpu": dict(clock.cpu_s)}


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


def kind_seconds(seconds: dict[str, float]) -> dict[str, float]:
    """A profiled step's aten self time by the replay's cost classes. Every op counts, also those
    the trace never sees: an op the recorder sees whole (FSDP2's copy-in, a backward of a
    slice) is timed by the profiler in the ops it calls."""
    out: dict[str, float] = defaultdict(float)
    for name, value in seconds.items():
        kind = op_class(name)
        if kind in (GEMM, ATTENTION, ELEMENTWISE) and name not in NOT_COMPUTE:
            out[CLASS_NAMES[kind]] += value
    return dict(out)


# aten ops the profiler shows that are no compute of the step's: collectives' own bookkeeping
NOT_COMPUTE = frozenset(("record_stream", "_local_scalar_dense", "item", "is_nonzero"))


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


def host_total(wall_s: float, trace: RankTrace, seconds: dict[str, float]) -> float:
    """Seconds the step spends outside the traced ops' aten kernels."""
    names = {trace.names[i] for i in set(trace.events["name"].tolist())}
    return max(wall_s - sum(seconds.get(n, 0.0) for n in names), 0.0)


def step_costs(step: Callable[[], object], repeats: int) -> dict[str, object]:
    """Everything above but the host's time per op (host_seconds_per_op) for ``step`` (after the
    caller's warm-up): medians over ``repeats``."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    trace = traced(step, rank)
    walls, profiles = [], []
    for _ in range(repeats):
        walls.append(wall_seconds(step))
        profiles.append(profiled(step, traced_names(trace)))
    seconds = _medians(profiles)
    ops = totals(trace, seconds)
    overhead, bandwidth = fit_elementwise(ops)
    elementwise = {n: t for n, t in ops.items() if op_class(n) == ELEMENTWISE and t.seconds > 0}
    by_op = {
        name: t.nbytes / (t.seconds - overhead * t.calls) / 1e9
        for name, t in elementwise.items()
        if t.nbytes >= MIN_BYTES_PER_CALL * t.calls > 0 and t.seconds > 2 * overhead * t.calls
    }
    busy = sum(t.seconds - overhead * t.calls for t in elementwise.values())
    by_op["*"] = sum(t.nbytes for t in elementwise.values()) / busy / 1e9  # every other op
    return {
        "by_op": by_op,
        "op_overhead_us": overhead * 1e6,
        "elementwise_bandwidth_gbs": bandwidth / 1e9,
        "gemm_tflops": gemm_rate(ops, overhead) / 1e12,
        "kinds": {**kind_seconds(seconds), "host": host_total(statistics.median(walls), trace, seconds)},
    }


def kind_shares(single: dict[str, float], together: list[dict[str, float]]) -> dict[str, float]:
    """Each kind's share of the device when ranks run at once: its seconds on one rank alone over
    its mean seconds on a rank among them (the same step on each)."""
    mean = {k: sum(r.get(k, 0.0) for r in together) / len(together) for k in single}
    return {k: round(single[k] / mean[k], 4) for k in single if single[k] > 0 and mean[k] > 0}


def _warm_run(model: ModelConfig, tokens: int, device: str, dtype: str) -> RankRun:
    run = RankRun(Layout("dp"), Workload(model, 1, tokens, "train", "none", dtype, device))
    run.step()
    run.step()
    return run


def host_seconds_per_op(
    model: ModelConfig, tokens: int, repeats: int, device: str = "cpu", dtype: str = "float32"
) -> float:
    """The host's time per traced op (Python, autograd, dispatch): each step's wall time less its
    traced ops' self time, per op, median over ``repeats`` steps. Measured at few tokens, where the
    kernels are a small part of the step: at the calibration's length the residual is a small
    difference of two large, noisy times (0 to 89 us per op over seven runs of the small preset
    at 2,048 tokens on a 2-core host), while at 128 tokens four runs gave 5.5-8.1 us. On a GPU
    the step at few tokens is bound by its host: the residual is the time the device waits for
    the host's launches."""
    run = _warm_run(model, tokens, device, dtype)
    trace = traced(run.step)
    residuals = []
    for _ in range(repeats):
        wall = wall_seconds(run.step)
        residuals.append(host_total(wall, trace, profiled(run.step, traced_names(trace))))
    return statistics.median(residuals) / max(int((trace.events["kind"] == COMPUTE).sum()), 1)


def timeline_costs_rank(
    model: ModelConfig, tokens: int, repeats: int, device: str = "cpu", dtype: str = "float32"
) -> dict[str, object]:
    """On a launched world of one rank: the timeline's per-op terms of a training step of
    ``model`` at ``tokens`` tokens (after two warm-up steps), as profile fields; the host's time
    per op at HOST_TOKENS (host_seconds_per_op)."""
    costs = step_costs(_warm_run(model, tokens, device, dtype).step, repeats)
    host = host_seconds_per_op(model, min(tokens, HOST_TOKENS), max(repeats, HOST_REPEATS), device, dtype)
    return {
        "kinds": costs["kinds"],
        "op_overhead_us": round(float(costs["op_overhead_us"]), 3),
        "host_overhead_us": round(host * 1e6, 2),
        "step_gemm_tflops": round(float(costs["gemm_tflops"]), 6),
        "elementwise_by_op": {name: round(float(gbs), 3) for name, gbs in sorted(costs["by_op"].items())},
    }


def profiled_rank(layout: Layout, workload: Workload, repeats: int, whole: bool = False) -> dict[str, object]:
    """On every rank of a launched world: a traced step, then ``repeats`` times (after two
    warm-up steps) a profiled step, a clocked one (each op's wall and on-core time,
    tspbench.calibrate.opclock) and an unprofiled one (its wall time and where it went,
    tspbench.measure.schedstat; None off Linux). The medians: seconds by op name (self time, or
    with ``whole`` each traced op timed whole, as calibrate times it), clocked seconds by op
    name, the unprofiled step."""
    run = RankRun(layout, workload)
    run.step()
    run.step()
    trace = traced(run.step, dist.get_rank() if dist.is_initialized() else 0)
    names = traced_names(trace) if whole else ()
    profiles, clocks, walls, spent = [], [], [], []
    for _ in range(repeats):
        profiles.append(profiled(run.step, names))
        clocks.append(clocked(run.step))
        start = time.perf_counter()
        with schedstat.Spent() as where:
            synced(run.step)
        walls.append(time.perf_counter() - start)
        spent.append(where.seconds)
    return {
        "trace": trace,
        "seconds": _medians(profiles),
        "clocked": {which: _medians([c[which] for c in clocks]) for which in ("wall", "cpu")},
        "wall_s": statistics.median(walls),
        "schedule": schedstat.median(spent),
    }


def _medians(by_name: list[dict[str, float]]) -> dict[str, float]:
    """Per name, the median over the dicts (0 where a dict lacks it)."""
    names = set().union(*by_name)
    return {n: statistics.median(d.get(n, 0.0) for d in by_name) for n in names}


def profiled_kinds(layout: Layout, workload: Workload, repeats: int) -> dict[str, float]:
    """On every rank: a profiled step's self seconds by kind (the ranks' share of the host)."""
    r = profiled_rank(layout, workload, repeats)
    return {**kind_seconds(r["seconds"]), "host": host_total(r["wall_s"], r["trace"], r["seconds"])}
