"""``tspbench bench``: one measured point, as one flat record (the schema sweeps store).

Per point: ``warmup`` untimed steps (the first counts FLOPs with torch's FlopCounterMode; with a
simulated capacity a tracked step comes first, so an over-capacity point fails at once); then
MEMORY_STEPS steady-state steps (in training the AdamW state exists by then) with collectives
counted and peak memory taken (the CPU tracker, or the allocator on CUDA); then ``repeats``
rounds of ``steps`` timed steps, each step timed on the slowest rank (barrier before, max over
ranks after). The tracker slows a CPU step ~1.2-1.6x, which is why timing and memory use
different steps.

Peak memory: per tracked step the maximum over ranks; the record's ``peak_memory_bytes`` (and
its breakdown) is the median tracked step's, with the spread beside it
(``peak_memory_min_bytes``, ``peak_memory_max_bytes``, ``peak_memory_step_bytes``): the same
step can peak higher when gloo's thread frees a buffer late. ``predicted_memory_error`` compares
the model with that median step.

Each record carries the analytic model's prediction beside the measurement (peak memory, comm
bytes, hardware FLOPs, the step time), with the signed errors, the traced step's replay (the
timeline) and the MFU: all priced on the point's one hardware profile, chosen by
its caller (tspbench.analytic.profile_choice: the one named, else the device's) and named in the
record (``hardware_choice``: which and why).

A failure never escapes as an exception: out-of-memory on any rank gives status ``oom``, a rank
that raises ``failed`` with its traceback, a world that outlives its timeout ``timeout``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
import torch.distributed as dist

from tspbench.analytic.cost import cost_fields
from tspbench.analytic.hardware import Hardware
from tspbench.analytic.mfu import mfu_fields
from tspbench.analytic.predict import predict
from tspbench.analytic.profile_choice import HardwareChoice
from tspbench.analytic.replayed import timeline_fields
from tspbench.core.errors import WorkloadError
from tspbench.core.records import attention_kernel_field, busiest_comm, comm_fields, point_record
from tspbench.core.spec import Layout, Workload
from tspbench.core.units import excerpt, percentile
from tspbench.costs.flops import model_flops_per_step
from tspbench.dist.launch import LaunchTimeout, RankError, launch
from tspbench.measure import schedstat
from tspbench.measure.decode_bench import decode_prediction_fields, decode_record, rank_bench_decode
from tspbench.measure.env import environment
from tspbench.measure.runner import RankRun
from tspbench.strategy import check_layout

MEMORY_STEPS = 3  # tracked steady-state steps per point: the spread of their peaks is recorded


def first_tracked_step(warmup: int, capacity_bytes: int | None) -> int:
    """The number (from 1) of the first tracked step: after the capacity check, the FLOP-counting
    step and the rest of the warm-up, so always a steady-state step (2 or later)."""
    return 1 + (capacity_bytes is not None) + max(warmup, 1)


def rank_bench(
    layout: Layout, workload: Workload, steps: int, warmup: int, repeats: int, capacity_bytes: int | None
) -> dict:
    run = RankRun(layout, workload)
    if capacity_bytes is not None:  # a point over the capacity fails in its first step, not after three
        run.measured_step(capacity_bytes)
    flops = run.counted_flops()  # counts as a warm-up step
    for _ in range(warmup - 1):
        run.step()
    # the first tracked step is also traced (tspbench.measure.trace): its replay is the timeline.
    # Each step's output is released before the next starts (an inference step's is its logits).
    measured = [run.measured_step(capacity_bytes, trace=i == 0).without_output() for i in range(MEMORY_STEPS)]
    clocks: list[dict[str, float] | None] = []
    times = [t for _ in range(repeats) for t in run.timed_steps(steps, clocks)]
    rank = dist.get_rank() if dist.is_initialized() else 0
    return {
        "rank": rank,
        "times": times,
        "clocks": schedstat.median(clocks) if run.device.type == "cpu" else None,
        "loss": measured[0].loss,
        "comm": measured[0].comm,
        "memory": [m.memory for m in measured],
        "state": measured[-1].state,
        "flops": flops,
        "first_tracked_step": first_tracked_step(warmup, capacity_bytes),
        "trace": measured[0].trace,
        "attention_kernels": measured[0].attention_kernels,
    }


def measurement_record(layout: Layout, workload: Workload, ranks: list[dict]) -> dict[str, object]:
    times = ranks[0]["times"]
    median = statistics.median(times)
    seqs = layout.data_degree * workload.batch
    tokens = seqs * workload.seq_len
    flops = model_flops_per_step(workload.model, seqs, workload.seq_len, workload.mode)
    per_step = [max(r["memory"][i].peak_bytes for r in ranks) for i in range(len(ranks[0]["memory"]))]
    step = sorted(range(len(per_step)), key=per_step.__getitem__)[(len(per_step) - 1) // 2]  # the median
    peaks = [r["memory"][step].peak_bytes for r in ranks]
    top = max(ranks, key=lambda r: r["memory"][step].peak_bytes)
    return {
        "step_time_s": median,
        "step_time_p10_s": percentile(times, 0.1),
        "step_time_p90_s": percentile(times, 0.9),
        "step_times_s": times,
        "tokens_per_step": tokens,
        "tokens_per_s_per_gpu": tokens / median / layout.world_size,
        "model_flops_per_step": flops,
        "tflops_per_gpu": flops / median / layout.world_size / 1e12,
        "loss": ranks[0]["loss"],
        "attention_kernel": attention_kernel_field(ranks),
        **top["memory"][step].to_record(),
        "peak_memory_rank": top["rank"],
        "peak_memory_bytes_per_rank": peaks,
        "peak_memory_min_bytes": min(per_step),
        "peak_memory_max_bytes": max(per_step),
        "peak_memory_step_bytes": per_step,
        "peak_memory_first_tracked_step": ranks[0]["first_tracked_step"],
        **{f"state_{k}_bytes": max(r["state"][k] for r in ranks) for k in ranks[0]["state"]},
        "hardware_flops_per_step_per_gpu": max(r["flops"] or 0 for r in ranks),
        **comm_fields(busiest_comm(ranks)),
        **clock_fields([r.get("clocks") for r in ranks]),
    }


def clock_fields(clocks: list[dict[str, float] | None]) -> dict[str, float]:
    """Where a timed step went on a CPU host, mean over ranks of each rank's median
    (tspbench.measure.schedstat): busy (on a core or waiting for one), of which waiting for a
    core, blocked (asleep on a collective or a peer), and what the ranks' other (gloo's) threads
    ran. Empty where any rank lacks the kernel's clocks (not Linux, or a GPU)."""
    mean = schedstat.mean_over_ranks(clocks)
    if mean is None:
        return {}
    return {
        "cpu_busy_s": mean["busy_s"],
        "cpu_runqueue_s": mean["runqueue_s"],
        "cpu_blocked_s": mean["blocked_s"],
        "cpu_comm_threads_s": mean["comm_threads_cpu_s"],
    }


