"""The fake world: the real step of a rank of any world, executed with no memory and no GPU.

``fake_bench(layout, workload, hardware)`` runs the ranks of one model-parallel group (ranks 0 .. R-1 of
the world: every data-parallel replica does the same) with the same ``RankRun`` step as a
real run, under FakeTensorMode (torch._subclasses.fake_tensor: real shapes, dtypes and
devices, no values, no storage) on a fake process group of the full world size
(tspbench.dist.fake_world). The device is the one the layout targets: ``cuda`` simulated
(bf16, flash kernels, every is_cuda branch; on a CPU-only torch through tspbench.measure.
fake_cuda) or ``cpu``. Each rank runs in a worker process, several ranks one after another.

What it measures is exact, because it is what the program does, op by op:

    peak memory   the dispatch tracker (tspbench.measure.tracker) over fake storages: every
                  tensor the step creates, with its category, to the byte
    communication every collective the step issues, by op, phase and group (comm.counting)
    FLOPs         hardware FLOPs of the step, by torch's FlopCounterMode

and it cannot measure time (no kernel runs), allocator effects (caching-allocator
fragmentation and reserved memory, a kernel's private workspace) or the communication
library's own buffers (NCCL/RCCL). On ``--device cpu`` it equals a real gloo run
(tests/measure/test_fake.py). A rank that raises - an op without a fake kernel, a data-dependent
shape - becomes a ``failed`` record that names the op.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    UnsupportedOperatorException,
)

from tspbench.analytic.cost import cost_fields
from tspbench.analytic.hardware import Hardware
from tspbench.analytic.profile_choice import HardwareChoice
from tspbench.analytic.replayed import timeline_fields
from tspbench.core.records import attention_kernel_field, busiest_comm, comm_fields, point_record
from tspbench.core.spec import Layout, Workload
from tspbench.core.units import excerpt
from tspbench.costs.flops import model_flops_per_step
from tspbench.dist.fake_world import FakeWorld, run_fake_ranks
from tspbench.dist.launch import LaunchTimeout, RankError
from tspbench.measure import fake_cuda
from tspbench.measure.bench import predictions
from tspbench.measure.decode_bench import decode_work_fields
from tspbench.measure.env import environment
from tspbench.measure.flop_counter import FlopTally
from tspbench.measure.runner import RankRun
from tspbench.measure.simulated_gpu import simulated_gpu
from tspbench.measure.tracker import CATEGORIES
from tspbench.model.attention import simulated_cuda_kernel
from tspbench.strategy import check_fake_world

NO_FAKE_KERNEL = {
    UnsupportedOperatorException: "has no fake (meta) kernel",
    DynamicOutputShapeException: "has an output shape that depends on the values",
    DataDependentOutputException: "needs the values of a tensor",
}


class FakeOpError(RuntimeError):
    """An op the fake world cannot execute; ``str`` starts with the op's name."""


def fake_device(workload: Workload) -> torch.device:
    return torch.device("cuda", 0) if workload.device == "cuda" else torch.device("cpu")


def fake_rank(
    layout: Layout,
    workload: Workload,
    capacity_bytes: int | None = None,
    trace: bool = False,
    attention_kernel: str = "flash",
) -> dict:
    """One rank's measured step (comm counted, memory tracked, FLOPs tallied; with ``trace`` its
    ops and collectives recorded) under fake tensors, inside a fake process group. A real run
    measures after warm-up steps, when the optimizer state exists; here an optimizer step on
    zero gradients creates it (no values to warm up). A simulated GPU calls ``attention_kernel``
    (its profile's, tspbench.model.attention)."""
    try:
        with FakeTensorMode(), simulated_gpu(workload.device), simulated_cuda_kernel(attention_kernel):
            run = RankRun(layout, workload, fake_device(workload))
            create_optimizer_state(run)
            if workload.mode == "decode":  # FLOPs of the prefill and the steps apart, in a run of their own
                flops: int | dict[str, int] = run.decode_run(count_flops=True).flops
                measured = run.measured_step(capacity_bytes, trace)
            else:
                with FlopTally() as tally:
                    measured = run.measured_step(capacity_bytes, trace)
                flops = tally.total
    except tuple(NO_FAKE_KERNEL) as exc:
        raise FakeOpError(f"{exc.func} {NO_FAKE_KERNEL[type(exc)]}: it cannot run on fake tensors") from exc
    out = {
        "rank": dist.get_rank(),
        "comm": measured.comm,
        "memory": dataclasses.replace(measured.memory, method="fake"),
        "state": measured.state,
        "flops": flops,
        "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
        "trace": measured.trace,
        "attention_kernels": measured.attention_kernels,
    }
    if workload.mode == "decode":
        out["cache_bytes"] = measured.output.cache_bytes
    return out


def simulated_kernel(hw: Hardware) -> str:
    """The attention kernel of the GPU a profile describes (flash where it names none)."""
    return hw.attention_kernel or "flash"


def create_optimizer_state(run: RankRun) -> None:
    """The state a warm-up step leaves behind (AdamW's moments), without the step."""
    if run.optimizer is None:
        return
    for p in run.model.parameters():
        p.grad = torch.zeros_like(p)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)


def model_parallel_ranks(layout: Layout) -> list[int]:
    """The ranks of the first model-parallel group: dp is the outermost axis, so 0 .. R-1."""
    return list(range(layout.replica_size))


