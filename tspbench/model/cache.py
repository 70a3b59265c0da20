"""The key/value cache of a decode run, and attention of new tokens against it.

Per layer, per rank (shapes; m = key/value heads this rank holds, d = head dim):

    context  k, v        [B, m, S_loc, d]   every sequence at this rank's context positions
    tail     k_tail, ... [b, m, N, d]       the new tokens of the b slots this rank owns, one
                                            position per decode step

With the whole sequence on the rank (S_loc = S, b = B) the context and the tail are views of one
buffer [B, m, S + N, d], so a step attends to a prefix of it without a copy. Everything is
allocated once, before the prefill, and registered with the memory tracker as ``kv_cache``.
Nothing here imports torch.distributed: a sequence-sharded cache (tspbench.dist.decode) uses
these buffers with its own collectives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tspbench.model.attention import one_query_attention


@dataclass
class LayerCache:
    """One layer's cache: context K/V [B, m, S_loc, d], tail K/V [b, m, N, d] (see the module doc)."""

    k: Tensor
    v: Tensor
    k_tail: Tensor
    v_tail: Tensor
    joined: tuple[Tensor, Tensor] | None = None  # [B, m, S + N, d] when k and k_tail are its views

    def write_context(self, k: Tensor, v: Tensor) -> None:
        """The prefill's K/V [B, m, S_loc, d] of this rank's context positions."""
        self.k.copy_(k)
        self.v.copy_(v)

    def append(self, k: Tensor, v: Tensor, step: int) -> None:
        """Decode step ``step``'s K/V [b, m, 1, d] of the rank's slots, at tail position ``step``."""
        self.k_tail[:, :, step] = k[:, :, 0]
        self.v_tail[:, :, step] = v[:, :, 0]

    def prefix(self, step: int) -> tuple[Tensor, Tensor]:
        """Keys and values [B, m, S + step + 1, d] of positions 0 .. S + step (joined caches only)."""
        if self.joined is None:
            raise ValueError("a sequence-sharded cache has no joined prefix; attend to its parts")
        end = self.k.shape[2] + step + 1
        return self.joined[0][:, :, :end], self.joined[1][:, :, :end]

    def heads(self, start: int, stop: int) -> LayerCache:
        """Views of key/value heads start .. stop-1 (TSP: one head block)."""
        joined = None if self.joined is None else tuple(t[:, start:stop] for t in self.joined)
        parts = (t[:, start:stop] for t in (self.k, self.v, self.k_tail, self.v_tail))
        return LayerCache(*parts, joined=joined)  # type: ignore[arg-type]

    def tensors(self) -> list[Tensor]:
        return list(self.joined) if self.joined is not None else [self.k, self.v, self.k_tail, self.v_tail]


@dataclass
class KVCache:
    """Every layer's LayerCache, allocated once before the prefill."""

    layers: list[LayerCache]

    @classmethod
    def allocate(
        cls,
        n_layers: int,
        batch: int,
        kv_heads: int,
        context: int,
        steps: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        slots: int | None = None,
    ) -> KVCache:
        """A rank's cache, K and V per layer. With ``slots`` (a sequence-sharded rank): context
        [batch, kv_heads, context, d] and tail [slots, kv_heads, steps, d]. Without (a rank holding
        whole sequences): [batch, kv_heads, context + steps, d], context and tail its views."""

        def zeros(rows: int, length: int) -> Tensor:
            return torch.zeros(rows, kv_heads, length, head_dim, dtype=dtype, device=device)

        def sharded() -> LayerCache:
            context_kv = zeros(batch, context), zeros(batch, context)
            return LayerCache(*context_kv, zeros(slots, steps), zeros(slots, steps))

        def joined() -> LayerCache:
            k, v = (zeros(batch, context + steps) for _ in "kv")
            parts = (k[:, :, :context], v[:, :, :context], k[:, :, context:], v[:, :, context:])
            return LayerCache(*parts, joined=(k, v))

        return cls([(joined if slots is None else sharded)() for _ in range(n_layers)])

    def tensors(self) -> list[Tensor]:
        return [t for layer in self.layers for t in layer.tensors()]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def cached_attention(q: Tensor, k: Tensor, v: Tensor, cache: LayerCache, step: int) -> Tensor:
    """The default ``Attention.cached_core`` (whole sequences on the rank): append k, v [B, m, 1, d]
    at position S + step, attend q [B, n, 1, d] to positions 0 .. S + step (all precede it: no
    mask). Returns o [B, n, 1, d]."""
    cache.append(k, v, step)
    keys, values = cache.prefix(step)
    return one_query_attention(q, keys, values)
