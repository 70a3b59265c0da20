"""``tspbench bench --mode decode``: one decode point measured, as one flat record.

Per point (every rank): a capacity check run first when a capacity is simulated; a warm-up run
with its FLOPs counted (FlopCounterMode, prefill and steps apart); ``warmup - 1`` more warm-up
runs; one tracked run (collectives counted, peak memory by category with the KV cache as
``kv_cache``); then ``repeats x steps`` timed runs. A run is a whole decode: the prefill of
``seq_len`` context tokens and ``decode_tokens`` greedy steps, each part timed after a barrier
and taken on the slowest rank. On CUDA the timed runs replay each step as a captured CUDA graph
(one untimed run captures them) unless eager steps are asked for; the tracked run is eager.

Record columns beside point_record's:
    ttft_s, ttft_times_s            the prefill (time to first token), median over timed runs
    ttft_p99_s                      its 99th percentile over the timed runs (one prefill a run)
    tpot_s (= tpot_p50_s), tpot_p90_s, tpot_p99_s, tpot_times_s
                                    time per output token over every step of every timed run
    decode_tokens_per_s             B x data degree / tpot_s (every replica's sequences)
    decode_cuda_graphs              whether the timed steps replayed captured CUDA graphs
                                    (tspbench.measure.decode_graphs; on CUDA by default)
    decode_tokens_sha1              a digest of the last timed run's generated tokens (every
                                    rank): graphed and eager runs of a point must agree
    attention_kernel                the attention kernels the tracked run called
    peak_memory_*                   the tracked run's peak, with peak_memory_kv_cache_bytes
    kv_cache_bytes                  the cache one rank allocates (max over ranks)
    comm_*                          the tracked run's collectives (comm_fields: prefill is phase
                                    forward, steps phase decode)
    decode_comm_bytes_per_step, decode_comm_<op>_bytes_per_step
                                    the decode phase's bus bytes / decode_tokens (busiest rank)
    hardware_flops_prefill_per_gpu, hardware_flops_per_decode_step_per_gpu   (max over ranks)
    energy_per_token_j              joules of the timed runs' steps / their generated tokens,
                                    summed over the ranks that read a counter
                                    (tspbench.measure.energy), or null with energy_unavailable
"""

from __future__ import annotations

import hashlib
import statistics

import torch
import torch.distributed as dist

from tspbench.analytic.decode import predict_decode
from tspbench.analytic.hardware import Hardware
from tspbench.core.records import attention_kernel_field, busiest_comm, comm_fields
from tspbench.core.spec import Layout, Workload
from tspbench.core.units import percentile
from tspbench.measure.decode_graphs import DecodeGraphs
from tspbench.measure.energy import open_meter
from tspbench.measure.runner import RankRun


def rank_bench_decode(
    layout: Layout,
    workload: Workload,
    steps: int,
    warmup: int,
    repeats: int,
    capacity_bytes: int | None,
    graphed: bool = False,
) -> dict:
    run = RankRun(layout, workload)
    if capacity_bytes is not None:  # over capacity: fail in the first run
        run.measured_step(capacity_bytes)
    flops = run.decode_run(count_flops=True).flops
    for _ in range(warmup - 1):
        run.decode_run()
    measured = run.measured_step(capacity_bytes)  # eager: collectives counted, memory tracked
    graphs = DecodeGraphs(run.strategy, run.model) if graphed else None
    if graphs is not None:
        run.decode_run(graphs=graphs)  # captures every step's graph, untimed
    rank = dist.get_rank() if dist.is_initialized() else 0
    meter = open_meter(run.device, rank)
    timed = [
        run.decode_run(timed=True, meter=meter if meter.contributes else None, graphs=graphs)
        for _ in range(steps * repeats)
    ]
    return {
        "rank": rank,
        "times": [t.times_s for t in timed],  # per run: prefill, then each step
        "energy": [t.energy_j for t in timed] if meter.contributes else None,
        "energy_source": meter.source,
        "energy_unavailable": meter.unavailable,
        "comm": measured.comm,
        "memory": measured.memory,
        "cache_bytes": measured.output.cache_bytes,
        "flops": flops,
        "attention_kernels": measured.attention_kernels,
        "tokens": torch.cat([t.reshape(-1) for t in timed[-1].tokens]).cpu(),  # the last timed run's
    }


