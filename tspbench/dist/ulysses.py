"""DeepSpeed-Ulysses over zigzag shards: an all-to-all from sequence to head shards and back.

Rank r of D holds tokens [B, 2C] (zigzag chunks r and 2D-1-r). Before attention one all-to-all
(comm.exchange_heads) sends member i heads [i n/D, (i+1) n/D) of q and [i m/D, (i+1) m/D) of k
and v for this rank's tokens, packed into one message [D, B, (n + 2m)/D, 2C, d]; what comes back
is every rank's tokens of this rank's heads, put in sequence order (zigzag_unshard) [B, ., S, d].
Attention is then the single-device causal attention on the whole sequence for n/D query and
m/D key/value heads (exact, no merge; query head i still uses key head i // g). A second
all-to-all [D, B, n/D, 2C, d] returns each rank's tokens of every head. Backward: the same two
exchanges in reverse order (each all-to-all is its own conjugate).

Needs n and m divisible by D (tspbench.strategies.sp checks it): with fewer K/V heads than
ranks, a K/V head would have to be repeated before the exchange (ALST's way, more bytes).
Per layer a rank holds S tokens of (n + 2m)/D heads: the size of its own q, k, v when m >= D.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tspbench.dist import comm
from tspbench.dist.comm import Group
from tspbench.dist.zigzag import zigzag_split, zigzag_unshard
from tspbench.model.layers import causal_attention


def heads_problem(n_heads: int, kv_heads: int, parts: int) -> str | None:
    """Why Ulysses cannot split these heads over ``parts`` ranks, or None."""
    if n_heads % parts:
        return f"{n_heads} query heads do not divide by the sequence degree {parts}"
    if kv_heads % parts:
        fewer = " (fewer K/V heads than ranks)" if kv_heads < parts else ""
        return f"{kv_heads} key/value heads do not divide by the sequence degree {parts}{fewer}"
    return None


def to_heads(q: Tensor, k: Tensor, v: Tensor, group: Group) -> tuple[Tensor, Tensor, Tensor]:
    """Local tokens of every head -> every token of this rank's heads, in sequence order.

    q [B, n, 2C, d], k, v [B, m, 2C, d] -> [B, n/D, S, d], [B, m/D, S, d] x 2. One all-to-all of
    [D, B, (n + 2m)/D, 2C, d]; slice i holds member i's heads."""
    parts, n, m = group.size, q.shape[1], k.shape[1]
    split = [t.unflatten(1, (parts, t.shape[1] // parts)) for t in (q, k, v)]  # [B, D, ., 2C, d]
    packed = torch.cat(split, dim=2).transpose(0, 1)  # [D, B, (n + 2m)/D, 2C, d]
    received = comm.exchange_heads(packed, group)  # slice j: member j's tokens of my heads
    whole = zigzag_unshard(received, dim=2)  # [B, (n + 2m)/D, S, d]
    return whole.split([n // parts, m // parts, m // parts], dim=1)


def to_sequence(o: Tensor, group: Group) -> Tensor:
    """o [B, n/D, S, d] of this rank's heads -> this rank's tokens of every head [B, n, 2C, d].

    One all-to-all of [D, B, n/D, 2C, d]; slice j of what comes back is member j's heads."""
    stacked = zigzag_split(o, group.size, dim=2)  # [D, B, n/D, 2C, d]: slice i, member i's tokens
    received = comm.exchange_heads(stacked, group)
    return received.transpose(0, 1).flatten(1, 2)  # [B, D n/D, 2C, d]


class UlyssesAttention:
    """``Attention.core`` for tokens sharded zigzag over ``group``: attention on head shards.

    q [B, n, 2C, d], k, v [B, m, 2C, d] -> o [B, n, 2C, d]. Per layer: two all-to-alls forward
    ([D, B, (n + 2m)/D, 2C, d] and [D, B, n/D, 2C, d]) and the same two in backward."""

    def __init__(self, group: Group) -> None:
        self.group = group

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.group.size == 1:
            return causal_attention(q, k, v)
        qh, kh, vh = to_heads(q, k, v, self.group)
        return to_sequence(causal_attention(qh, kh, vh), self.group)
