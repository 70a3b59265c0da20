"""``tspbench calibrate``: measure this device and write a hardware profile ``predict`` accepts.

Measured (median of repeats, after a warm-up): the achievable GEMM rate (square matmuls, best
size), the achievable causal attention rate (SDPA forward + backward, FLOPs counted as the
dense rectangle FlopCounterMode counts, 3.5 x 4 B n S^2 d), memory bandwidth (a large copy),
and with ``ranks`` > 1 the bus bandwidth and latency of an all-reduce between local ranks
(gloo on CPU, NCCL on GPUs). On CPU the node is this host: its memory is the capacity and
its ranks share it. Inter-node numbers cannot be measured from one host: they are copied
from the intra-node ones and marked so in the profile's sources.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tspbench.dist import comm
from tspbench.dist.launch import launch, local_device
from tspbench.dist.mesh import Mesh


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn: Callable[[], object], device: torch.device, repeats: int = 5) -> float:
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gemm_tflops(device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...]) -> float:
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        seconds = _median_time(lambda a=a, b=b: a @ b, device)
        best = max(best, 2 * n**3 / seconds / 1e12)
    return best


def attention_tflops(device: torch.device, dtype: torch.dtype, seq: int, heads: int, head_dim: int) -> float:
    q, k, v = (
        torch.randn(1, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3)
    )

    def step() -> None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(torch.ones_like(out))

    seconds = _median_time(step, device, repeats=3)
    return 3.5 * 4 * heads * seq * seq * head_dim / seconds / 1e12


def copy_bandwidth_gbs(device: torch.device, nbytes: int) -> float:
    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = _median_time(lambda: dst.copy_(src), device)
    return 2 * nbytes / seconds / 1e9


def _all_reduce_rank(sizes: tuple[int, ...]) -> dict[int, float]:
    device = local_device()
    group = Mesh({"x": dist.get_world_size()}, dist.get_rank()).group("x")
    out = {}
    for nbytes in sizes:
        x = torch.ones(nbytes // 4, device=device)
        out[nbytes] = _median_time(lambda x=x: comm.all_reduce(x, group), device)
    return out


def collective(ranks: int, device_type: str, sizes: tuple[int, ...]) -> tuple[float, float]:
    """(bus bandwidth GB/s of the largest all-reduce, latency us of the smallest)."""
    timing = launch(_all_reduce_rank, ranks, sizes, device=device_type, timeout=600)[0]
    big = max(sizes)
    bus = 2 * (ranks - 1) / ranks * big / timing[big] / 1e9
    return bus, timing[min(sizes)] * 1e6


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def calibrate(ranks: int = 2, quick: bool = False) -> dict[str, object]:
    """Measure this device; returns a profile as a dict (``tspbench.hardware.Hardware`` fields)."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    sizes = (1024, 2048) if quick or not cuda else (4096, 8192)
    gemm = gemm_tflops(device, dtype, sizes)
    attention = attention_tflops(
        device, dtype, 1024 if quick or not cuda else 8192, 8 if not cuda else 32, 64 if not cuda else 128
    )
    bandwidth = copy_bandwidth_gbs(device, (64 if not cuda else 1024) * 2**20)
    ranks = min(ranks, torch.cuda.device_count()) if cuda else ranks
    if ranks > 1:
        bus, latency = collective(ranks, device.type, (4096, (16 if quick else 64) * 2**20))
    else:
        bus, latency = bandwidth / 2, 10.0
    name = torch.cuda.get_device_name(0) if cuda else f"cpu {platform.processor() or platform.machine()}"
    memory = torch.cuda.get_device_properties(0).total_memory if cuda else host_memory_bytes()
    return {
        "name": name.lower().replace(" ", "-"),
        "description": f"measured by tspbench calibrate on {platform.node()}: {name}, dtype {dtype}",
        "gpus_per_node": torch.cuda.device_count() if cuda else max(ranks, 1),
        "memory_bytes": int(memory),
        "usable_memory_fraction": 0.95,
        "peak_tflops": round(gemm, 4),
        "gemm_tflops": round(gemm, 4),
        "attention_tflops": round(attention, 4),
        "hbm_bandwidth_gbs": round(bandwidth, 2),
        "intra_node_bandwidth_gbs": round(bus, 3),
        "intra_node_latency_us": round(latency, 1),
        "inter_node_bandwidth_gbs": round(bus, 3),
        "inter_node_latency_us": round(latency, 1),
        "sources": [
            f"tspbench calibrate, torch {torch.__version__}, {ranks} local ranks",
            "peak_tflops is the measured GEMM rate (no datasheet figure for this device)",
            "inter-node figures copied from intra-node: one host cannot measure a network",
        ],
    }
