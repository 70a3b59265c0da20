"""TSP attention: the broadcast schedule, forward and a backward that keeps the 1/D memory.

Rank p of D holds tokens x [B, T, h] (T = S/D, zigzag chunks p and 2D-1-p) and one packed
weight shard W_p [R, h], R = 2 q + 2 k rows: [Wq_p (q rows); Wk_p (k); Wv_p (k); Wo_p^T (q)],
with q = n d / D query-head rows and k = m d / D key/value-head rows (heads block p).

Forward, for r = 0 .. D-1 (weights on channel 1, K/V on channel 0 of the tsp group):
    broadcast W_r [R, h] from rank r             (W_{r+1} prefetched while r computes; W_0 by the
                                                  pass before, during its layer's MLP: Prefetch)
    q, k, v = x Wq_r^T, x Wk_r^T, x Wv_r^T         [B, n/D, T, d], [B, m/D, T, d]; RoPE at true positions
    all-gather (k, v) [2, B, m/D, T, d] -> K, V   [B, m/D, S, d] in sequence order
    o = causal attention of local chunks          [B, n/D, T, d]   (bottom-right aligned)
    y += o Wo_r^T                                  [B, T, h]        local accumulation, no all-reduce
Saved for backward: x and the local q, k, v of every head block (together the size of x's q, k, v
projections); never the gathered K/V, never another rank's weights.

Backward, for r = 0 .. D-1:
    broadcast W_r again                            (fetched again rather than kept)
    all-gather (k, v) again; recompute o from q, K, V (the attention core is always recomputed:
        keeping it would keep K/V of every head block)
    do = dy Wo_r;  dq, dK, dV = attention backward  [B, m/D, S, d] for every position
    reduce-scatter (dK, dV) [D, 2, B, m/D, T, d] -> the sequence owners' [2, B, m/D, T, d]
    dx += dq Wq_r + dk Wk_r + dv Wv_r              (RoPE transposed first)
    dW_r partial [R, h] = [dq^T x; dk^T x; dv^T x; o^T dy] -> reduce to owner r (async, one in flight)

Decode (no grad), the same broadcast schedule with a KV cache of every head block at the rank's
positions [B, m, T, d] (m = all key/value heads) and the tail of its slots [b, m, N, d]:
    prefill: per head block r, its k, v of the local tokens written to cache heads block r,
        then attention as in the forward
    step: x [b, 1, h] of the rank's slots; per head block r, q, k, v [b, n/D, 1, d], then the
        sharded-cache attention of tspbench.dist.decode (queries all-gathered over tsp, partials
        all-to-all'd to their owners and merged); y += o Wo_r^T
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tspbench.dist import comm
from tspbench.dist.comm import Group
from tspbench.dist.decode import sharded_decode_attention
from tspbench.dist.zigzag import zigzag_causal_attention, zigzag_stack, zigzag_unshard
from tspbench.model.cache import LayerCache
from tspbench.model.layers import apply_rope


@dataclass(frozen=True)
class AttentionSpec:
    """Sizes and groups of one TSP attention layer (the same for every layer)."""

    q_rows: int  # n d / D
    kv_rows: int  # m d / D
    head_dim: int
    kv_group: Group  # tsp, channel 0: K/V gathers, dK/dV reduce-scatters, weight-gradient reduces
    w_group: Group  # tsp, channel 1: weight broadcasts
    overlap: bool
    prefetch: Prefetch | None = None  # shared by the layers of a model; None: no cross-pass prefetch

    @property
    def rows(self) -> int:
        return 2 * self.q_rows + 2 * self.kv_rows


def _broadcast_shard(shard: Tensor, r: int, group: Group) -> comm.Pending:
    buf = shard if r == group.rank else torch.empty_like(shard)
    return comm.broadcast(buf, r, group, async_op=True)


class Fetch:
    """Broadcast shards W_r from their owners, one ahead of use when ``overlap``; W_0 may come
    already in flight (``first``, issued by the pass before)."""

    def __init__(self, shard: Tensor, group: Group, overlap: bool, first: comm.Pending | None = None) -> None:
        self.shard, self.group, self.overlap = shard, group, overlap
        self.pending = first

    def get(self, r: int) -> Tensor:
        pending = self.pending if self.pending is not None else _broadcast_shard(self.shard, r, self.group)
        self.pending = None
        if not self.overlap:
            return pending.wait()
        if r + 1 < self.group.size:
            self.pending = _broadcast_shard(self.shard, r + 1, self.group)
        return pending.wait()


class Prefetch:
    """Each attention pass ends by issuing the first broadcast (W_0 [R, h]) of the pass after it,
    so that broadcast runs under the MLP between them instead of before any compute.

    A step's passes: forward 0 .. L-1, then backward L-1 .. 0, each backward preceded by the
    recompute of its forward under ``full``. After layer l's pass the next one is therefore
    forward: l+1, or for the last layer l itself when a backward follows; a recompute (a forward
    once the backward has begun): l; backward: l-1 (its recompute or its backward, both starting
    with W_0 of layer l-1); after backward 0: none. A pass that finds another layer's shard in
    flight (passes run in an order this does not expect) waits it out and fetches its own.
    """

    def __init__(self, group: Group) -> None:
        self.group = group
        self.layers: list[TSPAttention] = []
        self.in_backward = False
        self.pending: tuple[int, comm.Pending] | None = None

    def take(self, layer: int) -> comm.Pending | None:
        held, self.pending = self.pending, None
        if held is None:
            return None
        owner, pending = held
        if owner == layer:
            return pending
        pending.wait()  # another layer's shard: let it land, then fetch our own
        return None

    def after(self, layer: int, backward_follows: bool, backward: bool = False) -> None:
        if backward:
            self.in_backward = layer > 0
            nxt = layer - 1 if layer > 0 else None
        elif self.in_backward or layer + 1 == len(self.layers):
            nxt = layer if backward_follows else None
        else:
            nxt = layer + 1
        if nxt is not None:
            self.pending = (nxt, _broadcast_shard(self.layers[nxt].shard.detach(), 0, self.group))


def _split(w: Tensor, q_rows: int, kv_rows: int) -> list[Tensor]:
    return list(w.split([q_rows, kv_rows, kv_rows, q_rows], dim=0))


def _heads(t: Tensor, head_dim: int) -> Tensor:
    """[B, T, rows] -> [B, rows / d, T, d]."""
    return t.view(*t.shape[:2], -1, head_dim).transpose(1, 2)


def _flat(t: Tensor) -> Tensor:
    """[B, heads, T, d] -> [B, T, heads d]."""
    return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1)


def _gather_kv(k: Tensor, v: Tensor, group: Group) -> tuple[Tensor, Tensor]:
    stacked = comm.all_gather(torch.stack([k, v]), group)  # [D, 2, B, m, T, d]
    full = zigzag_unshard(stacked, dim=3)  # [2, B, m, S, d]
    return full[0], full[1]


class _BroadcastAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x: Tensor, shard: Tensor, cos: Tensor, sin: Tensor, spec: AttentionSpec, keep: bool, layer: int
    ) -> Tensor:
        kv_group, d = spec.kv_group, spec.head_dim
        fetch = Fetch(shard.detach(), spec.w_group, spec.overlap, _take(spec, layer))
        y = torch.zeros_like(x)
        saved = []
        for r in range(kv_group.size):
            wq, wk, wv, wo_t = _split(fetch.get(r), spec.q_rows, spec.kv_rows)
            q = apply_rope(_heads(x @ wq.t(), d), cos, sin)
            k = apply_rope(_heads(x @ wk.t(), d), cos, sin)
            v = _heads(x @ wv.t(), d)
            keys, values = _gather_kv(k, v, kv_group)
            o = zigzag_causal_attention(q, keys, values, kv_group.size, kv_group.rank)
            del keys, values
            y.view(-1, y.shape[-1]).addmm_(_flat(o).flatten(0, 1), wo_t)
            saved += [q, k, v] if keep else []
        if spec.prefetch is not None:
            spec.prefetch.after(layer, backward_follows=keep)
        ctx.save_for_backward(x, cos, sin, shard, *saved)
        ctx.spec, ctx.layer = spec, layer
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, cos, sin, shard, *saved = ctx.saved_tensors
        spec: AttentionSpec = ctx.spec
        kv_group, d = spec.kv_group, spec.head_dim
        parts, me = kv_group.size, kv_group.rank
        fetch = Fetch(shard.detach(), spec.w_group, spec.overlap, _take(spec, ctx.layer))
        dx = torch.zeros_like(x)
        x2, dy2 = x.flatten(0, 1), dy.flatten(0, 1)
        own_grad, in_flight = None, None
        for r in range(parts):
            wq, wk, wv, wo_t = _split(fetch.get(r), spec.q_rows, spec.kv_rows)
            q, k, v = saved[3 * r : 3 * r + 3]
            keys, values = _gather_kv(k, v, kv_group)
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_() for t in (q, keys, values)]
                o = zigzag_causal_attention(*leaves, parts, me)
                do = _heads(dy @ wo_t.t(), d)
                dq, dkeys, dvalues = torch.autograd.grad(o, leaves, do)
            o_flat = _flat(o.detach())
            del keys, values, leaves
            stacked = zigzag_stack(torch.stack([dkeys, dvalues]), parts, dim=3)  # [D, 2, B, m, T, d]
            del dkeys, dvalues
            dk, dv = comm.reduce_scatter(stacked, kv_group)
            del stacked
            dq, dk = apply_rope(dq, cos, -sin), apply_rope(dk, cos, -sin)
            dq, dk, dv = _flat(dq), _flat(dk), _flat(dv)
            dx2 = dx.view(-1, dx.shape[-1])
            for grad, w in ((dq, wq), (dk, wk), (dv, wv)):
                dx2.addmm_(grad.flatten(0, 1), w)
            grads = [g.flatten(0, 1).t() @ x2 for g in (dq, dk, dv)]
            partial = torch.cat([*grads, o_flat.flatten(0, 1).t() @ dy2])
            if in_flight is not None:
                own_grad = _settle(in_flight, own_grad, me)
            in_flight = (r, comm.reduce(partial, r, kv_group, async_op=True))
            if not spec.overlap:
                in_flight[1].wait()
        if spec.prefetch is not None:
            spec.prefetch.after(ctx.layer, backward_follows=True, backward=True)
        own_grad = _settle(in_flight, own_grad, me)
        return dx, own_grad, None, None, None, None, None


def _take(spec: AttentionSpec, layer: int) -> comm.Pending | None:
    return spec.prefetch.take(layer) if spec.prefetch is not None else None


def _settle(in_flight: tuple[int, comm.Pending], own_grad: Tensor | None, me: int) -> Tensor | None:
    owner, pending = in_flight
    result = pending.wait()
    return result if owner == me else own_grad


class TSPAttention(nn.Module):
    """One packed shard W_p [R, h] of an attention layer; forward runs the broadcast schedule."""

    def __init__(self, rows: int, hidden: int, spec: AttentionSpec) -> None:
        super().__init__()
        self.shard = nn.Parameter(torch.empty(rows, hidden))
        self.spec = spec
        self.layer = 0
        if spec.prefetch is not None:  # the model's layers in order, for the pass after this one
            self.layer = len(spec.prefetch.layers)
            spec.prefetch.layers.append(self)

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor], cache: LayerCache | None = None, step: int | None = None
    ) -> Tensor:
        if cache is not None:
            shard = self.shard.detach()
            return cached_broadcast_attention(x, shard, rope, self.spec, cache, step, self.layer)
        # Function.forward runs with grad disabled; pass whether a backward will follow (prefill: no).
        return _BroadcastAttention.apply(x, self.shard, *rope, self.spec, torch.is_grad_enabled(), self.layer)


@torch.no_grad()
def cached_broadcast_attention(
    x: Tensor,
    shard: Tensor,
    rope: tuple[Tensor, Tensor],
    spec: AttentionSpec,
    cache: LayerCache,
    step: int | None,
    layer: int = 0,
) -> Tensor:
    """Decode's broadcast schedule (module doc): the prefill (``step`` None) fills the cache of
    every head block; a step attends the slots' new tokens through the sharded cache."""
    kv_group, d = spec.kv_group, spec.head_dim
    block_heads = spec.kv_rows // d
    fetch = Fetch(shard, spec.w_group, spec.overlap, _take(spec, layer))
    y = torch.zeros_like(x)
    for r in range(kv_group.size):
        wq, wk, wv, wo_t = _split(fetch.get(r), spec.q_rows, spec.kv_rows)
        q = apply_rope(_heads(x @ wq.t(), d), *rope)
        k = apply_rope(_heads(x @ wk.t(), d), *rope)
        v = _heads(x @ wv.t(), d)
        block = cache.heads(r * block_heads, (r + 1) * block_heads)
        if step is None:
            block.write_context(k, v)
            keys, values = _gather_kv(k, v, kv_group)
            o = zigzag_causal_attention(q, keys, values, kv_group.size, kv_group.rank)
            del keys, values  # before the next head block's gather, as in training's forward
        else:
            o = sharded_decode_attention(q, k, v, block, step, kv_group)
        y.view(-1, y.shape[-1]).addmm_(_flat(o).flatten(0, 1), wo_t)
    if spec.prefetch is not None:
        spec.prefetch.after(layer, backward_follows=False)
    return y
