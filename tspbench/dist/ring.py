"""Ring attention over zigzag shards: K/V chunks passed around the sequence group, never gathered.

Megatron's context parallelism and ring-flash-attention's zigzag variant, written for this
model's hooks. Rank r of D holds tokens [B, 2C] (chunks r and 2D-1-r, tspbench.dist.zigzag),
q [B, n, 2C, d], k, v [B, m, 2C, d]. At step i it holds the K/V of rank j = (r - i) mod D:

    step 0      its own chunks: one causal square [2C x 2C] (local order is position order)
    j < r       all local queries against the visiting first chunk (j < r < 2D-1-r): [2C x C]
    j > r       the local tail chunk (2D-1-r) against both visiting chunks: [C x 2C]

so every step after the first is 2C^2 scores on every rank (no idle step). Each partial is
merged into the running (o, lse) by log-sum-exp (tspbench.model.attention.merge_pair), in
float32 at least. The next chunk's transfer (comm.pass_kv) is posted before the block that
uses the chunk in hand, so it runs under it.

Backward (the ring-attention identity: with the final o and lse every block's backward is
exact): K/V go round again (D - 1 passes, not kept for every step) and a dK/dV accumulator rides
with each chunk, one hop behind (comm.pass_kv_grads, D passes: the last brings it home); dQ
accumulates locally. Saved per layer: q, k, v (the local chunks), o and lse, like one flash call.
A rank never holds more than two K/V chunks (the one in hand and the one arriving).
Grouped K/V travel with their m heads and are repeated to the n query heads only per block.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tspbench.dist import comm
from tspbench.dist.comm import Group
from tspbench.model.attention import FlashKernels, kernels_for, merge_pair, repeat_kv, upcast
from tspbench.model.layers import causal_attention


def _math_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, Tensor, tuple]:
    """Where no flash kernel applies (kernels_for None): o [B, n, Sq, d], lse [B, n, Sq]."""
    scores = _scores(q, k, causal)
    lse = scores.logsumexp(dim=-1)
    o = (scores - lse.unsqueeze(-1)).exp().to(v.dtype) @ v
    return o, lse, ()


def _math_backward(dout, q, k, v, o, lse, causal: bool, saved: tuple) -> tuple[Tensor, ...]:
    """A block's dq, dk, dv given the final o and lse (softmax normalised globally)."""
    scale = q.shape[-1] ** -0.5
    p = (_scores(q, k, causal) - lse.unsqueeze(-1)).exp()
    dp = upcast(dout @ v.transpose(-1, -2))
    ds = p * (dp - (upcast(dout) * upcast(o)).sum(-1, keepdim=True))
    ds = ds.to(q.dtype)
    return (ds @ k) * scale, (ds.transpose(-1, -2) @ q) * scale, p.to(v.dtype).transpose(-1, -2) @ dout