def decode_record(layout: Layout, workload: Workload, ranks: list[dict]) -> dict[str, object]:
    """The measured columns of a decode point (module doc) from every rank's results."""
    n, runs = workload.decode_tokens, len(ranks[0]["times"])
    slowest = [[max(r["times"][i][j] for r in ranks) for j in range(n + 1)] for i in range(runs)]
    ttft = [run[0] for run in slowest]
    tpot = [t for run in slowest for t in run[1:]]
    median = statistics.median(tpot)
    seqs = layout.data_degree * workload.batch
    top = max(ranks, key=lambda r: r["memory"].peak_bytes)
    return {
        "ttft_s": statistics.median(ttft),
        "ttft_p99_s": percentile(ttft, 0.99),  # over the timed runs: one prefill each
        "ttft_times_s": ttft,
        "tpot_s": median,
        "tpot_p50_s": median,
        "tpot_p90_s": percentile(tpot, 0.9),
        "tpot_p99_s": percentile(tpot, 0.99),
        "tpot_times_s": tpot,
        "step_time_s": statistics.median(sum(run) for run in slowest),  # a whole decode run
        "tokens_per_step": seqs * (n + 1),
        "decode_tokens_per_s": seqs / median,
        "attention_kernel": attention_kernel_field(ranks),
        "decode_tokens_sha1": tokens_digest([r["tokens"] for r in ranks]),
        **top["memory"].to_record(),
        "peak_memory_rank": top["rank"],
        "peak_memory_bytes_per_rank": [r["memory"].peak_bytes for r in ranks],
        **decode_work_fields(workload, ranks),
        **energy_fields(ranks, seqs * n * runs),
    }


def tokens_digest(tokens: list[torch.Tensor]) -> str:
    """A digest of every rank's generated token ids (rank order): equal digests, equal tokens."""
    digest = hashlib.sha1()
    for t in tokens:
        digest.update(t.to(torch.int64).numpy().tobytes())
    return digest.hexdigest()


def decode_work_fields(workload: Workload, ranks: list[dict]) -> dict[str, object]:
    """What a decode point's ranks hold, move and compute, time aside (a real or a fake run):
    the cache, the collectives (in all and per decode step, busiest rank), the FLOPs of the
    prefill and of one step (max over ranks; ``flops`` by part: prefill, steps)."""
    n = workload.decode_tokens
    comm = busiest_comm(ranks)
    return {
        "kv_cache_bytes": max(r["cache_bytes"] for r in ranks),
        **comm_fields(comm),
        **decode_comm_fields(comm, n),
        "hardware_flops_prefill_per_gpu": max(r["flops"].get("prefill", 0) for r in ranks),
        "hardware_flops_per_decode_step_per_gpu": max(r["flops"].get("steps", 0) for r in ranks) / n,
    }


def decode_comm_fields(records: list, steps: int) -> dict[str, float]:
    """Bus bytes of one decode step (the decode phase / ``steps``), in total and by op."""
    out = {"decode_comm_bytes_per_step": 0.0}
    for r in records:
        if r.phase == "decode":
            out["decode_comm_bytes_per_step"] += r.bus_bytes / steps
            key = f"decode_comm_{r.op}_bytes_per_step"
            out[key] = out.get(key, 0.0) + r.bus_bytes / steps
    return out


def energy_fields(ranks: list[dict], tokens: int) -> dict[str, object]:
    """Energy per generated token of the timed steps, summed over the ranks that read a counter."""
    readers = [r for r in ranks if r["energy"] is not None]
    if not readers:
        return {
            "energy_per_token_j": None,
            "energy_source": None,
            "energy_unavailable": ranks[0]["energy_unavailable"],
        }
    steps = sum(e.get("steps", 0.0) for r in readers for e in r["energy"])
    prefill = sum(e.get("prefill", 0.0) for r in readers for e in r["energy"])
    return {
        "energy_per_token_j": steps / tokens,
        "energy_decode_j": steps,
        "energy_prefill_j": prefill,
        "energy_source": readers[0]["energy_source"],
        "energy_unavailable": None,
    }


def decode_prediction_fields(layout: Layout, workload: Workload, record: dict, hw: Hardware) -> dict:
    """The decode model's numbers (tspbench.analytic.decode) on the profile ``hw`` beside the
    measured ones, with the signed relative errors of TTFT, TPOT p50, the KV cache, the peak and
    the per-step comm."""
    w = workload
    p = predict_decode(layout, w.model, w.batch, w.seq_len, w.decode_tokens, w.dtype, hw)
    predicted = p.record()
    out: dict[str, object] = {"predicted_hardware": p.hardware.name}
    for column in PREDICTED_DECODE_COLUMNS:
        out[f"predicted_{column}"] = predicted[column]
        if record.get("status") == "completed" and record.get(column):
            out[f"predicted_{column}_error"] = predicted[column] / record[column] - 1
    return out


PREDICTED_DECODE_COLUMNS = (
    "ttft_s",
    "tpot_p50_s",
    "kv_cache_bytes",
    "peak_memory_bytes",
    "decode_comm_bytes_per_step",
)
