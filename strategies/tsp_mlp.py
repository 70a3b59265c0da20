"""TSP's MLP weight exchange (``Workload.mlp_exchange``): how rank p gets every MLP shard W_s.

The MLP's math is the same either way (tsp_ring.py's ``_RingMLP``: every rank applies every
shard [3 f/D, h] = [W1_s; W3_s; W2_s^T] to its own tokens and accumulates locally); what differs
is how the shards travel, and so which links carry them:

    ring       the paper's: D-1 ring shifts of the shard in hand to rank p+1 (one link each);
               backward D-1 again, and D shifts of a gradient accumulator riding home behind
    broadcast  step s: shard s broadcast from its owner (as the attention's, tsp_attention.py),
               shard s+1 in flight while shard s's GEMMs run; backward: the shards broadcast
               again and each rank's partial gradient of shard s reduced to its owner s

Per layer and pass, each rank receives D-1 shards either way and holds the same buffers (the
shard in hand, the next in flight; backward also a partial gradient and one in flight). A ring
shift crosses one link; a broadcast or reduce over the group uses every member's links (on a
fully connected node such as MI300X's seven xGMI links, ~7x a shift's bandwidth; on NVSwitch
both get the whole port). The broadcast's cost: step 0 must wait for shard 0 (nothing to hide
it behind), where the ring starts on the shard it owns.

Weights on channel 1 of the tsp group, gradients on channel 0, as the ring's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor
from tspbench.strategies.tsp_attention import Fetch
from tspbench.strategies.tsp_ring import Ring, ShardExchange

from tspbench.dist import comm
from tspbench.dist.comm import Group
from tspbench.strategy import Traffic


@dataclass(frozen=True)
class OwnerBroadcast:
    """Visits shards 0 .. D-1, each broadcast from its owner over ``w_group`` (the next one in
    flight when ``overlap``); backward reduces each partial gradient to its owner over
    ``acc_group``, one reduce in flight while the next shard's gradient is computed."""

    w_group: Group  # tsp, channel 1
    acc_group: Group  # tsp, channel 0
    overlap: bool

    def visit(self, shard: Tensor, fn: Callable[[int, Tensor], None]) -> None:
        """Call fn(s, W_s) for every shard s in owner order."""
        fetch = Fetch(shard, self.w_group, self.overlap)
        for s in range(self.w_group.size):
            fn(s, fetch.get(s))

    def visit_backward(self, shard: Tensor, fn: Callable[[int, Tensor], Tensor]) -> Tensor:
        """fn(s, W_s) returns this rank's partial gradient of shard s; returns the own shard's sum
        (the reduce lands in place on the owner's partial)."""
        fetch, me = Fetch(shard, self.w_group, self.overlap), self.acc_group.rank
        own: Tensor | None = None
        in_flight: tuple[int, Tensor, comm.Pending] | None = None
        for s in range(self.w_group.size):
            partial = fn(s, fetch.get(s))
            if in_flight is not None:
                own = _settle(in_flight, own, me)
            in_flight = (s, partial, comm.reduce(partial, s, self.acc_group, async_op=True))
            if not self.overlap:
                in_flight[2].wait()
        own = _settle(in_flight, own, me)
        assert own is not None  # every rank owns one shard
        return own


def _settle(in_flight: tuple[int, Tensor, comm.Pending], own: Tensor | None, me: int) -> Tensor | None:
    owner, _, pending = in_flight
    result = pending.wait()
    return result if owner == me else own


def mlp_exchange(name: str, w_group: Group, acc_group: Group, overlap: bool) -> ShardExchange:
    """The workload's ``mlp_exchange`` over the tsp group's two channels."""
    return (OwnerBroadcast if name == "broadcast" else Ring)(w_group, acc_group, overlap)


Hides = Callable[..., Traffic]  # TSP's traffic(): hides(op, size, n, window, flops, phase, channel)


def mlp_traffic(
    name: str, d: int, layers: int, shard: int, step: float, hides: Hides
) -> tuple[list[Traffic], list[Traffic]]:
    """The MLP's transfers in a step (forward, backward): ``shard`` bytes, each hidden behind one
    shard's GEMMs (``step`` FLOPs forward, 2x in backward) in the window "mlp shard"; in backward
    a shard's weights and the gradient of the one before share that window's link. The
    broadcast's first shard of each pass has no compute before it (window "mlp first": exposed)."""
    n = (d - 1) * layers
    if name == "ring":
        forward = [hides("send_recv", shard, n, "mlp shard", step, "forward")]
        return forward, [
            hides("send_recv", shard, n, "mlp shard", 2 * step),
            hides("send_recv", shard, d * layers, "mlp shard", 2 * step, channel=0),  # accumulators
        ]
    forward = [
        hides("broadcast", shard, layers, "mlp first", 0.0, "forward"),
        hides("broadcast", shard, n, "mlp shard", step, "forward"),
    ]
    return forward, [
        hides("broadcast", shard, layers, "mlp first", 0.0),
        hides("broadcast", shard, n, "mlp shard", 2 * step),
        hides("reduce", shard, d * layers, "mlp shard", 2 * step, channel=0),  # partials to owners
    ]


def mlp_decode_traffic(name: str, d: int, layers: int, shard: int, hides: Hides) -> list[Traffic]:
    """A decode step's MLP transfers (no gradients): behind the D shards' GEMMs of every layer;
    the broadcast's first shard of each layer behind none."""
    if name == "ring":
        return [hides("send_recv", shard, (d - 1) * layers, "mlp", d * layers)]
    return [
        hides("broadcast", shard, layers, "mlp first", 0),
        hides("broadcast", shard, (d - 1) * layers, "mlp", d * layers),
    ]