def _scores(q: Tensor, k: Tensor, causal: bool) -> Tensor:
    scores = upcast(q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return scores


MATH = FlashKernels("math", _math_forward, _math_backward)


def _fold(grad: Tensor, kv_heads: int) -> Tensor:
    """dK or dV [B, n, S, d] of repeated heads summed back to [B, m, S, d] (query head i used i // g)."""
    B, n, S, d = grad.shape
    return grad if n == kv_heads else grad.view(B, kv_heads, n // kv_heads, S, d).sum(2)


def _source(rank: int, step: int, parts: int) -> int:
    return (rank - step) % parts


def _forward_steps(q: Tensor, kv: Tensor, group: Group, kernels: FlashKernels):
    """(o float32 at least, lse, each step's kernel state): the module doc's steps, merged."""
    parts, rank, c, heads = group.size, group.rank, q.shape[2] // 2, q.shape[1]
    o, lse, state = kernels.forward(q, repeat_kv(kv[0], heads), repeat_kv(kv[1], heads), True)
    o, states = upcast(o), [state]
    pending = comm.pass_kv(kv, group, async_op=True)
    for step in range(1, parts):
        kv = pending.wait()
        if step < parts - 1:
            pending = comm.pass_kv(kv, group, async_op=True)
        k, v = repeat_kv(kv[0], heads), repeat_kv(kv[1], heads)
        if _source(rank, step, parts) < rank:
            oi, li, state = kernels.forward(q, k[:, :, :c], v[:, :, :c], False)
            o, lse = merge_pair(o, lse, oi, li)
        else:
            oi, li, state = kernels.forward(q[:, :, c:], k, v, False)
            tail, tail_lse = merge_pair(o[:, :, c:], lse[..., c:], oi, li)
            o, lse = torch.cat([o[:, :, :c], tail], dim=2), torch.cat([lse[..., :c], tail_lse], dim=-1)
        states.append(state)
    return o, lse, states


def _backward_steps(dout, q, kv, out, lse, group: Group, kernels: FlashKernels, states: list):
    """dq, dk, dv of the local chunks (module doc: K/V round again, dK/dV one hop behind)."""
    parts, rank, c, heads, m = group.size, group.rank, q.shape[2] // 2, q.shape[1], kv.shape[2]
    rep = [repeat_kv(t, heads) for t in kv]
    dq, dk, dv = kernels.backward(dout, q, rep[0], rep[1], out, lse, True, states[0])
    dq, dkv = upcast(dq), upcast(torch.stack([_fold(dk, m), _fold(dv, m)]))
    tail = (dout[:, :, c:].contiguous(), q[:, :, c:], out[:, :, c:].contiguous(), lse[..., c:].contiguous())
    arriving = comm.pass_kv(kv, group, async_op=True)
    for step in range(1, parts):
        moving = comm.pass_kv_grads(dkv, group, async_op=True)
        kv = arriving.wait()
        if step < parts - 1:
            arriving = comm.pass_kv(kv, group, async_op=True)
        k, v = repeat_kv(kv[0], heads), repeat_kv(kv[1], heads)
        if _source(rank, step, parts) < rank:
            dqi, dki, dvi = kernels.backward(dout, q, k[:, :, :c], v[:, :, :c], out, lse, False, states[step])
            dq = dq + dqi
            dkv = moving.wait()
            dkv[:, :, :, :c] += torch.stack([_fold(dki, m), _fold(dvi, m)])
        else:
            d_tail, q_tail, o_tail, lse_tail = tail
            dqi, dki, dvi = kernels.backward(d_tail, q_tail, k, v, o_tail, lse_tail, False, states[step])
            dq = torch.cat([dq[:, :, :c], dq[:, :, c:] + dqi], dim=2)
            dkv = moving.wait()
            dkv += torch.stack([_fold(dki, m), _fold(dvi, m)])
    dkv = comm.pass_kv_grads(dkv, group)
    return dq, dkv[0], dkv[1]


class _RingAttention(torch.autograd.Function):
    """Forward: the ring of module doc; backward: its conjugate ring (dK/dV passed home)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, group: Group) -> Tensor:
        kernels = kernels_for(q) or MATH
        kv = torch.stack([k, v])
        o, lse, states = _forward_steps(q, kv, group, kernels)
        out = o.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.kernels, ctx.states = group, kernels, states
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        kv = torch.stack([k, v])
        dq, dk, dv = _backward_steps(dout.contiguous(), q, kv, out, lse, ctx.group, ctx.kernels, ctx.states)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


class RingAttention:
    """``Attention.core`` for tokens sharded zigzag over ``group``, K/V passed around a ring.

    q [B, n, 2C, d], k, v [B, m, 2C, d] (this rank's chunks) -> o [B, n, 2C, d]. Per layer and
    forward: D - 1 ``pass_kv`` of [2, B, m, 2C, d]; backward: D - 1 of those and D
    ``pass_kv_grads`` of the same shape in the accumulation dtype.
    """

    def __init__(self, group: Group) -> None:
        self.group = group

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.group.size == 1:
            return causal_attention(q, k, v)
        return _RingAttention.apply(q, k, v, self.group)