def predictions(layout: Layout, workload: Workload, record: dict, hw: Hardware) -> dict:
    """The model's fields for a record of any mode on the profile ``hw`` (decode has a model of
    its own)."""
    fields = decode_prediction_fields if workload.mode == "decode" else prediction_fields
    return fields(layout, workload, record, hw)


def prediction_fields(layout: Layout, workload: Workload, record: dict, hw: Hardware) -> dict:
    """The analytic model's numbers beside the measured ones, with the signed relative errors."""
    p = predict(layout, workload, hw)
    out: dict[str, object] = {
        "predicted_peak_memory_bytes": p.memory.peak_bytes,
        "predicted_peak_memory_moment": p.memory.moment,
        "predicted_peak_memory_phase": p.memory.phase,
        "predicted_comm_bytes_per_step": p.comm_bytes_per_step,
        "predicted_hardware_flops_per_gpu": p.flops.total,
        "predicted_hardware": p.hardware.name,
        **p.time.to_dict("predicted_"),
        **p.extra,  # crossing_axes, internode_comm_s, internode_share (tspbench.analytic.internode)
    }
    if record.get("status") == "completed":
        out["predicted_memory_error"] = p.memory.peak_bytes / record["peak_memory_bytes"] - 1
        out["predicted_flops_error"] = p.flops.total / max(record["hardware_flops_per_step_per_gpu"], 1) - 1
        if record.get("step_time_s"):  # a fake world has none
            out["predicted_step_time_error"] = p.step_time_s / record["step_time_s"] - 1
    return out


def completed_record(
    layout: Layout,
    workload: Workload,
    ranks: list[dict],
    choice: HardwareChoice,
    trace_path: Path | None = None,
) -> dict[str, object]:
    """Status, measurements, the model's predictions, the traced step's replay (the timeline)
    and the MFU of a point whose ranks all returned, all on the point's profile ``choice``. The
    local launcher and Slurm tasks both build their records here."""
    record: dict[str, object] = {
        "status": "completed",
        "error": None,
        **measurement_record(layout, workload, ranks),
        "hardware_choice": choice.reason,
    }
    record.update(prediction_fields(layout, workload, record, choice.hardware))
    record.update(mfu_fields(layout, record, choice))
    traces = [r["trace"] for r in ranks if r.get("trace") is not None]
    record.update(timeline_fields(layout, workload, traces, choice, trace_path))
    if record.get("timeline_step_time_s"):
        record["timeline_step_time_error"] = record["timeline_step_time_s"] / record["step_time_s"] - 1
    return record


