"""``tspbench calibrate``: measure what the time model uses, and write a hardware profile.

Measured on the rank configuration the points run with (a model preset, a sequence length and
a number of local ranks), every figure the median of ``repeats`` with its spread:

    gemm_tflops               the step's GEMM shapes (projections and MLP, forward and weight
                              gradients, whole and sharded widths), one rank alone
    attention_tflops          a query chunk against a key prefix 4x as long (the rectangles of
                              sequence-parallel attention), forward + backward, at the model's
                              head dim, and _by_size: at chunks of powers of two up to half of
                              ``max_seq_len``; attention_causal_tflops (and _by_size): square
                              causal calls of powers of two up to ``max_seq_len``
    hbm_bandwidth_gbs         element-wise ops on activation-sized tensors
    elementwise_passes        the element-wise ops of a single-device step of the model (one
                              rank at a rank's tokens; torch.profiler's self time of every op
                              that is not a GEMM or attention), as passes over a block's
                              activations (train, infer) and the parameters (AdamW) at that
                              bandwidth (profiled device time on a GPU, CPU time on a CPU)
    op_overhead_us, host_overhead_us, step_gemm_tflops, elementwise_by_op
                              the timeline's per-op terms, from the same kind of profiled step
                              (tspbench.calibrate.opcosts)
    launch_us, graph_kernel_us, graph_replay_us
                              on a GPU: a kernel launched eagerly, a kernel inside a replayed
                              CUDA graph, a graph's replay (tspbench.calibrate.launches)
    contention                each rank's share of its device when 1..ranks ranks run GEMMs at
                              once (CPU: ranks share the host's cores); attention_contention
                              the same of causal attention calls
    collectives               latency and bus bandwidth of every op a strategy uses, on every
                              group size, with every group of the world busy at once (gloo on
                              CPU, NCCL on GPUs), in worlds of 2 and ``ranks``: calls back to
                              back at 4 KiB to 16 MiB, a line fitted through them
    overlap_efficiency        how much of a ring transfer really runs under GEMMs: compute-only,
                              comm-only and overlapped times, interleaved in a seeded order

A measurement whose repeats differ by more than 20% is reported in ``warnings`` (a busy host).
A calibration takes minutes (``--repeats 9`` on 2 cores: about ten), so each of its steps is
reported to ``progress`` as it ends (``calibration_steps`` says how many there will be).
Where one host cannot measure a figure (the network between nodes) it is copied from the
intra-node one and marked so in ``provenance``.
"""

from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass, field
from functools import partial

import torch

from tspbench.analytic import prices
from tspbench.calibrate import probes
from tspbench.calibrate.probes import Rate
from tspbench.calibrate.step_figures import (
    NOISY_SPREAD,
    Recorder,
    step_figures,
)
from tspbench.core.progress import Progress
from tspbench.core.spec import ModelConfig
from tspbench.dist.launch import launch

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send_recv")
# Message sizes the collectives are timed at: from a norm's gradient to a 7B layer's K/V block.
COLLECTIVE_BYTES = (4 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)
COLLECTIVE_CALLS = 10  # a repeat's calls, back to back (a step issues them so)


@dataclass
class Calibration:
    """A profile (Hardware fields) with each figure's provenance, and warnings about noise."""

    profile: dict[str, object]
    warnings: list[str] = field(default_factory=list)


