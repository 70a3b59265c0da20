"""The price list: what one op costs on a hardware profile (tspbench.analytic.hardware). The three
time models - the closed form (timing.py), the timeline (timeline.py) and decode (decode.py) -
price every op here and nowhere else, so a price changes in one place; so do the figures and
checks that turn work into seconds (the timeline's Gantt chart, gpu-check's decode floor).
tests/project/test_prices_only.py finds any conversion of work into seconds elsewhere.

    GEMM          max(FLOPs / rate, bytes / HBM bandwidth) (a roofline; bytes 0: compute only)
                  rate: the step's GEMM rate (``step_gemm_rate``: as calibrate's profiled step
                  ran the model's GEMMs), or for a decode step the achievable ``gemm_tflops``
    attention     max(FLOPs / rate, bytes / HBM bandwidth): the rate of its kind and size
                  (``attention_tflops``: a causal square by its side, a rectangle - a query
                  chunk against the keys before it - by the chunk; side 0: the profile's
                  single rate); bytes: the K/V a decode call reads (0 elsewhere)
    element-wise  bytes / bandwidth: HBM's, or, named by its op, the rate the profile measured
                  for that op (``elementwise_by_op``; "*": every other op)
    at a share    (kernel seconds + per-op overhead) / the rank's share of its device
    memory        bytes / bandwidth (``memory_seconds``): the roofline's memory side, the
                  element-wise ops, and a step's floor where it must read them (decode)
    per kernel    ``op_overhead_us`` each: the fixed device time of a kernel that the per-op,
                  GEMM and counted rates leave out (``kernel_overhead_seconds``)
    host          ``host_overhead_us`` per op dispatched, kernel or view, outside its kernel (a
                  CPU's Python and autograd; 0 where the host runs ahead:
                  ``host_overhead_seconds``), and where a GPU's host is behind, what the device
                  waits for it: ops x ``launch_us`` beyond the device's own time (``host_seconds``)
    collective    latency + bus bytes / bus bandwidth of its op, group size and link (inside a
                  node or across the NIC: ``crosses_nodes``); the latency and the transfer
                  apart, since only the transfer holds the link
    peer wait     where ranks share a host's cores, a blocking call's wait for its peers after
                  a chunk of compute (``peer_wait_seconds``)
    launches      a decode step replayed as a CUDA graph: its kernels at the profile's cost per
                  kernel inside a graph, plus one replay (0 where the profile measured none)
    overlap       hidden traffic behind compute: ``(1 - eta) hidden + max(0, eta hidden -
                  compute)`` still costs time (eta: the profile's overlap efficiency); a
                  window's traffic hides behind at most the window's compute (``behind``)

Prices accept numpy arrays where they take sizes (the timeline prices a trace's events at once)
and give the same bits as on floats.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from tspbench.analytic.hardware import Hardware
from tspbench.core.bus import BUS_FACTOR


def roofline(flops, nbytes, tflops: float, hw: Hardware):
    """max(FLOPs / rate, bytes / HBM bandwidth): seconds of a kernel bound by either."""
    compute, memory = flops / (tflops * 1e12), memory_seconds(nbytes, hw.hbm_bandwidth_gbs)
    return np.maximum(compute, memory) if isinstance(compute, np.ndarray) else max(compute, memory)


def memory_seconds(nbytes, gbs: float):
    """``nbytes`` read or written at ``gbs`` GB/s: a roofline's memory side at HBM's bandwidth,
    element-wise ops at their rate, and alone the floor of a step that must read them (a decode
    step its weights and KV cache, gpu-check's decode/tpot)."""
    return nbytes / (gbs * 1e9)


# ----------------------------------------------------------------------------- compute


def gemm_tflops(hw: Hardware, decode: bool = False) -> float:
    """The GEMM rate: the step's (``step_gemm_rate``), or with ``decode`` the achievable one
    (``gemm_tflops``: a decode step's GEMMs are not those calibrate profiled)."""
    return hw.gemm_tflops if decode else hw.step_gemm_rate


def gemm_seconds(hw: Hardware, flops, nbytes=0.0, decode: bool = False):
    """One GEMM (or a sum of them) of ``flops`` reading ``nbytes`` (0: compute-bound, no roofline)."""
    return roofline(flops, nbytes, gemm_tflops(hw, decode), hw)


def attention_tflops(hw: Hardware, causal: bool, side: int = 0) -> float:
    """The rate of an attention call: a causal square of ``side`` tokens, else a rectangle of a
    query chunk of ``side`` tokens (0: the profile's single rate). Where a profile tells its
    attention kernels apart (``Hardware.attention_kernel``), their rates are chosen here."""
    return hw.causal_tflops(side) if causal else hw.rectangle_tflops(side)


def attention_seconds(hw: Hardware, flops, causal: bool, side: int = 0, nbytes=0.0):
    """One attention call (or a sum of calls alike) of ``flops`` reading ``nbytes`` of K/V."""
    return roofline(flops, nbytes, attention_tflops(hw, causal, side), hw)


def elementwise_gbs(hw: Hardware, op: str | None = None) -> float:
    """GB/s of an element-wise op: HBM's, or the rate measured for ``op`` by name where the
    profile has one (``elementwise_by_op``; "*": every op it does not name)."""
    if op is None:
        return hw.hbm_bandwidth_gbs
    return hw.elementwise_by_op.get(op, hw.elementwise_by_op.get("*", hw.hbm_bandwidth_gbs))


def elementwise_seconds(nbytes, gbs):
    """Element-wise ops moving ``nbytes`` at ``gbs`` (``elementwise_gbs``)."""
    return memory_seconds(nbytes, gbs)


def at_share(kernel_s, share, overhead_s: float = 0.0):
    """A kernel's seconds and its per-op overhead at the rank's ``share`` of its device."""
    return (kernel_s + overhead_s) / share


def kernel_overhead_seconds(hw: Hardware, kernels: int = 1) -> float:
    """Seconds of the fixed device cost of ``kernels`` kernels (``op_overhead_us`` each)."""
    return kernels * hw.op_overhead_us * 1e-6


def host_overhead_seconds(hw: Hardware, ops: int = 1) -> float:
    """Seconds the host spends on ``ops`` dispatched ops outside their kernels
    (``host_overhead_us`` each: a CPU's Python and autograd; 0 where the host runs ahead)."""
    return ops * hw.host_overhead_us * 1e-6


def host_seconds(hw: Hardware, ops: int, device_s: float) -> float:
    """Seconds a step of ``ops`` dispatched ops (kernels and views) adds to ``device_s`` of device
    time for its host: ``host_overhead_us`` per op, plus what the device waits where the host
    launching ``ops`` eagerly at ``launch_us`` each falls behind it."""
    per_op = host_overhead_seconds(hw, ops)
    return per_op + max(0.0, ops * hw.launch_us * 1e-6 - device_s)


def graph_launch_seconds(hw: Hardware, kernels: int) -> float:
    """What replaying a captured graph of ``kernels`` kernels adds to their work: ``kernels``
    graph_kernel_us and one graph_replay_us."""
    return (kernels * hw.graph_kernel_us + hw.graph_replay_us) * 1e-6


# ----------------------------------------------------------------------------- communication


def crosses_nodes(ranks: Iterable[int], gpus_per_node: int) -> bool:
    """Whether global ``ranks`` span nodes (ranks are placed row-major, model-parallel innermost)."""
    return len({r // gpus_per_node for r in ranks}) > 1


def collective_seconds(
    hw: Hardware,
    op: str,
    group_size: int,
    world_size: int,
    inter_node: bool,
    msg_bytes: float,
    batched: bool = False,
) -> tuple[float, float]:
    """(latency s, transfer s) of one collective or point-to-point call: the transfer (bus bytes
    over the link's bandwidth) holds the link, the latency does not; ``batched``: a call issued
    async with others of its phase, at the batched latency where the profile measured one."""
    latency, bandwidth = hw.link(op, group_size, world_size, inter_node, batched)
    return latency, BUS_FACTOR[op](group_size) * msg_bytes / bandwidth


def transfer_seconds(op: str, group_size: int, msg_bytes: float, gbs: float) -> float:
    """The transfer alone of ``op`` over ``group_size`` ranks at a bus bandwidth of ``gbs`` GB/s
    (no latency): what calibrate takes off a batched call's time to find its latency per call."""
    return BUS_FACTOR[op](group_size) * msg_bytes / (gbs * 1e9)


def peer_wait_seconds(hw: Hardware, ranks_on_node: int, chunk_s: float) -> float:
    """What a blocking call after ``chunk_s`` of compute waits for its peers to be scheduled,
    where ranks share a host's cores (``Hardware.sync_s``; 0 on a device of its own)."""
    return hw.sync_s(ranks_on_node, chunk_s)


# ----------------------------------------------------------------------------- overlap


def hidden_exposed(compute_s: float, hidden_s: float, eta: float) -> float:
    """What ``hidden_s`` of traffic the schedule overlaps with ``compute_s`` still costs: the part
    the device cannot overlap (1 - eta) and what outlasts the compute it hides behind."""
    return (1 - eta) * hidden_s + max(0.0, eta * hidden_s - compute_s)


def behind(transfer_s: float, window_s: float) -> tuple[float, float]:
    """(hidden, exposed) of ``transfer_s`` in flight behind ``window_s`` of compute: a window
    hides at most its own compute; the rest is on the critical path."""
    return min(transfer_s, window_s), max(0.0, transfer_s - window_s)


def fully_hidden(compute_s: float, hidden_s: float, eta: float) -> bool:
    """Whether ``compute_s`` hides all of ``hidden_s`` that the device can overlap."""
    return compute_s >= eta * hidden_s
