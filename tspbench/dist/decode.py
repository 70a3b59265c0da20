"""A decode step's attention over a sequence-sharded KV cache (sp, tp_sp, fsdp_sp, tsp).

P members of the sequence group each hold, per layer, the context K/V of ALL B sequences at
their zigzag positions [B, m, S/P, d] and the tail of the b = ceil(B/P) slots they own
[b, m, N, d] (tspbench.model.cache). Sequence ``i`` is owned by member ``i mod P``, in slot
``i // P``; slots past B are padding (they attend sequence 0, their results are discarded).
With q, k, v of the member's slots [b, n, 1, d]:

    1. append k, v to the member's tail at position ``step``
    2. gather the queries of every slot                  all-gather  [P, b, n, 1, d]
    3. attend each slot's query to this member's context of that slot's sequence (no mask:
       every cached position precedes the new token); the owner also to the slot's tail, merged
       -> partial o and log-sum-exp per slot            [P, b, n, 1, d + 1] (float32 or float64)
    4. send each owner the partials of its slots         all-to-all  [P, b, n, 1, d + 1]
    5. merge the P partials by log-sum-exp (the ring-attention identity) -> o [b, n, 1, d]
"""

from __future__ import annotations

import torch
from torch import Tensor

from tspbench.dist import comm
from tspbench.dist.comm import Group
from tspbench.model.attention import attention_with_lse, merge_partials
from tspbench.model.cache import LayerCache


def owned_sequences(batch: int, parts: int, index: int) -> list[int]:
    """The sequences member ``index`` of ``parts`` owns, slot by slot; padding slots as -1."""
    slots = -(-batch // parts)
    return [s * parts + index if s * parts + index < batch else -1 for s in range(slots)]


def partial_dtype(x: Tensor) -> torch.dtype:
    """Partials travel in float32, float64 in float64 runs."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def sharded_decode_attention(
    q: Tensor, k: Tensor, v: Tensor, cache: LayerCache, step: int, group: Group
) -> Tensor:
    """o [b, n, 1, d] of this member's slots (see the module doc for the five steps)."""
    parts, slots, me = group.size, q.shape[0], group.rank
    cache.append(k, v, step)
    queries = comm.gather_queries(q, group)  # [P, b, n, 1, d]
    batch = cache.k.shape[0]
    by_sequence = queries.transpose(0, 1).reshape(parts * slots, *q.shape[1:])  # row i: sequence i
    o, lse = attention_with_lse(by_sequence[:batch], cache.k, cache.v)
    if parts * slots > batch:  # padding slots attend sequence 0
        pad = by_sequence[batch:]
        o_pad, lse_pad = attention_with_lse(
            pad, *(t[:1].expand(len(pad), *t.shape[1:]) for t in (cache.k, cache.v))
        )
        o, lse = torch.cat([o, o_pad]), torch.cat([lse, lse_pad])
    dtype = partial_dtype(q)
    packed = torch.cat([o.to(dtype), lse.to(dtype).unsqueeze(-1)], dim=-1)  # [P b, n, 1, d + 1]
    packed = packed.view(slots, parts, *packed.shape[1:]).transpose(0, 1).contiguous()  # [P, b, ...]
    o_tail, lse_tail = attention_with_lse(q, cache.k_tail[:, :, : step + 1], cache.v_tail[:, :, : step + 1])
    mine = packed[me]
    own_o, own_lse = merge_partials(
        torch.stack([mine[..., :-1], o_tail.to(dtype)]), torch.stack([mine[..., -1], lse_tail.to(dtype)])
    )
    packed[me] = torch.cat([own_o, own_lse.unsqueeze(-1)], dim=-1)
    received = comm.exchange_partials(packed, group)  # [P, b, n, 1, d + 1]: every member's partials of mine
    merged, _ = merge_partials(received[..., :-1], received[..., -1])
    return merged.to(q.dtype)


class ShardedDecodeAttention:
    """``Attention.cached_core`` for a cache sharded over ``group`` (the sequence axis)."""

    def __init__(self, group: Group) -> None:
        self.group = group

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, cache: LayerCache, step: int) -> Tensor:
        return sharded_decode_attention(q, k, v, cache, step, self.group)