def check_cache_fits(cache_bytes: int, capacity_bytes: int | None) -> None:
    """A KV cache larger than the device (``--capacity``, or the GPU here): refused before any rank
    starts. A cache that fits but leaves too little for the run is an ``oom`` record."""
    limit, what = capacity_bytes, "--capacity"
    if limit is None and torch.cuda.is_available():
        limit, what = torch.cuda.get_device_properties(0).total_memory, "the GPU's memory"
    if limit is not None and cache_bytes > limit:
        raise WorkloadError(
            f"the KV cache needs {cache_bytes:,} bytes per rank, more than {what} ({limit:,} bytes)"
        )


def decode_graphs_setting(workload: Workload, asked: bool | None) -> bool:
    """Whether a point's decode steps replay CUDA graphs: asked for, else on CUDA; refused where
    there is nothing to capture (not decode, or not CUDA)."""
    if asked is None:
        return workload.mode == "decode" and workload.device == "cuda"
    if asked and (workload.mode != "decode" or workload.device != "cuda"):
        raise WorkloadError(
            "CUDA graphs replay decode steps on CUDA only "
            f"(mode {workload.mode!r}, device {workload.device!r})"
        )
    return asked


def bench(
    layout: Layout,
    workload: Workload,
    hardware: HardwareChoice,
    steps: int = 5,
    warmup: int = 2,
    repeats: int = 1,
    capacity_bytes: int | None = None,
    timeout: float = 600.0,
    trace_path: Path | None = None,
    decode_graphs: bool | None = None,
) -> dict[str, object]:
    """Measure one point; returns the flat record (``status`` says how it ended). ``hardware``:
    the point's profile, chosen by its caller where the command, sweep or check starts
    (tspbench.analytic.profile_choice), so a record is priced on the profile its caller names.
    ``trace_path``: where the traced step goes (.npz, or a Chrome trace .json / .json.gz; see
    tspbench.analytic.replayed). ``decode_graphs``: decode steps replayed as CUDA graphs
    (default: on CUDA; never elsewhere)."""
    cls = check_layout(layout, workload)
    decode = workload.mode == "decode"
    graphs = decode_graphs_setting(workload, decode_graphs)
    if decode:
        check_cache_fits(cls.for_analysis(layout, workload).cache_bytes(), capacity_bytes)
    record: dict[str, object] = {
        **point_record(layout, workload),
        "steps": steps,
        "warmup": warmup,
        "repeats": repeats,
        "capacity_bytes": capacity_bytes,
    }
    if decode:
        record["decode_cuda_graphs"] = graphs
    try:
        settings = (steps, warmup, repeats, capacity_bytes, *((graphs,) if decode else ()))
        ranks = launch(
            rank_bench_decode if decode else rank_bench,
            layout.world_size,
            layout,
            workload,
            *settings,
            device=workload.device,
            timeout=timeout,
        )
        record.update(finished_record(layout, workload, ranks, hardware, trace_path))
    except RankError as exc:
        status = "oom" if exc.is_oom else "failed"
        record.update(status=status, error=excerpt(str(exc)), failed_rank=exc.rank)
    except LaunchTimeout as exc:
        record.update(status="timeout", error=str(exc))
    if record["status"] != "completed":  # the model's numbers still stand beside the failure
        record.update(
            predictions(layout, workload, record, hardware.hardware), hardware_choice=hardware.reason
        )
    record.update({f"env_{k}": v for k, v in environment(workload.device).items()})
    record.update(cost_fields(record, hardware.hardware))
    return record


def finished_record(
    layout: Layout, workload: Workload, ranks: list[dict], choice: HardwareChoice, trace_path: Path | None
) -> dict[str, object]:
    """The record of a point whose ranks all returned: a decode run's (its own model, no
    timeline), else ``completed_record``'s; all on the point's profile ``choice``."""
    if workload.mode != "decode":
        return completed_record(layout, workload, ranks, choice, trace_path)
    record: dict[str, object] = {
        "status": "completed",
        "error": None,
        **decode_record(layout, workload, ranks),
    }
    record.update(decode_prediction_fields(layout, workload, record, choice.hardware))
    record["hardware_choice"] = choice.reason
    return record
