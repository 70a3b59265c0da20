"""The measurements calibrate makes: each one a kernel or collective timed over repeats.

Every probe returns a Rate: the median over repeats and the spread ((max - min) / median) that
calibrate reports and warns about. Rates are per rank on the device it runs on: on CPU one
thread, as every rank runs (tspbench.dist.launch sets one thread per rank); on CUDA its GPU.
FLOPs are counted as torch's FlopCounterMode counts them (attention: the dense rectangle of
each call), the convention the analytic model's hardware FLOPs follow.

Rank-side probes (``*_rank``) run inside a launched world; the others in the calling process.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from tspbench.dist import comm
from tspbench.dist.comm import BUS_FACTOR
from tspbench.dist.launch import local_device
from tspbench.dist.mesh import Mesh
from tspbench.measure.flop_counter import register_cpu_attention_flops
from tspbench.model.layers import causal_attention

register_cpu_attention_flops()


@dataclass(frozen=True)
class Rate:
    """A measured figure: the median over repeats and their spread ((max - min) / median)."""

    value: float
    spread: float
    repeats: int

    @classmethod
    def of(cls, samples: list[float]) -> Rate:
        median = statistics.median(samples)
        spread = (max(samples) - min(samples)) / median if median else 0.0
        return cls(median, spread, len(samples))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(
    fn: Callable[[], object], device: torch.device, repeats: int, calls: int | None = None
) -> Rate:
    """Wall seconds of one call of ``fn``; each repeat runs ``calls`` calls (default: enough to
    last 50 ms; collectives must pass a fixed count, the same on every rank)."""
    fn()
    _sync(device)
    if calls is None:
        start = time.perf_counter()
        fn()
        _sync(device)
        calls = max(1, int(0.05 / max(time.perf_counter() - start, 1e-7)))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        samples.append((time.perf_counter() - start) / calls)
    return Rate.of(samples)


def counted_flops(fn: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def throughput(work: float, fn: Callable[[], object], device: torch.device, repeats: int) -> Rate:
    """``work`` units per second of ``fn`` (median and spread over repeats)."""
    per_call = seconds_per_call(fn, device, repeats)
    return Rate(work / per_call.value, per_call.spread, per_call.repeats)


# ----------------------------------------------------------------------------- device rates


Shapes = list[tuple[int, int, int]]  # (m, n, k) of [m, k] x [k, n] GEMMs


def gemm_rate(shapes: Shapes, device: torch.device, dtype: torch.dtype, repeats: int) -> Rate:
    """FLOP/s over a set of [m, k] x [k, n] GEMMs run back to back (the step's mix of shapes)."""
    flops = sum(2 * m * n * k for m, n, k in shapes)
    return throughput(flops, gemm_pass(shapes, device, dtype), device, repeats)


def gemm_pass(
    shapes: Shapes, device: torch.device, dtype: torch.dtype, passes: int = 1
) -> Callable[[], None]:
    """A call that runs ``passes`` passes over [m, k] x [k, n] GEMMs of ``shapes``, back to back."""
    pairs = [(torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype))
             for m, n, k in shapes]  # fmt: skip

    def call() -> None:
        for _ in range(passes):
            for a, b in pairs:
                a @ b

    return call


def attention_rate(
    batch: int, heads: int, q_len: int, k_len: int, head_dim: int, device: torch.device, dtype: torch.dtype,
    repeats: int, backward: bool = True,
) -> Rate:  # fmt: skip
    """Counted FLOP/s of causal attention of a query chunk (q_len) at the end of a key prefix
    (k_len): k_len > q_len is a rectangle plus its causal diagonal block, as sequence-parallel
    strategies call it; k_len == q_len one square causal call."""

    def tensor(length: int) -> torch.Tensor:
        return torch.randn(batch, heads, length, head_dim, device=device, dtype=dtype, requires_grad=backward)

    q, k, v = tensor(q_len), tensor(k_len), tensor(k_len)
    grad = torch.ones(batch, heads, q_len, head_dim, device=device, dtype=dtype)

    def call() -> None:
        out = causal_attention(q, k, v)
        if backward:
            out.backward(grad)

    return throughput(counted_flops(call), call, device, repeats)