def gemm_shapes(model: ModelConfig, tokens: int, degrees: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(m, n, k) of the step's GEMMs: projections and MLP, forward and weight gradient, with the
    widths split over each degree (TP and TSP shard them; DP and SP do not)."""
    h, out = model.hidden, []
    for d in sorted(set(degrees)):
        for width in (h // d, model.ffn_hidden // d):
            out += [(tokens, width, h), (width, h, tokens)]  # x W^T and dW = dY^T x
    return out


def calibration_steps(cuda: bool, ranks: int) -> int:
    """How many steps ``calibrate`` reports: GEMMs, attention squares and rectangles and
    element-wise bandwidth; element-wise passes and per-op costs; kernel launches (GPU); with peers, the
    contention of GEMMs and of attention (CPU), the collectives, the waits on peers and the
    overlap."""
    return 6 + cuda + (ranks > 1) * (2 * (not cuda) + 3)


def calibrate(
    ranks: int = 4,
    model: ModelConfig | None = None,
    seq_len: int = 2048,
    repeats: int | None = None,
    quick: bool = False,
    max_seq_len: int | None = None,
    progress: Progress | None = None,
) -> Calibration:
    """Measure this device (and ``ranks`` local ranks of it) for ``model`` at ``seq_len``;
    attention at sizes up to ``max_seq_len`` (default ``seq_len``): the longest point to predict.
    ``repeats`` per figure: default 5, or 3 with ``quick``."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    model = model or default_model()
    ranks = min(ranks, torch.cuda.device_count()) if cuda else ranks
    repeats = repeats if repeats is not None else 3 if quick else 5
    rec = Recorder(progress=progress or Progress())
    rec.progress.start(calibration_steps(cuda, ranks), f"calibrate {model.name} at {seq_len} tokens")
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # as every rank runs
    try:
        rates = _device_rates(rec, model, seq_len, max_seq_len or seq_len, ranks, device, dtype, repeats)
    finally:
        torch.set_num_threads(previous)
    profile = _profile_header(cuda, model, seq_len, ranks, dtype) | rates
    bandwidth = rates["hbm_bandwidth_gbs"] * 1e9
    profile |= step_figures(rec, model, seq_len, ranks, bandwidth, repeats, quick)
    if ranks > 1:
        profile |= _world_figures(rec, model, seq_len, ranks, device, dtype, repeats, quick)
    else:
        profile["intra_node_bandwidth_gbs"] = round(rates["hbm_bandwidth_gbs"] / 2, 3)
        profile["intra_node_latency_us"] = 10.0
        no_peer = "assumed (one rank: no peer to measure against)"
        rec.provenance |= {"intra_node_bandwidth_gbs": no_peer, "intra_node_latency_us": no_peer}
    profile["inter_node_bandwidth_gbs"] = profile["intra_node_bandwidth_gbs"]
    profile["inter_node_latency_us"] = profile["intra_node_latency_us"]
    for key in ("inter_node_bandwidth_gbs", "inter_node_latency_us"):
        rec.provenance[key] = "assumed: copied from the intra-node figure (one host cannot measure a network)"
    profile["peak_tflops"] = profile["gemm_tflops"]
    rec.provenance["peak_tflops"] = "measured: the GEMM rate (no datasheet figure for this device)"
    memory = "the GPU's total memory" if cuda else "the host's physical memory (ranks share it)"
    rec.provenance["memory_bytes"] = f"measured: {memory}"
    profile["provenance"] = rec.provenance
    return Calibration(profile, rec.warnings)


def default_model() -> ModelConfig:
    """The shapes calibrated when none are named: the 7B model's on a GPU, small ones on CPU."""
    return ModelConfig.preset("7b" if torch.cuda.is_available() else "small")


def _profile_header(cuda: bool, model: ModelConfig, seq_len: int, ranks: int, dtype: torch.dtype) -> dict:
    name = torch.cuda.get_device_name(0) if cuda else f"cpu {platform.processor() or platform.machine()}"
    memory = torch.cuda.get_device_properties(0).total_memory if cuda else _host_memory_bytes()
    cores = None if cuda else os.cpu_count()
    return {
        "name": name.lower().replace(" ", "-"),
        "description": f"measured by tspbench calibrate on {platform.node()}: {name}, {dtype}, model "
        f"{model.name} at {seq_len} tokens, {ranks} local ranks"
        + ("" if cuda else f" (one thread each) on {cores} cores"),
        "gpus_per_node": max(torch.cuda.device_count(), 1) if cuda else max(8, ranks),
        "cores_per_node": cores,
        "memory_bytes": int(memory),
        "usable_memory_fraction": 0.95,
        "sources": [f"tspbench calibrate, torch {torch.__version__}"],
    }


def _device_rates(
    rec: Recorder, model: ModelConfig, seq_len: int, max_seq_len: int, ranks: int, device: torch.device,
    dtype: torch.dtype, repeats: int,
) -> dict:  # fmt: skip
    local = seq_len // max(ranks, 1)
    shapes = gemm_shapes(model, local, (1, ranks)) + gemm_shapes(model, seq_len, (1, ranks))
    gemm = probes.gemm_rate(shapes, device, dtype, repeats)
    rec.step(f"GEMM rate, {len(shapes)} shapes")
    heads, d = max(model.n_heads // max(ranks, 1), 1), model.head_dim
    chunk = max(seq_len // (2 * max(ranks, 2)), 16)
    sides, chunks = attention_sizes(chunk, max_seq_len)
    by_size = {side: probes.attention_rate(1, heads, side, side, d, device, dtype, repeats) for side in sides}
    rec.step(f"causal attention squares, {sides[0]}-{sides[-1]} tokens")
    by_chunk = {c: probes.rectangle_rate(1, heads, c, 4 * c, d, device, dtype, repeats) for c in chunks}
    rec.step(f"attention rectangles, chunks of {chunks[0]}-{chunks[-1]} tokens")
    elementwise = probes.elementwise_rate(local * model.ffn_hidden, device, dtype, repeats)
    rec.step("element-wise bandwidth")
    c, side = _nearest(by_chunk, chunk), _nearest(by_size, local)
    how = {
        "gemm_tflops": f"{len(shapes)} GEMM shapes of {model.name} at {seq_len} tokens, one rank",
        "attention_tflops": f"chunk {c} vs key prefix {4 * c}, {heads} heads of {d}, fwd+bwd",
        "attention_causal_tflops": f"square causal {side} tokens, {heads} heads of {d}, fwd+bwd",
        "hbm_bandwidth_gbs": f"silu-gate, add and scale of {local} x {model.ffn_hidden} tensors",
    }
    scale = {"hbm_bandwidth_gbs": 1e-9}
    rates = {"gemm_tflops": gemm, "attention_tflops": by_chunk[c], "attention_causal_tflops": by_size[side],
             "hbm_bandwidth_gbs": elementwise}  # fmt: skip
    out = {k: rec.note(k, rate, how[k], scale.get(k, 1e-12)) for k, rate in rates.items()}
    for key, table, what in (
        ("attention_causal_by_size", by_size, "square causal calls of {} tokens"),
        ("attention_by_size", by_chunk, "query chunks of {} tokens vs a key prefix 4x as long"),
    ):
        out[key] = {size: round(r.value * 1e-12, 6) for size, r in table.items()}
        spread = max(r.spread for r in table.values())
        rec.provenance[key] = (
            f"measured: {what.format(', '.join(map(str, table)))}, {heads} heads of {d}, fwd+bwd, one rank; "
            f"median of {repeats}, worst spread {spread:.0%}"
        )
        if spread > NOISY_SPREAD:
            rec.warnings.append(f"{key}: repeats differ by up to {spread:.0%} (busy host?)")
    return out


def attention_sizes(chunk: int, max_seq_len: int) -> tuple[list[int], list[int]]:
    """Square sides and rectangle query chunks to time attention at: powers of two from the
    smaller of 128 and a rank's zigzag chunk, up to ``max_seq_len`` (squares: a whole sequence
    on one rank) and half of it (chunks: zigzag cuts a sequence into at least two)."""
    low = 1 << (min(chunk, 128).bit_length() - 1)
    ladder = [low << i for i in range(max_seq_len.bit_length()) if low << i <= max_seq_len]
    return ladder, [c for c in ladder if 2 * c <= max_seq_len] or [low]


def _nearest(table: dict[int, Rate], size: int) -> int:
    return min(table, key=lambda s: abs(math.log(s / size)))


def _world_figures(
    rec: Recorder, model: ModelConfig, seq_len: int, ranks: int, device, dtype, repeats: int, quick: bool
) -> dict:
    shapes = gemm_shapes(model, seq_len // ranks, (1, ranks))
    heads, local = max(model.n_heads // ranks, 1), seq_len // ranks
    probe = {
        "contention": partial(probes.gemm_rank, shapes, dtype, repeats),
        "attention_contention": partial(probes.attention_rank, heads, local, model.head_dim, dtype, repeats),
    }
    shares: dict[str, dict[int, float]] = {key: {} for key in probe}
    if device.type == "cpu":
        for key, fn in probe.items():
            rate = {r: min(launch(fn, r, device=device.type, timeout=600)) for r in sorted({1, 2, ranks})}
            # a rank never gains from sharing its device: a ratio over 1 is two timings' noise
            shares[key] = {r: round(min(v / rate[1], 1.0), 4) for r, v in rate.items()}
            rec.step(f"{key.replace('_', ' ')} at {', '.join(map(str, rate))} ranks")
        rec.provenance["contention"] = f"measured: GEMM rate per rank with 1-{ranks} ranks running at once"
        rec.provenance["attention_contention"] = (
            f"measured: causal attention rate per rank ({heads} heads, {local} tokens, fwd+bwd) with "
            f"1-{ranks} ranks running at once"
        )
    collectives = _collectives(rec, ranks, device, repeats, quick)
    rec.step(f"collectives ({len(collectives)} op x group size pairs)")
    sync_us = _sync_figures(rec, shapes, ranks, device, dtype, quick)
    rec.step("waits on peers after compute")
    times = launch(probes.overlap_rank, ranks, shapes, dtype, 3 if quick else 7, 0,
                   device=device.type, timeout=600)[0]  # fmt: skip
    rec.step("overlap of a ring shift under GEMMs")
    eta = probes.overlap_efficiency(times)
    rec.provenance["overlap_efficiency"] = (
        f"measured: {ranks} ranks, ring shift of {times['bytes'] >> 20} MiB under GEMMs; compute "
        f"{times['compute'].value * 1e3:.1f} ms, comm {times['comm'].value * 1e3:.1f} ms, overlapped "
        f"{times['overlapped'].value * 1e3:.1f} ms (interleaved rounds)"
    )
    all_reduce = next(c for c in collectives if c["op"] == "all_reduce" and c["world_size"] == ranks
                      and c["group_size"] == ranks)  # fmt: skip
    rec.provenance["intra_node_bandwidth_gbs"] = "measured: all-reduce over all ranks (see collectives)"
    rec.provenance["intra_node_latency_us"] = "measured: all-reduce over all ranks (see collectives)"
    return {
        **shares,
        "sync_us": sync_us,
        "collectives": collectives,
        "overlap_efficiency": round(eta, 4),
        "intra_node_bandwidth_gbs": all_reduce["bandwidth_gbs"],
        "intra_node_latency_us": all_reduce["latency_us"],
    }


def _collectives(rec: Recorder, ranks: int, device: torch.device, repeats: int, quick: bool) -> list[dict]:
    """Latency and bus bandwidth of every op on every group size in worlds of 2 and ``ranks``
    (and the all-reduce's latency per call when issued batched)."""
    sizes_bytes = COLLECTIVE_BYTES[:-1] if quick else COLLECTIVE_BYTES
    collectives = []
    for world in sorted({2, ranks}):
        groups = [n for n in range(2, world + 1) if world % n == 0]
        per_rank = launch(probes.collectives_rank, world, list(OPS), groups, list(sizes_bytes), repeats,
                          COLLECTIVE_CALLS, device=device.type, timeout=600)  # fmt: skip
        for op, n in per_rank[0]["links"]:
            slowest = [
                max((r["links"][(op, n)][i] for r in per_rank), key=lambda t: t.value)
                for i in range(len(sizes_bytes))
            ]
            latency, bandwidth = probes.link_figures(op, n, list(zip(sizes_bytes, slowest, strict=True)))
            entry = {"op": op, "group_size": n, "world_size": world,
                     "latency_us": round(latency, 2), "bandwidth_gbs": round(bandwidth, 4)}  # fmt: skip
            if op == "all_reduce":
                batch = max((r["batched"][n] for r in per_rank), key=lambda t: t.value)
                per_call = batch.value / COLLECTIVE_CALLS - prices.transfer_seconds(
                    op, n, sizes_bytes[0], bandwidth
                )
                entry["batched_latency_us"] = round(max(per_call * 1e6, 0.1), 2)
            collectives.append(entry)
            spread = max(t.spread for t in slowest)
            if spread > NOISY_SPREAD:
                rec.warnings.append(f"{op} n={n} world={world}: repeats differ by {spread:.0%}")
    rec.provenance["collectives"] = (
        f"measured: {', '.join(_size(b) for b in sizes_bytes)} messages, {COLLECTIVE_CALLS} calls back to "
        f"back, every group of the world busy, slowest rank, median of {repeats}; latency and bandwidth "
        f"fitted to all sizes (least squares in relative error); batched_latency_us: {COLLECTIVE_CALLS} "
        f"all-reduces of {_size(sizes_bytes[0])} issued async together, per call"
    )
    return collectives


def _sync_figures(
    rec: Recorder, shapes: list, ranks: int, device: torch.device, dtype: torch.dtype, quick: bool
) -> dict[int, dict[float, float]]:
    """What a blocking collective after a chunk of compute waits for its peers, per call, at
    three chunk lengths, in worlds of 2 and ``ranks``: {ranks: {chunk in us: wait in us}}.
    (Ranks sharing a host's cores drift apart while they compute, up to about a time slice.)"""
    chunks = [(shapes[: max(1, len(shapes) // 4)], 1), (shapes, 1), (shapes, 4)]  # (GEMMs, passes)
    out: dict[int, dict[float, float]] = {}
    for world in sorted({2, ranks}):
        out[world] = {}
        for gemms, passes in chunks:
            times = launch(probes.sync_rank, world, gemms, dtype, 3 if quick else 9, 0, passes,
                           device=device.type, timeout=600)  # fmt: skip
            out[world][round(times[0]["chunk_s"] * 1e6, 1)] = round(probes.sync_seconds(times[0]) * 1e6, 1)
    rec.provenance["sync_us"] = (
        "measured: chunks of the step's GEMMs (a quarter of them, all, all 4 times over), each followed by "
        "a blocking 4 KiB all-reduce over the world, against the two apart (interleaved rounds, median): "
        "{ranks: {chunk us: wait us per call}}"
    )
    return out


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def _host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