def default_workers(ranks: list[int]) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(len(ranks), cores))


def fake_record(layout: Layout, workload: Workload, ranks: list[dict]) -> dict[str, object]:
    """Memory, state, FLOPs and comm of the executed ranks (max over them, as bench takes), and
    each rank's peak by category."""
    top = max(ranks, key=lambda r: r["memory"].peak_bytes)
    work = decode_fields if workload.mode == "decode" else step_fields
    return {
        **work(layout, workload, ranks),
        **top["memory"].to_record(),
        "attention_kernel": attention_kernel_field(ranks),
        "peak_memory_rank": top["rank"],
        "peak_memory_bytes_per_rank": [r["memory"].peak_bytes for r in ranks],
        "peak_memory_by_rank": [
            {"rank": r["rank"], **{c: r["memory"].by_category.get(c, 0) for c in CATEGORIES}} for r in ranks
        ],
        **{f"state_{k}_bytes": max(r["state"][k] for r in ranks) for k in ranks[0]["state"]},
        "fake_peak_rss_bytes": max(r["rss_bytes"] for r in ranks),  # of a worker process, real memory
    }


def step_fields(layout: Layout, workload: Workload, ranks: list[dict]) -> dict[str, object]:
    """A training or prefill step's tokens, FLOPs and collectives (busiest rank)."""
    return {
        "tokens_per_step": layout.dp * workload.batch * workload.seq_len,
        "model_flops_per_step": model_flops_per_step(
            workload.model, layout.dp * workload.batch, workload.seq_len, workload.mode
        ),
        "hardware_flops_per_step_per_gpu": max(r["flops"] for r in ranks),
        **comm_fields(busiest_comm(ranks)),
    }


def decode_fields(layout: Layout, workload: Workload, ranks: list[dict]) -> dict[str, object]:
    """A decode run's cache, collectives and FLOPs as ``bench --mode decode`` records them; no
    TTFT, TPOT or energy (no kernel runs)."""
    return {
        "tokens_per_step": layout.data_degree * workload.batch * (workload.decode_tokens + 1),
        **decode_work_fields(workload, ranks),
        "energy_per_token_j": None,
        "energy_unavailable": "fake world: no kernel runs",
    }


def fake_bench(
    layout: Layout,
    workload: Workload,
    hardware: HardwareChoice,
    capacity_bytes: int | None = None,
    timeout: float = 1800.0,  # seconds per rank
    ranks: list[int] | None = None,
    world: FakeWorld | None = None,
    trace_path: Path | None = None,
    trace: bool = True,
) -> dict[str, object]:
    """Execute one point in the fake world; the flat record (``source: fake``): no measured time,
    the step's replay (tspbench.analytic.timeline) as the ``timeline_`` fields and the model's
    predictions, both on ``hardware``, the point's profile, chosen by its caller where the
    command, sweep or check starts (tspbench.analytic.profile_choice; its rule for a fake world:
    the paper's MI300X for a simulated GPU, ``cpu`` for a CPU world); its traces written to
    ``trace_path`` if given (.npz, or a Chrome trace); ``trace=False`` leaves the step untraced
    (no timeline; what tracing costs, benchmarks/). ``world`` is a pool of worker processes to
    reuse (a sweep's); by default the point gets one of its own, a worker per core."""
    check_fake_world(layout, workload)
    ranks = list(ranks) if ranks is not None else model_parallel_ranks(layout)
    record: dict[str, object] = {
        **point_record(layout, workload, "fake"),
        "capacity_bytes": capacity_bytes,
        "fake_ranks": ranks,
    }
    env = fake_cuda.preload_env(workload.device)  # before anything runs: no compiler is a usage error
    start = time.perf_counter()
    try:
        traced = trace and workload.mode != "decode"
        args = (fake_rank, ranks, layout.world_size, layout, workload, capacity_bytes, traced)
        args += (simulated_kernel(hardware.hardware),)
        if world is not None:
            results = world.run(*args, timeout=timeout)
        else:
            results = run_fake_ranks(*args, workers=default_workers(ranks), env=env, timeout=timeout)
        record.update(status="completed", error=None, **fake_record(layout, workload, results))
        traces = [r["trace"] for r in results if r["trace"] is not None]
        record.update(timeline_fields(layout, workload, traces, hardware, trace_path))
    except RankError as exc:
        record.update(status="oom" if exc.is_oom else "failed", error=excerpt(str(exc)), failed_rank=exc.rank)
        if exc.exc_type == FakeOpError.__name__:
            record["failed_op"] = exc.message.split()[0]
    except LaunchTimeout as exc:
        record.update(status="timeout", error=str(exc))
    record["fake_seconds"] = time.perf_counter() - start
    record.update(predictions(layout, workload, record, hardware.hardware), hardware_choice=hardware.reason)
    record.update({f"env_{k}": v for k, v in fake_environment(workload).items()})
    record.update(cost_fields(record, hardware.hardware))
    return record


def fake_environment(workload: Workload) -> dict[str, object]:
    """The host's environment, as the fake world's: the simulated device on this host's CPU,
    the fake backend (no kernel runs on any device)."""
    host = environment("cpu")
    host.update(
        device=workload.device, backend="fake", device_name=f"fake {workload.device} on {host['device_name']}"
    )
    return host
