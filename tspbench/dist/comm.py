"""Every collective a strategy uses, in one place, each call counted.

A call on a group of one rank is a no-op and is not counted. Otherwise it adds one CommRecord
to the active CommLog: the op, the phase it ran in, the group (its mesh axes and channel, e.g.
``tsp#1``), its size n and the message size in bytes as nccl-tests defines it (the table of
message and bus bytes per op is in tspbench.dist.comm_log, with ``counting`` and ``phase``).

Primitives take and return plain tensors (``async_op=True`` returns a Pending whose ``wait()``
gives the result); each takes the one path of tspbench.dist.comm_issue (count, trace, simulate,
stage, start). Autograd pairs below them (after Megatron-LM's mappings) carry gradients through
a collective; each docstring names its forward/backward pair and shapes.

This module is the public face of the three: the counting and issuing names are re-exported
here, so callers write ``comm.counting()``, ``comm.phase("backward")``, ``comm.Group``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.distributed as dist
from torch import Tensor

from tspbench.core.bus import BUS_FACTOR
from tspbench.dist.comm_issue import (
    Group,
    Pending,
    issue,
    issued_here,
    set_tracer,
    simulate,
    solo,
    staging,
    tensor_bytes,
)
from tspbench.dist.comm_log import CommLog, CommRecord, counting, current_phase, phase, summarize

__all__ = [
    "BUS_FACTOR", "CommLog", "CommRecord", "Group", "Pending", "all_gather", "all_reduce",
    "all_to_all", "barrier", "broadcast", "copy_to_group", "counting", "current_phase",
    "exchange_heads", "exchange_partials", "gather_from_group", "gather_identity", "gather_queries",
    "issued_here", "pass_kv", "pass_kv_grads", "phase", "reduce", "reduce_from_group",
    "reduce_scatter", "reduce_scatter_to_group", "replay", "ring_shift", "set_tracer", "simulate",
    "staging", "summarize",
]  # fmt: skip

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


# ----------------------------------------------------------------------------- primitives


def all_reduce(x: Tensor, group: Group, op: str = "sum", async_op: bool = False):
    """In place on x [any]: the elementwise reduction over the group."""
    if group.size == 1:
        return solo(lambda: x, async_op)
    start = partial(dist.all_reduce, op=_REDUCE_OPS[op], group=group.pg, async_op=True)
    return issue("all_reduce", group, tensor_bytes(x), start, (x,), lambda: x, async_op)


def all_gather(x: Tensor, group: Group, dim: int | None = None, async_op: bool = False):
    """x [*] -> [n, *] stacked in group order (dim=None), or concatenated along ``dim``."""
    if group.size == 1:
        return solo(lambda: x.unsqueeze(0) if dim is None else x, async_op)
    x = x.contiguous()
    stacked = x.new_empty((group.size, *x.shape))
    # torch 2.13 deprecates all_gather_into_tensor (a FutureWarning each call) for all_gather_single;
    # older torch (the GPU box runs 2.11) has only the old name. Same for reduce_scatter below.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    start = partial(gather, group=group.pg, async_op=True)

    def result() -> Tensor:
        return stacked if dim is None else torch.cat(stacked.unbind(0), dim=dim)

    def simulated() -> None:
        stacked.copy_(x.unsqueeze(0).expand_as(stacked))

    operands = (stacked.view(-1), x.view(-1))
    return issue("all_gather", group, tensor_bytes(stacked), start, operands, result, async_op, simulated)


def reduce_scatter(x: Tensor, group: Group, dim: int | None = None, async_op: bool = False):
    """Sum over the group, each rank keeping its slice.

    x [n, *] -> [*] (dim=None), or x [.., n s, ..] -> [.., s, ..] along ``dim``.
    """
    n = group.size
    if n == 1:
        return solo(lambda: x[0] if dim is None else x, async_op)
    stacked = (x if dim is None else torch.stack(x.chunk(n, dim=dim), dim=0)).contiguous()
    out = stacked.new_empty(stacked.shape[1:])
    # reduce_scatter_single is 2.13's name; reduce_scatter_tensor the older one (see all_gather).
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    start = partial(scatter, group=group.pg, async_op=True)

    def simulated() -> None:
        out.copy_(stacked[group.rank])

    operands, nbytes = (out.view(-1), stacked.view(-1)), tensor_bytes(stacked)
    return issue("reduce_scatter", group, nbytes, start, operands, lambda: out, async_op, simulated)


def broadcast(x: Tensor, src: int, group: Group, async_op: bool = False):
    """In place on x [any]: every rank gets the value held by group member ``src``."""
    if group.size == 1:
        return solo(lambda: x, async_op)
    start = partial(dist.broadcast, src=group.global_rank(src), group=group.pg, async_op=True)
    return issue("broadcast", group, tensor_bytes(x), start, (x,), lambda: x, async_op)


def reduce(x: Tensor, dst: int, group: Group, async_op: bool = False):
    """Sum of x [any] over the group, in place on group member ``dst`` (others' x is undefined after)."""
    if group.size == 1:
        return solo(lambda: x, async_op)
    start = partial(dist.reduce, dst=group.global_rank(dst), group=group.pg, async_op=True)
    return issue("reduce", group, tensor_bytes(x), start, (x,), lambda: x, async_op)


def all_to_all(x: Tensor, group: Group, async_op: bool = False):
    """x [n, *] -> [n, *]: slice i goes to member i; slice j of the result came from member j."""
    if group.size == 1:
        return solo(lambda: x, async_op)
    x = x.contiguous()
    out = torch.empty_like(x)
    start = partial(dist.all_to_all_single, group=group.pg, async_op=True)
    return issue(
        "all_to_all", group, tensor_bytes(x), start, (out, x), lambda: out, async_op, lambda: out.copy_(x)
    )


def ring_shift(x: Tensor, group: Group, async_op: bool = False):
    """Send x [any] to the next member and receive the previous member's [same shape].

    A plain isend and irecv, not ``batch_isend_irecv``, which refuses fake tensors. Even members
    send first and odd ones receive first, so where both directions of one pair share a stream
    (two members, NCCL) each send meets a posted receive.
    """
    if group.size == 1:
        return solo(lambda: x, async_op)
    x = x.contiguous()
    out = torch.empty_like(x)

    def start(sent: Tensor, received: Tensor) -> list[dist.Work]:
        send = partial(dist.isend, sent, group.next, group.pg)
        recv = partial(dist.irecv, received, group.prev, group.pg)
        first, second = (send, recv) if group.rank % 2 == 0 else (recv, send)
        return [first(), second()]

    return issue(
        "send_recv",
        group,
        tensor_bytes(x),
        start,
        (x, out),
        lambda: out,
        async_op,
        lambda: out.copy_(x),
        (1,),
    )


def replay(records: Sequence[CommRecord], resolve: Callable[[str], Group]) -> None:
    """Issue the recorded collectives again, blocking, in order, on scratch buffers of their sizes.

    Every rank must replay the same records. The comm-only bound of a step: its data movement
    with no compute to hide behind.
    """
    for r in records:
        group = resolve(r.group)
        for _ in range(r.count):
            msg = r.msg_bytes
            if r.op == "all_gather":
                all_gather(torch.empty(msg // group.size, dtype=torch.uint8), group)
            elif r.op in ("reduce_scatter", "all_to_all"):
                buf = torch.empty(group.size, msg // group.size, dtype=torch.uint8)
                (reduce_scatter if r.op == "reduce_scatter" else all_to_all)(buf, group)
            elif r.op == "send_recv":
                ring_shift(torch.empty(msg, dtype=torch.uint8), group)
            elif r.op == "broadcast":
                broadcast(torch.empty(msg, dtype=torch.uint8), 0, group)
            elif r.op == "reduce":
                reduce(torch.empty(msg, dtype=torch.uint8), 0, group)
            else:
                all_reduce(torch.empty(msg, dtype=torch.uint8), group)


# ----------------------------------------------------------------------------- ring attention


def pass_kv(kv: Tensor, group: Group, async_op: bool = False):
    """Ring attention (tspbench.dist.ring): this member's K/V chunk to the next, the previous one's in.

    kv [2, B, m, 2C, d] (K and V stacked: one message of 2 B m 2C d elements) -> the same shape.
    Forward: D - 1 calls per layer, each posted before the block that uses the chunk in hand so
    the transfer runs under it. Backward (RingAttention's own, not autograd's): K/V are sent
    round again (D - 1 calls) rather than kept for every step, beside ``pass_kv_grads``.
    """
    return ring_shift(kv, group, async_op)


def pass_kv_grads(dkv: Tensor, group: Group, async_op: bool = False):
    """Ring attention's backward: the dK/dV accumulator of the visiting chunk to the next member.

    dkv [2, B, m, 2C, d] in the accumulation dtype (float32 at least: bfloat16 runs send twice
    the K/V bytes) -> the same. D calls per layer: after D - 1 hops every member has added its
    part, and the last hop brings each chunk's complete gradient home to its owner.
    """
    return ring_shift(dkv, group, async_op)


# ----------------------------------------------------------------------------- decode (no autograd)


def gather_queries(q: Tensor, group: Group) -> Tensor:
    """Decode over a sequence-sharded cache: every member's new-token queries.

    q [b, n, 1, d] (this member's b slots) -> [P, b, n, 1, d] in group order. One all-gather,
    message P b n d x element size (the gathered output). Decode runs under no_grad: no backward.
    """
    return all_gather(q, group)


def exchange_partials(partials: Tensor, group: Group) -> Tensor:
    """Decode over a sequence-sharded cache: send each slot owner the partial attentions of its slots.

    partials [P, b, n, 1, d + 1] (slice i: this member's partial o and log-sum-exp for member
    i's slots, float32, float64 in float64 runs) -> [P, b, n, 1, d + 1] (slice j: member j's
    partials of this member's slots). One all-to-all of the buffer. No backward.
    """
    return all_to_all(partials, group)


def barrier(group: Group) -> None:
    """Not counted: a synchronisation point for timing, not data movement."""
    if group.size > 1:
        dist.barrier(group=group.pg)


# ----------------------------------------------------------------------------- autograd pairs


class _Conjugate(torch.autograd.Function):
    """Forward ``op(x, group, dim)``, backward ``grad_op(dy, group, dim)``: the one Function behind
    every pair below, whose docstrings name the two collectives and the shapes."""

    @staticmethod
    def forward(ctx, x: Tensor, group: Group, dim: int | None, op: Callable, grad_op: Callable) -> Tensor:
        ctx.group, ctx.dim, ctx.grad_op = group, dim, grad_op
        return op(x, group, dim)

    @staticmethod
    def backward(ctx, dy: Tensor):
        return ctx.grad_op(dy, ctx.group, ctx.dim), None, None, None, None


def _identity(x: Tensor, group: Group, dim: int | None) -> Tensor:
    return x


def _sum(x: Tensor, group: Group, dim: int | None) -> Tensor:
    return all_reduce(x.contiguous(), group)


def copy_to_group(x: Tensor, group: Group) -> Tensor:
    """Forward identity, backward all-reduce. x [*] -> [*]. Megatron's ``f`` (column-parallel input)."""
    return x if group.size == 1 else _Conjugate.apply(x, group, None, _identity, _sum)


def reduce_from_group(x: Tensor, group: Group) -> Tensor:
    """Forward all-reduce, backward identity. x [*] -> [*]. Megatron's ``g`` (row-parallel output)."""
    return x if group.size == 1 else _Conjugate.apply(x, group, None, _sum, _identity)


def gather_from_group(x: Tensor, group: Group, dim: int | None = None) -> Tensor:
    """Forward all-gather, backward reduce-scatter.

    dim=None: x [*] -> [n, *] (stacked); else x [.., s, ..] -> [.., n s, ..] along ``dim``.
    Sequence-parallel K/V exchange and Megatron-SP column-parallel inputs.
    """
    if group.size == 1:
        return gather_identity(x, dim)
    return _Conjugate.apply(x, group, dim, all_gather, reduce_scatter)


def reduce_scatter_to_group(x: Tensor, group: Group, dim: int | None = None) -> Tensor:
    """Forward reduce-scatter, backward all-gather.

    dim=None: x [n, *] -> [*]; else x [.., n s, ..] -> [.., s, ..] along ``dim``.
    Megatron-SP row-parallel outputs.
    """
    if group.size == 1:
        return x[0] if dim is None else x
    return _Conjugate.apply(x, group, dim, reduce_scatter, all_gather)


def _swap(x: Tensor, group: Group, dim: int | None) -> Tensor:
    return all_to_all(x, group)


def exchange_heads(x: Tensor, group: Group) -> Tensor:
    """Forward all-to-all, backward all-to-all (its own inverse). x [n, *] -> [n, *].

    Ulysses (tspbench.dist.ulysses): slice i of x is what member i needs (its heads of this
    member's tokens, or this member's heads of its tokens); slice j of the result came from
    member j. The gradient of slice j goes back to member j by the same exchange.
    Sequence -> head shards: [n, B, H/n, S/n, d] out, every member's tokens of my heads in;
    head -> sequence shards after attention: the reverse.
    """
    if group.size == 1:
        return x
    return _Conjugate.apply(x, group, None, _swap, _swap)


def gather_identity(x: Tensor, dim: int | None) -> Tensor:
    return x.unsqueeze(0) if dim is None else x
