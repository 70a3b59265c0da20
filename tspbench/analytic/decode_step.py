"""One decode step's time on one rank, the N steps of a run, and the batch from which a
strategy's weight traffic hides (tspbench.analytic.decode puts them together). Every price comes
from tspbench.analytic.prices; every collective from the strategy's ``decode_traffic``.

    compute     GEMMs max(FLOPs / gemm rate, weight bytes read / HBM bandwidth): a decode GEMM
                reads its whole weight matrix for a handful of rows, so below rows* = gemm rate
                x elt / (2 x HBM bandwidth) it is bandwidth-bound; attention max(FLOPs /
                attention rate, K/V bytes read / HBM bandwidth); element-wise 4 passes over the
                step's [rows, h] and [rows, ffn] tensors per layer
    traffic     each call at latency + bus bytes / bandwidth of its link (as timing.py):
                exposed          on the critical path
                hidden           behind the step's compute (FSDP's block gathers):
                                 what still costs time is prices.hidden_exposed
                hidden, window   behind the GEMMs of its window (TSP: the shard in hand), run
                                 window_count times, each reading the window's largest message
                                 (the shard): per window max(GEMMs, eta x transfers) + (1 - eta)
                                 x transfers; a window without FLOPs (TSP's embedding ring:
                                 lookups) hides nothing
    waits       on peers, where ranks share a host's cores (timing.sync_seconds)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tspbench.analytic import prices
from tspbench.analytic.hardware import Hardware
from tspbench.analytic.timing import call_seconds, comm_seconds, ranks_per_node, sync_seconds
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.costs.decode import DecodeShape, decode_elementwise_bytes, decode_flops, decode_kernels
from tspbench.dist.mesh import Mesh
from tspbench.strategy import Traffic, get_strategy


@dataclass(frozen=True)
class DecodeStepTime:
    """Seconds of one decode step on one rank, by what they are spent on."""

    gemm_s: float
    attention_s: float
    elementwise_s: float
    comm_exposed_s: float  # on the critical path, including overlapped traffic compute could not hide
    comm_hidden_s: float  # traffic that ran under compute
    launch_s: float = 0.0  # the step's kernels replayed as a CUDA graph (prices.graph_launch_seconds)

    @property
    def step_s(self) -> float:
        return self.gemm_s + self.attention_s + self.elementwise_s + self.comm_exposed_s + self.launch_s


def compute_seconds(
    hw: Hardware,
    ranks_on_node: int,
    gemm: float,
    weight_bytes: float,
    attention: float,
    cache_bytes: float,
    elementwise_bytes: float,
) -> tuple[float, float, float]:
    """(GEMM, attention, element-wise) seconds of a decode step at the rank's share of its
    device: GEMMs at the achievable rate reading their weights, attention a rectangle (one query
    against the keys) reading its K/V, each bound by HBM where that takes longer."""
    share = hw.share(ranks_on_node)
    gemm_s = prices.at_share(prices.gemm_seconds(hw, gemm, weight_bytes, decode=True), share)
    attention_s = prices.attention_seconds(hw, attention, False, nbytes=cache_bytes)
    elementwise_s = prices.elementwise_seconds(elementwise_bytes, prices.elementwise_gbs(hw))
    return (
        gemm_s,
        prices.at_share(attention_s, hw.attention_share(ranks_on_node)),
        prices.at_share(elementwise_s, share),
    )


def windows(traffic: list[Traffic], mesh: Mesh) -> dict[str, list[Traffic]]:
    """The hidden calls that name a window, by window, over groups of more than one rank."""
    out: dict[str, list[Traffic]] = {}
    for t in traffic:
        if t.hidden and t.window and t.count and mesh.size(*t.axes) > 1:
            out.setdefault(t.window, []).append(t)
    return out


def window_gemm_seconds(calls: list[Traffic], hw: Hardware, share: float) -> float:
    """One run of a window's GEMMs: its FLOPs reading the largest of its messages (the shard)."""
    flops = max(t.window_flops or 0.0 for t in calls)
    if not flops:
        return 0.0
    nbytes = max(t.msg_bytes for t in calls)
    return prices.at_share(prices.gemm_seconds(hw, flops, nbytes, decode=True), share)


def window_spans(traffic: list[Traffic], mesh: Mesh, hw: Hardware, share: float) -> list[tuple[float, float]]:
    """(GEMM seconds, transfer seconds) of each window of one step."""
    out = []
    for calls in windows(traffic, mesh).values():
        runs = max(t.window_count or t.count for t in calls)
        out.append(
            (
                runs * window_gemm_seconds(calls, hw, share),
                sum(t.count * call_seconds(mesh, t, hw) for t in calls),
            )
        )
    return out


