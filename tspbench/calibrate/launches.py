"""What a kernel launch costs the host on a GPU, measured: the price of a step's many small kernels.

    eager_kernel_us  one tiny kernel launched eagerly from Python (torch's dispatch, the
                     CUDA launch), per kernel, over ``KERNELS`` back to back (the floor of
                     a model's eager op, whose Python adds more: calibrate's launch_us)
    graph_kernel_us  one kernel inside a replayed CUDA graph, per kernel of a graph of ``KERNELS``
    graph_replay_us  replaying a graph of one kernel, per replay (what a captured decode step
                     pays once, on top of its kernels)

A tiny kernel (an in-place add on one element) does no work of its own, so each figure is the
launch path alone. CUDA only: a CPU op has no launch apart from its own dispatch, which
calibrate's ``host_overhead_us`` and ``op_overhead_us`` measure.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

KERNELS = 2000


def timed(fn: Callable[[], object], device: str, repeats: int) -> float:
    """Median wall seconds of ``fn()`` over ``repeats`` runs after two warm-ups, synchronised on a
    GPU (gpu-check's timer)."""
    times = []
    for i in range(repeats + 2):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def launch_costs(repeats: int = 5) -> dict[str, float]:
    """The three figures of the module doc, in microseconds, on the current CUDA device."""
    x = torch.zeros(1, device="cuda")

    def eager() -> None:
        for _ in range(KERNELS):
            x.add_(1)

    eager()  # warm-up before capture
    many, one = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(many):
        eager()
    with torch.cuda.graph(one):
        x.add_(1)

    def replays() -> None:
        for _ in range(KERNELS):
            one.replay()

    per_kernel = {"eager_kernel_us": eager, "graph_kernel_us": many.replay, "graph_replay_us": replays}
    return {key: round(timed(fn, "cuda", repeats) / KERNELS * 1e6, 3) for key, fn in per_kernel.items()}
