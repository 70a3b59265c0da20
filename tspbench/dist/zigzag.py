"""The zigzag sequence partition and causal attention over a sequence-sharded group.

The sequence is cut into 2D chunks of C = S / 2D tokens; rank p holds chunks p and 2D-1-p, so
every rank has the same causal work (chunk p sees (p+1) C keys, chunk 2D-1-p sees (2D-p) C).
Each rank keeps its two chunks back to back: local tokens [B, 2C] at true positions.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tspbench.dist.comm import Group, gather_from_group
from tspbench.model.layers import causal_attention


def zigzag_positions(seq_len: int, parts: int, index: int, device: torch.device | str = "cpu") -> Tensor:
    """True positions [2C] of the tokens rank ``index`` of ``parts`` holds."""
    if parts == 1:
        return torch.arange(seq_len, device=device)
    c = seq_len // (2 * parts)
    first = torch.arange(index * c, (index + 1) * c, device=device)
    second = torch.arange((2 * parts - 1 - index) * c, (2 * parts - index) * c, device=device)
    return torch.cat([first, second])


def zigzag_shard(x: Tensor, parts: int, index: int, dim: int = 1) -> Tensor:
    """This rank's tokens of a full-sequence tensor (sequence along ``dim``)."""
    if parts == 1:
        return x
    chunks = x.chunk(2 * parts, dim=dim)
    return torch.cat([chunks[index], chunks[2 * parts - 1 - index]], dim=dim)


def zigzag_unshard(stacked: Tensor, dim: int) -> Tensor:
    """Sequence order from per-rank pieces stacked on dim 0: [D, .., 2C, ..] -> [.., 2DC, ..] along ``dim``.

    ``dim`` indexes the unstacked piece. Rank r's first chunk is chunk r, its second chunk
    2D-1-r, so the second halves come back in reverse rank order. One copy (the cat); under
    autograd the backward is one copy too: the gradient cut back into the pieces (zigzag_stack).
    """
    if stacked.shape[0] == 1:
        return stacked[0]
    return _ZigzagUnshard.apply(stacked, dim)  # without autograd: its forward alone


def zigzag_stack(full: Tensor, parts: int, dim: int) -> Tensor:
    """Inverse of zigzag_unshard: [.., S, ..] -> every rank's tokens stacked [D, .., 2C, ..].

    One copy: each of the 2D chunks of ``full`` is copied into its place in a new tensor."""
    if parts == 1:
        return full.unsqueeze(0)
    chunks = full.chunk(2 * parts, dim=dim)
    shape = list(full.shape)
    shape[dim] //= parts
    out = full.new_empty([parts, *shape])
    for r in range(parts):
        first, second = out[r].chunk(2, dim=dim)
        first.copy_(chunks[r])
        second.copy_(chunks[2 * parts - 1 - r])
    return out


def zigzag_split(full: Tensor, parts: int, dim: int) -> Tensor:
    """zigzag_stack under autograd: [.., S, ..] -> [D, .., 2C, ..]; backward zigzag_unshard.

    Ulysses' output (tspbench.dist.ulysses): the whole sequence of this rank's heads cut back
    into every rank's tokens before the all-to-all returns them."""
    if parts == 1:
        return full.unsqueeze(0)
    return _ZigzagSplit.apply(full, parts, dim)


def _unshard(stacked: Tensor, dim: int) -> Tensor:
    """zigzag_unshard's forward: the chunks are unbind views of the pieces, joined by one cat."""
    c = stacked.shape[dim + 1] // 2
    halves = [piece.unbind(dim) for piece in stacked.unflatten(dim + 1, (2, c)).unbind(0)]
    firsts = [first for first, _ in halves]
    seconds = [second for _, second in reversed(halves)]
    return torch.cat(firsts + seconds, dim=dim)


class _ZigzagUnshard(torch.autograd.Function):
    """Forward [D, .., 2C, ..] -> [.., 2DC, ..] (_unshard); backward the inverse (zigzag_stack).

    Autograd's own backward of the cat of 2D views would fill a zero tensor of the whole
    stacked size for every chunk and add the 2D of them: O(D) passes over the gathered K/V
    where one suffices."""

    @staticmethod
    def forward(ctx, stacked: Tensor, dim: int) -> Tensor:
        ctx.dim, ctx.parts = dim, stacked.shape[0]
        return _unshard(stacked, dim)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return zigzag_stack(grad, ctx.parts, ctx.dim), None


class _ZigzagSplit(torch.autograd.Function):
    """Forward zigzag_stack (one copy), backward _unshard (one copy)."""

    @staticmethod
    def forward(ctx, full: Tensor, parts: int, dim: int) -> Tensor:
        ctx.dim = dim
        return zigzag_stack(full, parts, dim)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        return _unshard(grad, ctx.dim), None, None


def zigzag_causal_attention(q: Tensor, keys: Tensor, values: Tensor, parts: int, index: int) -> Tensor:
    """Local queries q [B, n, 2C, d] of rank ``index`` against the whole sequence's K/V [B, m, S, d].

    Each local chunk attends its causal key prefix, bottom-right aligned; o [B, n, 2C, d].
    """
    if parts == 1:
        return causal_attention(q, keys, values)
    c = q.shape[2] // 2
    ends = ((index + 1) * c, (2 * parts - index) * c)
    outs = [
        causal_attention(qc, keys[:, :, :end], values[:, :, :end])
        for qc, end in zip(q.split(c, dim=2), ends, strict=True)
    ]
    return torch.cat(outs, dim=2)


class ZigzagAttention:
    """Attention core for tokens sharded zigzag over ``group``: K/V all-gathered over the sequence.

    q [B, n, 2C, d] and k, v [B, m, 2C, d] hold this rank's chunks. K/V are gathered
    (forward all-gather [D, B, m, 2C, d], backward reduce-scatter), put in sequence order
    [B, m, S, d], and each local query chunk attends its causal key prefix with bottom-right
    alignment. Returns o [B, n, 2C, d].
    """

    def __init__(self, group: Group) -> None:
        self.group = group

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        parts = self.group.size
        if parts == 1:
            return causal_attention(q, k, v)
        keys = zigzag_unshard(gather_from_group(k, self.group), dim=2)
        values = zigzag_unshard(gather_from_group(v, self.group), dim=2)
        return zigzag_causal_attention(q, keys, values, parts, self.group.rank)