def step_time(
    cfg: ModelConfig, s: DecodeShape, hw: Hardware, ranks: int, mesh: Mesh, traffic: list[Traffic], step: int
) -> DecodeStepTime:
    """Step ``step``'s time on one rank (see the module docstring)."""
    f = decode_flops(cfg, s, step)
    ew_bytes = decode_elementwise_bytes(cfg, s)
    gemm, attention, elementwise = compute_seconds(
        hw, ranks, f.gemm, f.weight_bytes, f.attention, f.cache_bytes, ew_bytes
    )
    compute, eta = gemm + attention + elementwise, hw.overlap_efficiency
    windowed = windows(traffic, mesh)
    exposed, hidden = comm_seconds(mesh, [t for t in traffic if not (t.window in windowed and t.hidden)], hw)
    exposed += sync_seconds(mesh, traffic, hw, compute)
    spans = window_spans(traffic, mesh, hw, hw.share(ranks))
    hidden_cost = prices.hidden_exposed(compute, hidden, eta) + sum(
        prices.hidden_exposed(c, h, eta) for c, h in spans
    )
    hidden += sum(h for _, h in spans)
    launch = prices.graph_launch_seconds(hw, decode_kernels(cfg))
    return DecodeStepTime(gemm, attention, elementwise, exposed + hidden_cost, hidden - hidden_cost, launch)


class DecodeSteps(Sequence[DecodeStepTime]):
    """The N steps of a decode, each priced when first asked for: the record and the planner
    need a handful of them (the percentiles' neighbours and the middle one), never all N, so a
    prediction takes the same time for a billion tokens as for one.

    A step's time never falls as its keys grow (attention reads more, and what it feeds - the
    overlap, a wait on peers - grows with compute) where the profile's waits on peers grow,
    or shrink by less than the compute that precedes them (``sync_us``'s slopes >= -1): then
    the steps are already in order and a percentile is numpy's linear one between two of them.
    Otherwise every step is priced and sorted, as numpy does."""

    def __init__(self, price: Callable[[int], DecodeStepTime], n: int, ordered: bool) -> None:
        self.price, self.n, self.ordered = price, n, ordered
        self.priced: dict[int, DecodeStepTime] = {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self.n))]
        if not -self.n <= k < self.n:
            raise IndexError(f"step {k} of {self.n}")
        k %= self.n
        if k not in self.priced:
            self.priced[k] = self.price(k)
        return self.priced[k]

    def percentile(self, q: float) -> float:
        """numpy.percentile (linear) of the steps' times."""
        if not self.ordered:
            return float(np.percentile([s.step_s for s in self], q))
        virtual = (self.n - 1) * (q / 100)
        lo = math.floor(virtual)
        t = virtual - lo
        a, b = self[lo].step_s, self[min(lo + 1, self.n - 1)].step_s
        return float(b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t)


def steps_ordered(hw: Hardware) -> bool:
    """Whether a later decode step never costs less (see DecodeSteps): every wait-on-peers table
    falls by less than the compute before it grows."""
    for table in hw.sync_us.values():
        rows = sorted({0.0: 0.0, **table}.items())
        if any((w1 - w0) < -(c1 - c0) for (c0, w0), (c1, w1) in itertools.pairwise(rows)):
            return False
    return True


# ----------------------------------------------------------------------------- break-even


def break_even_batch(
    cfg: ModelConfig, layout: Layout, dtype: str, hw: Hardware, limit: int = 1 << 24
) -> dict[str, int]:
    """The smallest B (a multiple of P: whole slots) from which one run of each block's window of
    GEMMs lasts at least eta x one of its calls (TSP: a shard's GEMMs against the broadcast, or
    ring shift, of the next one), by window; "batch" is the largest: beyond it every block's
    weight traffic is hidden. ``limit`` slots where even that many rows do not (a link faster
    than HBM). Empty for a strategy without such windows."""
    cls = get_strategy(layout.strategy)
    parts = layout.degree(cls.sequence_axis) if cls.sequence_axis else 1
    share, eta = hw.share(ranks_per_node(layout, hw)), hw.overlap_efficiency

    def block_windows(slots: int) -> tuple[Mesh, dict[str, list[Traffic]]]:
        workload = Workload(cfg, parts * slots, 2 * parts, "decode", dtype=dtype, decode_tokens=1)
        sized = cls.for_analysis(layout, workload)
        found = windows(sized.decode_traffic(), sized.mesh)
        return sized.mesh, {w: calls for w, calls in found.items() if all(t.scope == "block" for t in calls)}

    def hidden(slots: int, window: str) -> bool:
        mesh, found = block_windows(slots)
        call = max(call_seconds(mesh, t, hw) for t in found[window])
        return prices.fully_hidden(window_gemm_seconds(found[window], hw, share), call, eta)

    out = {w: parts * _smallest(lambda b, w=w: hidden(b, w), limit) for w in block_windows(1)[1]}
    return {**out, "batch": max(out.values())} if out else {}


def _smallest(ok, limit: int) -> int:
    """The smallest n >= 1 with ok(n), for a monotone ok; ``limit`` when none up to it is."""
    hi = 1
    while not ok(hi):
        if hi >= limit:
            return limit
        hi *= 2
    lo = hi // 2  # ok(hi), not ok(lo) (or lo == 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi
