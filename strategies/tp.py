"""TP: Megatron-LM tensor parallelism over T ranks, vocabulary-parallel embedding, head and loss.

Per rank (T = tp degree; S_r = S / T when ``megatron_sp`` shards the residual stream):

    wq [n d/T, h]  wk, wv [m d/T, h]   column-parallel (heads split)   wo [h, n d/T] row-parallel
    w1, w3 [f/T, h]                     column-parallel                 w2 [h, f/T]   row-parallel
    embed [V/T, h], head [V/T, h]       vocabulary-parallel             norms replicated

Collectives (forward / backward), a = [B, S, h]:

    block input (x2 per layer)     identity / all-reduce a       Megatron-SP: all-gather a / reduce-scatter a
    block output (x2 per layer)    all-reduce a / identity       Megatron-SP: reduce-scatter a / all-gather a
    embedding output               all-reduce a / -              Megatron-SP: reduce-scatter a / all-gather a
    head input                     identity / all-reduce a       Megatron-SP: all-gather a / reduce-scatter a
    cross-entropy                  3 all-reduces [B, S] (max, target logit, sum of exponentials) / -

With Megatron-SP the norms see a sequence shard, so their gradients are all-reduced over tp too.

Decode: the cache holds the rank's m/T key/value heads of every sequence [B, m/T, S, d]. A step
on [B, 1, h]: the block-output all-reduces (2 per layer) and the embedding's, and the logits
all-gathered over tp [B, V] for the greedy argmax (as at the end of the prefill).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tspbench.core.errors import LayoutError
from tspbench.core.spec import Layout, Workload
from tspbench.costs.memory import ActivationTerms, Shapes, autograd_terms
from tspbench.dist import comm
from tspbench.dist.comm import Group
from tspbench.model.layers import upcast
from tspbench.model.transformer import Transformer
from tspbench.strategy import Piece, Placement, Strategy, Traffic, register

SHARD_DIM = {"wq": 0, "wk": 0, "wv": 0, "w1": 0, "w3": 0, "wo": 1, "w2": 1, "embed": 0, "head": 0}


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Token losses [B, S] from vocabulary-sharded logits [B, S, V/T] (Megatron-LM's scheme).

    Forward: all-reduce max, target logit and sum of exponentials, each [B, S]. Backward: no
    collective (softmax minus one-hot, on the local vocabulary slice).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, group: Group, vocab_start: int) -> Tensor:
        logits = upcast(logits)
        vocab_local = logits.shape[-1]
        top = comm.all_reduce(logits.max(dim=-1).values, group, op="max")
        shifted = logits - top.unsqueeze(-1)
        local = targets - vocab_start
        inside = (local >= 0) & (local < vocab_local)
        local = local.masked_fill(~inside, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~inside, 0)
        picked = comm.all_reduce(picked, group)
        exp = shifted.exp_()
        sum_exp = comm.all_reduce(exp.sum(dim=-1), group)
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local, inside)
        return sum_exp.log() - picked

    @staticmethod
    def backward(ctx, dloss: Tensor):
        softmax, local, inside = ctx.saved_tensors
        grad = softmax
        grad.scatter_add_(-1, local.unsqueeze(-1), -inside.unsqueeze(-1).to(grad.dtype))
        grad.mul_(dloss.unsqueeze(-1).to(grad.dtype))
        return grad, None, None, None


class VocabParallelEmbedding(nn.Module):
    """Rows [V/T, h] of the embedding: local lookup, zero outside the slice, then ``reduce``."""

    def __init__(self, rows: int, hidden: int, vocab_start: int, reduce: partial) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, hidden))
        self.vocab_start, self.reduce = vocab_start, reduce

    def forward(self, tokens: Tensor) -> Tensor:
        local = tokens - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill(outside.unsqueeze(-1), 0)
        return self.reduce(out)


class VocabParallelHead(nn.Module):
    """Rows [V/T, h] of the output projection; logits stay sharded; the loss is vocabulary-parallel."""

    def __init__(self, rows: int, hidden: int, vocab_start: int, group: Group, enter: partial) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, hidden))
        self.vocab_start, self.group, self.enter = vocab_start, group, enter

    def logits(self, x: Tensor) -> Tensor:
        return F.linear(self.enter(x), self.weight)

    def loss(self, x: Tensor, targets: Tensor) -> Tensor:
        losses = _VocabParallelCrossEntropy.apply(self.logits(x), targets, self.group, self.vocab_start)
        return losses.sum().to(x.dtype)


@register
class TensorParallel(Strategy):
    name = "tp"
    axes = ("tp",)
    vocab_axis = "tp"
    weight_axes = ("tp",)
    head_axis = "tp"
    switches = ("megatron_sp",)
    summary = (
        "Megatron tensor parallel: heads, MLP columns/rows and vocabulary split; 2 all-reduces per layer"
    )

    @classmethod
    def check(cls, layout: Layout, workload: Workload) -> None:
        super().check(layout, workload)
        t = layout.tp
        local_seq = workload.seq_len // (layout.degree(cls.sequence_axis) if cls.sequence_axis else 1)
        if workload.megatron_sp and local_seq % t:
            raise LayoutError(f"megatron_sp: tokens per rank {local_seq} must be divisible by tp = {t}")

    def placement(self, name: str, shape: tuple[int, ...]) -> Placement:
        reduce = self.data_axes()
        if self.workload.megatron_sp and "norm" in name:
            reduce = (*reduce, "tp")
        dim = SHARD_DIM.get(name.split(".")[-2])
        if dim is None:
            return Placement((Piece(name),), reduce=reduce)
        return Placement((Piece(name, dim),), axis="tp", reduce=reduce)

    def shapes(self) -> Shapes:
        t, base = self.mesh.size("tp"), super().shapes()
        stream = base.tokens // t if self.workload.megatron_sp else base.tokens
        return replace(
            base,
            stream_tokens=stream,
            q=base.q // t,
            kv=base.kv // t,
            ffn=base.ffn // t,
            vocab=base.vocab // t,
            heads=base.heads // t,
        )

    def activation_terms(self) -> ActivationTerms:
        return autograd_terms(self.shapes(), self.workload.megatron_sp, vocab_parallel=True)

    def transform(self, model: Transformer) -> None:
        tp, cfg = self.group("tp"), self.config
        if self.workload.megatron_sp:
            enter = partial(comm.gather_from_group, group=tp, dim=1)
            leave = partial(comm.reduce_scatter_to_group, group=tp, dim=1)
        else:
            enter = partial(comm.copy_to_group, group=tp)
            leave = partial(comm.reduce_from_group, group=tp)
        for layer in model.layers:
            for module in (layer.attention, layer.mlp):
                module.enter, module.exit = enter, leave
        rows = cfg.vocab_size // tp.size
        start = tp.rank * rows
        model.embed = VocabParallelEmbedding(rows, cfg.hidden, start, leave)
        model.head = VocabParallelHead(rows, cfg.hidden, start, tp, enter)

    def traffic(self) -> list[Traffic]:
        cfg, train = self.config, self.workload.mode == "train"
        tokens = self.local_batch * self.local_seq
        a = tokens * cfg.hidden * self.workload.element_size
        L, tp = cfg.n_layers, ("tp",)
        if self.workload.megatron_sp:
            enter, leave = ("all_gather", "reduce_scatter"), ("reduce_scatter", "all_gather")
        else:
            enter, leave = (None, "all_reduce"), ("all_reduce", None)
        out = [
            Traffic(leave[0], tp, a, 1, "forward", "model"),  # embedding output
            Traffic(leave[0], tp, a, L, "forward", "block"),  # attention output
            Traffic(leave[0], tp, a, L, "forward", "block_end"),  # MLP output
            Traffic(enter[0], tp, a, 2 * L, "forward", "block"),
            Traffic(enter[0], tp, a, 1, "forward", "model"),  # head input
        ]
        if train:
            ce = tokens * max(self.workload.element_size, 4)
            out += [
                Traffic(leave[1], tp, a, 1 + 2 * L, "backward"),
                Traffic(enter[1], tp, a, 2 * L + 1, "backward"),
                Traffic("all_reduce", tp, ce, 3, "forward", "model"),  # max, target logit, sum of exp
            ]
        return [x for x in out if x.op is not None]

    def decode_traffic(self) -> list[Traffic]:
        """One decode step on the rank's slots [b, 1, h]: 2 all-reduces per layer and the
        embedding's, and the logits' vocabulary all-gather [b, V]."""
        cfg, b, elt = self.config, self.decode_slots, self.workload.element_size
        return [
            Traffic("all_reduce", ("tp",), b * cfg.hidden * elt, 2 * cfg.n_layers + 1, "decode", "block"),
            Traffic("all_gather", ("tp",), b * cfg.vocab_size * elt, 1, "decode", "model"),
        ]