def rectangle_rate(
    batch: int, heads: int, chunk: int, prefix: int, head_dim: int, device: torch.device, dtype: torch.dtype,
    repeats: int,
) -> Rate:  # fmt: skip
    """Counted FLOP/s of the rectangle alone: a chunk against a fully visible key prefix."""

    def tensor(length: int) -> torch.Tensor:
        return torch.randn(batch, heads, length, head_dim, device=device, dtype=dtype, requires_grad=True)

    q, k, v = tensor(chunk), tensor(prefix), tensor(prefix)
    grad = torch.ones(batch, heads, chunk, head_dim, device=device, dtype=dtype)

    def call() -> None:
        F.scaled_dot_product_attention(q, k, v).backward(grad)

    return throughput(counted_flops(call), call, device, repeats)


def elementwise_rate(numel: int, device: torch.device, dtype: torch.dtype, repeats: int) -> Rate:
    """Bytes/s of the element-wise ops a block runs (gated product, residual add, scaling):
    every input read and every output written counted once."""
    a, b = torch.randn(numel, device=device, dtype=dtype), torch.randn(numel, device=device, dtype=dtype)
    size = a.element_size() * numel

    def call() -> None:
        gated = F.silu(a) * b  # 2 reads + 1 write, and the silu temporary (1 write, 1 read)
        gated.add_(a)  # 2 reads + 1 write
        gated.mul_(0.5)  # 1 read + 1 write

    return throughput(10 * size, call, device, repeats)


# ----------------------------------------------------------------------------- rank-side probes


def gemm_rank(shapes: Shapes, dtype: torch.dtype, repeats: int) -> float:
    """GEMM FLOP/s of this rank while every rank of the world runs the same GEMMs."""
    device = local_device()
    dist.barrier()
    return gemm_rate(shapes, device, dtype, repeats).value


def attention_rank(heads: int, side: int, head_dim: int, dtype: torch.dtype, repeats: int) -> float:
    """Counted FLOP/s of square causal attention on this rank while every rank runs the same."""
    device = local_device()
    dist.barrier()
    return attention_rate(1, heads, side, side, head_dim, device, dtype, repeats).value


def collectives_rank(ops: list[str], sizes: list[int], nbytes: list[int], repeats: int, calls: int) -> dict:
    """Seconds per call of each op on groups of each size (all groups busy at once), at each
    message size: {"links": {(op, n): [Rate per size]}, "batched": {n: Rate}}. A repeat issues
    ``calls`` calls back to back, as a step issues them; "batched": seconds of ``calls`` smallest
    all-reduces issued async together. Every rank returns its own."""
    device, world = local_device(), dist.get_world_size()
    links, batched = {}, {}
    for n in sizes:
        mesh = Mesh({"outer": world // n, "inner": n}, dist.get_rank())
        group = mesh.group("inner")
        for op in ops:
            links[(op, n)] = [
                seconds_per_call(partial(_issue, op, group, b, device), device, repeats, calls=calls)
                for b in nbytes
            ]
        batch = partial(_batched_all_reduce, group, nbytes[0], calls, device)
        batched[n] = seconds_per_call(batch, device, repeats, calls=1)
    return {"links": links, "batched": batched}


def _batched_all_reduce(group: comm.Group, nbytes: int, calls: int, device: torch.device) -> None:
    """``calls`` all-reduces issued async together and waited on together (as gradients are)."""
    bufs = [torch.empty(nbytes // 4, device=device) for _ in range(calls)]
    for work in [comm.all_reduce(b, group, async_op=True) for b in bufs]:
        work.wait()


def _issue(op: str, group: comm.Group, nbytes: int, device: torch.device) -> None:
    """One collective of ``nbytes`` message bytes (tspbench.dist.comm's convention per op)."""
    n = group.size
    buf = torch.empty(nbytes // 4 // n * n, device=device)
    if op == "all_reduce":
        comm.all_reduce(buf, group)
    elif op == "all_gather":
        comm.all_gather(buf[: buf.numel() // n], group)
    elif op == "reduce_scatter":
        comm.reduce_scatter(buf.view(n, -1), group)
    elif op == "broadcast":
        comm.broadcast(buf, 0, group)
    elif op == "reduce":
        comm.reduce(buf, 0, group)
    else:
        comm.ring_shift(buf, group)


def link_figures(op: str, n: int, points: list[tuple[int, Rate]]) -> tuple[float, float]:
    """(latency in us, bus bandwidth in GB/s): the line t = latency + bus bytes / bandwidth
    fitted to (message bytes, seconds per call) at several sizes, least squares in relative
    error (each point weighted 1 / t^2, so the small messages count as much as the large)."""
    bus = BUS_FACTOR[op](n)
    xt = [(bus * nbytes, rate.value) for nbytes, rate in points]
    w = sum(1 / t**2 for _, t in xt)
    x_mean = sum(x / t**2 for x, t in xt) / w
    t_mean = sum(1 / t for _, t in xt) / w  # sum of t / t^2
    sxx = sum((x - x_mean) ** 2 / t**2 for x, t in xt)
    sxt = sum((x - x_mean) * (t - t_mean) / t**2 for x, t in xt)
    slope = max(sxt / sxx, 1e-15)
    latency = max(t_mean - slope * x_mean, 1e-7)
    return latency * 1e6, 1 / slope / 1e9


def overlap_rank(shapes: Shapes, dtype: torch.dtype, rounds: int, seed: int) -> dict:
    """Seconds of compute alone, a ring shift alone, and both (the shift issued async before the
    GEMMs, waited after), interleaved round by round in a seeded random order. The transfer is
    sized to last about as long as the compute (agreed across ranks), where hiding matters most."""
    device = local_device()
    group = Mesh({"x": dist.get_world_size()}, dist.get_rank()).group("x")
    compute = gemm_pass(shapes, device, dtype)
    probe = torch.empty(2**18, device=device)  # 1 MiB
    ratio = (
        seconds_per_call(compute, device, 3, calls=1).value
        / seconds_per_call(partial(comm.ring_shift, probe, group), device, 3, calls=2).value
    )
    agreed = torch.tensor([min(max(ratio, 1.0), 256.0)], device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    buf = torch.empty(int(probe.numel() * float(agreed.item())), device=device)

    def transfer() -> None:
        comm.ring_shift(buf, group)

    def both() -> None:
        pending = comm.ring_shift(buf, group, async_op=True)
        compute()
        pending.wait()

    variants = {"compute": compute, "comm": transfer, "overlapped": both}
    samples = interleaved(variants, rounds, seed, device)
    return {"bytes": buf.numel() * buf.element_size(), **{k: Rate.of(v) for k, v in samples.items()}}


def sync_rank(
    shapes: Shapes, dtype: torch.dtype, rounds: int, seed: int, passes: int = 1, calls: int = 6
) -> dict:
    """Seconds of ``calls`` chunks of compute alone (``passes`` passes over the GEMMs each), of
    ``calls`` blocking 4 KiB all-reduces over the world alone (back to back), and of the chunks
    each followed by an all-reduce, as a step issues its collectives; interleaved round by round
    in a seeded random order. "sync": what each call waited beyond the two apart, per round."""
    device = local_device()
    group = Mesh({"x": dist.get_world_size()}, dist.get_rank()).group("x")
    chunk = gemm_pass(shapes, device, dtype, passes)
    small = torch.empty(1024, device=device)

    def reduce() -> None:
        comm.all_reduce(small, group)

    variants = {
        "compute": lambda: [chunk() for _ in range(calls)],
        "comm": lambda: [reduce() for _ in range(calls)],
        "mixed": lambda: [(chunk(), reduce()) for _ in range(calls)],
    }
    samples = interleaved(variants, rounds, seed, device)
    rounds_of = zip(samples["compute"], samples["comm"], samples["mixed"], strict=True)
    extra = [(both - c - m) / calls for c, m, both in rounds_of]
    times = {k: Rate.of(v) for k, v in samples.items()}
    return {"calls": calls, "chunk_s": times["compute"].value / calls, "sync": Rate.of(extra), **times}


def sync_seconds(times: dict) -> float:
    """What a blocking collective after a chunk of compute waits beyond compute and collective
    apart, per call: the median over rounds (0 where ranks own their devices)."""
    return max(0.0, times["sync"].value)


def interleaved(
    variants: dict[str, Callable[[], object]], rounds: int, seed: int, device: torch.device
) -> dict[str, list[float]]:
    """Seconds of each variant per round (slowest rank, every rank entering together), rounds
    of every variant in a seeded random order, so drift on a shared host does not decide the
    comparison."""
    samples: dict[str, list[float]] = {k: [] for k in variants}
    order = random.Random(seed)
    for _ in range(rounds):
        names = list(variants)
        order.shuffle(names)
        for name in names:
            dist.barrier()
            start = time.perf_counter()
            variants[name]()
            _sync(device)
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            samples[name].append(float(elapsed.item()))
    return samples


def overlap_efficiency(times: dict[str, Rate]) -> float:
    """The fraction of the transfer that ran under the compute: (compute + comm - both) /
    min(compute, comm), clipped to [0, 1]."""
    c, m, both = times["compute"].value, times["comm"].value, times["overlapped"].value
    return min(1.0, max(0.0, (c + m - both) / min(c, m)))
