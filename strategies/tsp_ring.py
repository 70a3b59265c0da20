"""TSP ring schedules: the gated MLP, the embedding and the LM head with an online log-sum-exp loss.

Each rank p of D holds one shard; the shards circulate around the tsp group (p sends to p+1,
receives from p-1), so at step t rank p holds shard s = (p - t) mod D. Every rank applies every
shard to its own tokens and accumulates locally: no activation leaves the rank.

Forward: D-1 ring shifts of the shard [R, h] (channel 1), each overlapped with the GEMMs on the
shard in hand. Backward: the shards circulate again (fetched again rather than kept), and a
gradient accumulator [R, h] rides one step behind each shard (channel 0): at step t rank p adds
its partial gradient of shard s to the accumulator it received and passes it on; after D steps
the accumulator of shard p arrives home complete. D shifts of accumulators, D-1 of weights.

    MLP shard      [3 f/D, h]  = [W1_p; W3_p; W2_p^T]      y += (silu(x W1_s^T) * x W3_s^T) W2_s^T
    embedding      [V/D, h]    = rows of vocabulary block p   x[token in block s] = E_s[token]
    LM head        [V/D, h]    = rows of vocabulary block p   logits_s = x E_s^T, online log-sum-exp

The MLP's shards may travel by their owners' broadcasts instead (``mlp_exchange`` broadcast,
tsp_mlp.py): the same math, with any ``ShardExchange`` in place of the ring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tspbench.dist import comm
from tspbench.dist.comm import Group, Pending
from tspbench.model.layers import swiglu_backward, upcast


class ShardExchange(Protocol):
    """How the shards of one weight reach every rank: the ring below, or tsp_mlp.py's
    OwnerBroadcast (the MLP's ``mlp_exchange``). fn(s, W_s) sees every shard s once."""

    w_group: Group

    def visit(self, shard: Tensor, fn: Callable[[int, Tensor], None]) -> None: ...

    def visit_backward(self, shard: Tensor, fn: Callable[[int, Tensor], Tensor]) -> Tensor: ...


@dataclass(frozen=True)
class Ring:
    """Circulates shards around ``w_group`` and gradient accumulators around ``acc_group``."""

    w_group: Group  # tsp, channel 1
    acc_group: Group  # tsp, channel 0
    overlap: bool

    def _shift(self, t: Tensor, group: Group) -> Pending:
        if self.overlap:
            return comm.ring_shift(t, group, async_op=True)
        received = comm.ring_shift(t, group)
        return Pending((), lambda: received)

    def _shard_at(self, step: int) -> int:
        return (self.w_group.rank - step) % self.w_group.size

    def visit(self, shard: Tensor, fn: Callable[[int, Tensor], None]) -> None:
        """Call fn(s, W_s) for every shard s, the next shard in flight meanwhile."""
        w, parts = shard, self.w_group.size
        for step in range(parts):
            pending = self._shift(w, self.w_group) if step < parts - 1 else None
            fn(self._shard_at(step), w)
            if pending is not None:
                w = pending.wait()

    def visit_backward(
        self, shard: Tensor, fn: Callable[[int, Tensor], Tensor], need_weights: bool = True
    ) -> Tensor:
        """fn(s, W_s) returns this rank's partial gradient of shard s; returns the own shard's sum."""
        w, parts, arriving = shard, self.w_group.size, None
        for step in range(parts):
            pending = self._shift(w, self.w_group) if need_weights and step < parts - 1 else None
            partial = fn(self._shard_at(step), w)
            if arriving is not None:
                partial += arriving.wait()
            arriving = self._shift(partial, self.acc_group)
            if pending is not None:
                w = pending.wait()
        return arriving.wait()


def _vocab_slice(tokens: Tensor, s: int, rows: int) -> tuple[Tensor, Tensor]:
    """Indices of ``tokens`` into vocabulary block s, and which tokens fall inside it."""
    local = tokens - s * rows
    inside = (local >= 0) & (local < rows)
    return local.masked_fill(~inside, 0), inside


# ----------------------------------------------------------------------------- gated MLP


class _RingMLP(torch.autograd.Function):
    """x [B, T, h] -> y [B, T, h]. Saves x and h1, h3 [B, T, f/D] of every shard."""

    @staticmethod
    def forward(ctx, x: Tensor, shard: Tensor, ring: ShardExchange, keep: bool) -> Tensor:
        y = torch.zeros_like(x)
        hidden: list = [()] * ring.w_group.size

        def apply(s: int, w: Tensor) -> None:
            w1, w3, w2_t = w.chunk(3, dim=0)
            h1, h3 = x @ w1.t(), x @ w3.t()
            y.view(-1, y.shape[-1]).addmm_((F.silu(h1) * h3).flatten(0, 1), w2_t)
            hidden[s] = (h1, h3) if keep else ()

        ring.visit(shard.detach(), apply)
        ctx.save_for_backward(x, shard, *[t for pair in hidden for t in pair])
        ctx.ring = ring
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, shard, *hidden = ctx.saved_tensors
        dx = torch.zeros_like(x)
        x2, dy2, dx2 = x.flatten(0, 1), dy.flatten(0, 1), dx.view(-1, x.shape[-1])

        def partial(s: int, w: Tensor) -> Tensor:
            w1, w3, w2_t = w.chunk(3, dim=0)
            h1, h3 = hidden[2 * s], hidden[2 * s + 1]
            a = (F.silu(h1) * h3).flatten(0, 1)
            dh1, dh3 = swiglu_backward(h1, h3, dy @ w2_t.t())
            dh1, dh3 = dh1.flatten(0, 1), dh3.flatten(0, 1)
            dx2.addmm_(dh1, w1).addmm_(dh3, w3)
            return torch.cat([dh1.t() @ x2, dh3.t() @ x2, a.t() @ dy2])

        grad = ctx.ring.visit_backward(shard.detach(), partial)
        return dx, grad, None, None


class RingBlock(nn.Module):
    """This rank's block [rows, h] of a ring-circulated weight, the parameter named ``param`` (the
    name TSP's placements match: mlp.shard, embed.weight, head.weight), and the ring."""

    param = "weight"

    def __init__(self, rows: int, hidden: int, ring: ShardExchange) -> None:
        super().__init__()
        self.register_parameter(self.param, nn.Parameter(torch.empty(rows, hidden)))
        self.ring = ring


class RingMLP(RingBlock):
    """One packed shard [W1_p; W3_p; W2_p^T] [3 f/D, h]; forward runs the ring schedule, or the
    owners' broadcasts (tsp_mlp.py) when built with that ``mlp_exchange``."""

    param = "shard"

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        return _RingMLP.apply(x, self.shard, self.ring, torch.is_grad_enabled())  # prefill keeps nothing


# ----------------------------------------------------------------------------- embedding


class _RingEmbedding(torch.autograd.Function):
    """tokens [B, T] -> x [B, T, h]. Backward needs no weights: only accumulators circulate.

    Every lookup and gradient is data-independent in shape: each shard looks up every token
    (ids outside its block read row 0) and masks those rows to zero, instead of indexing with a
    boolean mask, whose shape depends on the token values (a device-to-host sync on a GPU, and
    no shape at all under fake tensors). One [B, T, h] temporary per shard."""

    @staticmethod
    def forward(ctx, tokens: Tensor, shard: Tensor, ring: Ring) -> Tensor:
        rows = shard.shape[0]
        out = shard.new_zeros(*tokens.shape, shard.shape[1])

        def lookup(s: int, w: Tensor) -> None:
            local, inside = _vocab_slice(tokens, s, rows)
            out.add_(F.embedding(local, w).masked_fill_(~inside.unsqueeze(-1), 0))

        ring.visit(shard.detach(), lookup)
        ctx.save_for_backward(tokens, shard)
        ctx.ring = ring
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        tokens, shard = ctx.saved_tensors

        def partial(s: int, w: Tensor) -> Tensor:
            local, inside = _vocab_slice(tokens, s, shard.shape[0])
            rows = dout.masked_fill(~inside.unsqueeze(-1), 0).flatten(0, 1)
            return torch.zeros_like(shard).index_add_(0, local.flatten(), rows)

        return None, ctx.ring.visit_backward(shard.detach(), partial, need_weights=False), None


class RingEmbedding(RingBlock):
    """Vocabulary block p of the embedding [V/D, h]; lookups by the ring."""

    def forward(self, tokens: Tensor) -> Tensor:
        return _RingEmbedding.apply(tokens, self.weight, self.ring)


# ----------------------------------------------------------------------------- LM head and loss


class _RingCrossEntropy(torch.autograd.Function):
    """Summed token cross-entropy of x [B, T, h] without ever holding more than [B, T, V/D] logits.

    Forward keeps a running max and sum of exponentials per token (online log-sum-exp) and
    picks the target logit in the block that holds it. Saves x and lse [B, T]; backward
    recomputes each block's logits: dlogits = softmax - onehot, dx += dlogits E_s.
    """

    @staticmethod
    def forward(ctx, x: Tensor, shard: Tensor, targets: Tensor, ring: Ring) -> Tensor:
        rows = shard.shape[0]
        stats = {"max": None, "sum": None, "target": None}

        def accumulate(s: int, w: Tensor) -> None:
            logits = upcast(x @ w.t())
            local, inside = _vocab_slice(targets, s, rows)
            picked = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~inside, 0)
            top = logits.max(dim=-1).values
            if stats["max"] is None:
                stats.update(max=top, sum=(logits - top.unsqueeze(-1)).exp().sum(-1), target=picked)
                return
            new_max = torch.maximum(stats["max"], top)
            rescaled = stats["sum"] * (stats["max"] - new_max).exp()
            stats["sum"] = rescaled + (logits - new_max.unsqueeze(-1)).exp().sum(-1)
            stats["max"], stats["target"] = new_max, stats["target"] + picked

        ring.visit(shard.detach(), accumulate)
        lse = stats["max"] + stats["sum"].log()
        ctx.save_for_backward(x, shard, targets, lse)
        ctx.ring = ring
        return (lse - stats["target"]).sum().to(x.dtype)

    @staticmethod
    def backward(ctx, dloss: Tensor):
        x, shard, targets, lse = ctx.saved_tensors
        dx = torch.zeros_like(x)
        x2, dx2 = x.flatten(0, 1), dx.view(-1, x.shape[-1])

        def partial(s: int, w: Tensor) -> Tensor:
            probs = (upcast(x @ w.t()) - lse.unsqueeze(-1)).exp_()
            local, inside = _vocab_slice(targets, s, shard.shape[0])
            probs.scatter_add_(-1, local.unsqueeze(-1), -inside.unsqueeze(-1).to(probs.dtype))
            dlogits = probs.mul_(dloss.to(probs.dtype)).to(x.dtype).flatten(0, 1)
            dx2.addmm_(dlogits, w)
            return dlogits.t() @ x2

        grad = ctx.ring.visit_backward(shard.detach(), partial)
        return dx, grad, None, None


class RingHead(RingBlock):
    """Vocabulary block p of the LM head [V/D, h]; logits and loss by the ring."""

    def logits(self, x: Tensor) -> Tensor:
        """Logits [B, T, V] of the local tokens over the whole vocabulary (prefill, no grad)."""
        rows = self.weight.shape[0]
        out = x.new_empty(*x.shape[:-1], rows * self.ring.w_group.size)

        def project(s: int, w: Tensor) -> None:
            out[..., s * rows : (s + 1) * rows] = x @ w.t()

        self.ring.visit(self.weight.detach(), project)
        return out

    def loss(self, x: Tensor, targets: Tensor) -> Tensor:
        return _RingCrossEntropy.apply(x, self.weight, targets, self.ring)
