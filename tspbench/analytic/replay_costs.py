"""What a replayed trace's events cost (tspbench.analytic.timeline): every compute event priced
on a hardware profile through the price list (tspbench.analytic.prices), and each collective on
the link its ranks cross.

    GEMM          max(FLOPs / GEMM rate, bytes / memory bandwidth)
    attention     FLOPs / the rate measured for its kind and size (a causal square by its side,
                  a query chunk against the keys before it by the chunk)
    element-wise  bytes read and written / memory bandwidth (on CPU: the bandwidth measured for
                  its op name, as calibrate measured it in a profiled step)
    each op       + the profile's per-op overhead (CPU: dispatch; GPU: kernel launch and tail),
                  and the host's time per op outside the kernels (CPU: Python, autograd; GPU: 0,
                  the host runs ahead of the device)
    rank's share  where ranks share a host's cores, each kind at the share calibrate measured
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tspbench.analytic import prices
from tspbench.analytic.hardware import Hardware
from tspbench.core.trace import ATTENTION, CAUSAL, CLASS_NAMES, COMPUTE, ELEMENTWISE, GEMM, RankTrace


@dataclass(frozen=True)
class Costs:
    """What the replay charges: a profile, the ranks sharing each node, the job's world size."""

    hw: Hardware
    world_size: int

    @property
    def ranks_on_node(self) -> int:
        return self.hw.ranks_on_node(self.world_size)

    def collective_seconds(
        self, op: str, ranks: tuple[int, ...], msg_bytes: float
    ) -> tuple[str, float, float]:
        """(link name, latency s, transfer s) of ``op`` over the global ``ranks``: the latency
        overlaps other transfers (collectives issued back to back pipeline it); the transfer
        holds the link."""
        inter = prices.crosses_nodes(ranks, self.hw.gpus_per_node)
        n = len(ranks)
        latency, transfer = prices.collective_seconds(self.hw, op, n, self.world_size, inter, msg_bytes)
        return ("nic" if inter else "node"), latency, transfer


def op_seconds(trace: RankTrace, costs: Costs) -> np.ndarray:
    """Seconds of every compute event of ``trace`` (0 for the rest), at the rank's share: its
    kernel (``kernel_seconds``) and the host's time around it."""
    out = kernel_seconds(trace, costs)
    out[trace.events["kind"] == COMPUTE] += prices.host_overhead_seconds(costs.hw)
    return out


def kernel_seconds(trace: RankTrace, costs: Costs, alone: bool = False) -> np.ndarray:
    """Seconds of every compute event's kernel (0 for views, allocations and other events), at the
    rank's share of its device with every rank of the node computing (``alone``: the whole device)."""
    ev, hw, ranks = trace.events, costs.hw, 1 if alone else costs.ranks_on_node
    share = {c: hw.kind_share(CLASS_NAMES[c], ranks) for c in (GEMM, ATTENTION, ELEMENTWISE)}
    out = np.zeros(len(ev))
    compute = ev["kind"] == COMPUTE
    gemm = compute & (ev["cls"] == GEMM)
    out[gemm] = prices.gemm_seconds(hw, ev["flops"][gemm], ev["nbytes"][gemm])
    elementwise = compute & (ev["cls"] == ELEMENTWISE)
    rates = np.array([prices.elementwise_gbs(hw, n) for n in trace.names] or [1.0])
    out[elementwise] = prices.elementwise_seconds(ev["nbytes"][elementwise], rates[ev["name"][elementwise]])
    attention = compute & (ev["cls"] == ATTENTION)
    for i in np.flatnonzero(attention):
        causal = bool(ev["flags"][i] & CAUSAL)
        out[i] = prices.attention_seconds(hw, ev["flops"][i], causal, int(ev["size"][i]))
    for cls, mask in ((GEMM, gemm), (ATTENTION, attention), (ELEMENTWISE, elementwise)):
        out[mask] = prices.at_share(out[mask], share[cls], prices.kernel_overhead_seconds(hw))
    return out


def kind_seconds(trace: RankTrace, costs: Costs, alone: bool = False) -> dict[str, float]:
    """The trace's kernel seconds by cost class (what the op-level check compares; ``alone``:
    each op on a device of its own)."""
    seconds, ev = kernel_seconds(trace, costs, alone), trace.events
    return {CLASS_NAMES[c]: float(seconds[ev["cls"] == c].sum()) for c in (GEMM, ATTENTION, ELEMENTWISE)}


def by_kind(trace: RankTrace, costs: Costs) -> np.ndarray:
    """Per event, its seconds on a device of its own: [GEMM, attention, element-wise, host]."""
    ev, out = trace.events, np.zeros((len(trace.events), 4))
    alone = kernel_seconds(trace, costs, alone=True)
    for column, cls in enumerate((GEMM, ATTENTION, ELEMENTWISE)):
        out[:, column] = np.where(ev["cls"] == cls, alone, 0.0)
    out[:, 3] = np.where(ev["kind"] == COMPUTE, prices.host_overhead_seconds(costs.hw), 0.0)
    return out
