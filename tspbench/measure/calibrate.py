"""``tspbench calibrate``: measure what the time model uses, and write a hardware profile.

Measured on the rank configuration the points run with (a model preset, a sequence length and
a number of local ranks), every figure the median of ``repeats`` with its spread:

    gemm_tflops               the step's GEMM shapes (projections and MLP, forward and weight
                              gradients, whole and sharded widths), one rank alone
    attention_tflops          a query chunk against a visible key prefix (the rectangles of
                              sequence-parallel attention), forward + backward, at the model's
                              head dim; attention_causal_tflops (and _by_size): square causal
                              calls of a zigzag chunk, a rank's tokens and the whole sequence
    hbm_bandwidth_gbs         element-wise ops on activation-sized tensors
    elementwise_passes        the element-wise ops of a single-device step of the model (one
                              rank at a rank's tokens; torch.profiler's self time of every op
                              that is not a GEMM or attention), as passes over a block's
                              activations (train, infer) and the parameters (AdamW) at that
                              bandwidth (CPU; on CUDA the assumed 12, 4 and 12)
    contention                each rank's share of its device when 1..ranks ranks run GEMMs at
                              once (CPU: ranks share the host's cores)
    collectives               latency and bus bandwidth of every op a strategy uses, on every
                              group size, with every group of the world busy at once (gloo on
                              CPU, NCCL on GPUs), in worlds of 2 and ``ranks``
    overlap_efficiency        how much of a ring transfer really runs under GEMMs: compute-only,
                              comm-only and overlapped times, interleaved in a seeded order

A measurement whose repeats differ by more than 20% is reported in ``warnings`` (a busy host).
Where one host cannot measure a figure (the network between nodes) it is copied from the
intra-node one and marked so in ``provenance``.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field

import torch

from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.dist.launch import launch
from tspbench.measure import probes
from tspbench.measure.probes import Rate
from tspbench.strategy import Strategy, check_layout

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send_recv")
NOISY_SPREAD = 0.20


@dataclass
class Calibration:
    """A profile (Hardware fields) with each figure's provenance, and warnings about noise."""

    profile: dict[str, object]
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Recorder:
    provenance: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def note(self, key: str, rate: Rate, how: str, scale: float = 1.0) -> float:
        self.provenance[key] = f"measured: {how}; median of {rate.repeats}, spread {rate.spread:.0%}"
        if rate.spread > NOISY_SPREAD:
            self.warnings.append(f"{key}: repeats differ by {rate.spread:.0%} (busy host?): {how}")
        return round(rate.value * scale, 6)


def gemm_shapes(model: ModelConfig, tokens: int, degrees: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(m, n, k) of the step's GEMMs: projections and MLP, forward and weight gradient, with the
    widths split over each degree (TP and TSP shard them; DP and SP do not)."""
    h, out = model.hidden, []
    for d in sorted(set(degrees)):
        for width in (h // d, model.ffn_hidden // d):
            out += [(tokens, width, h), (width, h, tokens)]  # x W^T and dW = dY^T x
    return out


def calibrate(
    ranks: int = 4,
    model: ModelConfig | None = None,
    seq_len: int = 2048,
    repeats: int = 5,
    quick: bool = False,
) -> Calibration:
    """Measure this device (and ``ranks`` local ranks of it) for ``model`` at ``seq_len``."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    model = model or ModelConfig.preset("small" if not cuda else "7b")
    ranks = min(ranks, torch.cuda.device_count()) if cuda else ranks
    repeats = 3 if quick else repeats
    rec = _Recorder()
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # as every rank runs
    try:
        rates = _device_rates(rec, model, seq_len, ranks, device, dtype, repeats)
    finally:
        torch.set_num_threads(previous)
    profile = _profile_header(cuda, model, seq_len, ranks, dtype) | rates
    if not cuda:
        bandwidth = rates["hbm_bandwidth_gbs"] * 1e9
        profile["elementwise_passes"] = _elementwise_passes(rec, model, seq_len // ranks, bandwidth, repeats)
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
    rec: _Recorder, model: ModelConfig, seq_len: int, ranks: int, device: torch.device, dtype: torch.dtype,
    repeats: int,
) -> dict:  # fmt: skip
    local = seq_len // max(ranks, 1)
    shapes = gemm_shapes(model, local, (1, ranks)) + gemm_shapes(model, seq_len, (1, ranks))
    gemm = probes.gemm_rate(shapes, device, dtype, repeats)
    heads, d = max(model.n_heads // max(ranks, 1), 1), model.head_dim
    chunk = max(seq_len // (2 * max(ranks, 2)), 16)
    rect = probes.rectangle_rate(1, heads, chunk, 4 * chunk, d, device, dtype, repeats)
    sides = sorted({chunk, local, seq_len})
    by_size = {side: probes.attention_rate(1, heads, side, side, d, device, dtype, repeats) for side in sides}
    square = by_size[local]
    elementwise = probes.elementwise_rate(local * model.ffn_hidden, device, dtype, repeats)
    how = {
        "gemm_tflops": f"{len(shapes)} GEMM shapes of {model.name} at {seq_len} tokens, one rank",
        "attention_tflops": f"chunk {chunk} vs key prefix {4 * chunk}, {heads} heads of {d}, fwd+bwd",
        "attention_causal_tflops": f"square causal {local} tokens, {heads} heads of {d}, fwd+bwd",
        "hbm_bandwidth_gbs": f"silu-gate, add and scale of {local} x {model.ffn_hidden} tensors",
    }
    scale = {"hbm_bandwidth_gbs": 1e-9}
    rates = {"gemm_tflops": gemm, "attention_tflops": rect, "attention_causal_tflops": square,
             "hbm_bandwidth_gbs": elementwise}  # fmt: skip
    out = {k: rec.note(k, rate, how[k], scale.get(k, 1e-12)) for k, rate in rates.items()}
    out["attention_causal_by_size"] = {side: round(r.value * 1e-12, 6) for side, r in by_size.items()}
    spread = max(r.spread for r in by_size.values())
    rec.provenance["attention_causal_by_size"] = (
        f"measured: square causal calls of {', '.join(map(str, sides))} tokens, {heads} heads of {d}, "
        f"fwd+bwd; median of {repeats}, worst spread {spread:.0%}"
    )
    return out


def _elementwise_passes(
    rec: _Recorder, model: ModelConfig, tokens: int, bandwidth: float, repeats: int
) -> dict:
    """Passes over a block's activations (per layer) and the parameters that a single-device
    step's element-wise time is worth at ``bandwidth`` (tspbench.analytic.timing's terms)."""
    seconds = launch(probes.elementwise_rank, 1, model, tokens, repeats, timeout=600)[0]
    sized = {mode: _single_device(model, tokens, mode) for mode in ("train", "infer")}
    basis = {mode: model.n_layers * s.elementwise_layer_bytes() for mode, s in sized.items()}
    basis["optimizer"] = sized["train"].predict_memory().persistent["parameters"]
    what = {"train": "train step", "infer": "forward", "optimizer": "AdamW step"}
    out = {k: rec.note(f"elementwise_passes.{k}", seconds[k], what[k], bandwidth / basis[k]) for k in what}
    how = (
        f"measured: element-wise ops of {model.name} at {tokens} tokens on one rank (torch.profiler self "
        "time of every op but GEMMs and attention), as passes at hbm_bandwidth_gbs"
    )
    rec.provenance["elementwise_passes"] = how
    return {k: round(v, 2) for k, v in out.items()}


def _single_device(model: ModelConfig, tokens: int, mode: str) -> Strategy:
    """The analytic sizes of one rank holding the whole model (DP over a world of one)."""
    workload = Workload(model, 1, tokens, mode)
    return check_layout(Layout("dp"), workload).for_analysis(Layout("dp"), workload)


def _world_figures(
    rec: _Recorder, model: ModelConfig, seq_len: int, ranks: int, device, dtype, repeats: int, quick: bool
) -> dict:
    shapes = gemm_shapes(model, seq_len // ranks, (1, ranks))
    alone = None
    contention = {}
    for r in sorted({1, 2, ranks} if device.type == "cpu" else {1}):
        per_rank = min(launch(probes.gemm_rank, r, shapes, dtype, repeats, device=device.type, timeout=600))
        alone = alone or per_rank
        contention[r] = round(per_rank / alone, 4)
    if device.type == "cpu":
        rec.provenance["contention"] = f"measured: GEMM rate per rank with 1-{ranks} ranks running at once"
    large = (4 if quick else 16) * 2**20
    collectives = []
    for world in sorted({2, ranks}):
        sizes = [n for n in range(2, world + 1) if world % n == 0]
        per_rank = launch(probes.collectives_rank, world, list(OPS), sizes, (4096, large), repeats,
                          device=device.type, timeout=600)  # fmt: skip
        for op, n in per_rank[0]:
            worst_small = max((r[(op, n)][0] for r in per_rank), key=lambda t: t.value)
            worst_big = max((r[(op, n)][1] for r in per_rank), key=lambda t: t.value)
            latency, bandwidth = probes.link_figures(op, n, (4096, worst_small), (large, worst_big))
            entry = {"op": op, "group_size": n, "world_size": world}
            collectives.append(
                entry | {"latency_us": round(latency, 2), "bandwidth_gbs": round(bandwidth, 4)}
            )
            if worst_big.spread > NOISY_SPREAD:
                rec.warnings.append(f"{op} n={n} world={world}: repeats differ by {worst_big.spread:.0%}")
    rec.provenance["collectives"] = (
        f"measured: 4 KiB and {large >> 20} MiB messages, every group of the world busy, slowest rank, "
        f"median of {repeats}"
    )
    times = launch(probes.overlap_rank, ranks, shapes, dtype, 3 if quick else 7, 0,
                   device=device.type, timeout=600)[0]  # fmt: skip
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
        "contention": contention if device.type == "cpu" else {},
        "collectives": collectives,
        "overlap_efficiency": round(eta, 4),
        "intra_node_bandwidth_gbs": all_reduce["bandwidth_gbs"],
        "intra_node_latency_us": all_reduce["latency_us"],
    }


def _host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
