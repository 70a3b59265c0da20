"""What every strategy shares of decode: its cache, its slots, the prefill's first token, a step,
their collectives, and gathering results back for checks (tspbench.strategy.base.Strategy
inherits it; strategies declare their own per-step traffic in ``decode_traffic``).

Who holds what (per model replica; P = degree of the ``sequence_axis``, 1 without one):
    new tokens   P = 1: all B sequences on every rank; P > 1: b = ceil(B / P) slots per rank,
                 sequence i owned by rank i mod P in slot i // P, padding slots token 0
    cache        per layer: context K/V of all B sequences at the rank's positions
                 [B, m_loc, S / P, d] and the tail of its slots [b, m_loc, N, d]; m_loc is the
                 key/value heads it holds (1/T of them over ``head_axis``, else all)
    first token  from the logits of position S-1: vocabulary gathered over ``vocab_axis``, then
                 broadcast as B int64 ids from sequence rank 0 (which holds position S-1)
    a step       positions S + step on every slot; logits [b, V] (vocabulary gathered), the next
                 token each slot's greedy argmax, on its owner
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from tspbench.costs.decode import DecodeShape, Widths, kv_cache_bytes, widths
from tspbench.dist import comm
from tspbench.dist.decode import owned_sequences
from tspbench.model.cache import KVCache
from tspbench.model.optim import torch_dtype
from tspbench.strategy.traffic import Traffic

INDEX_BYTES = 8  # token ids are int64


class Decoding:
    """The decode half of Strategy (mixed into it; uses its mesh, workload and groups)."""

    head_axis: ClassVar[str | None] = None  # axis the attention heads, and the cache's, are split over

    # ------------------------------------------------------------------ sizes
    @property
    def decode_parts(self) -> int:
        """P: ranks the cache's context (and the new tokens' slots) are sharded over."""
        return self.mesh.size(self.sequence_axis) if self.sequence_axis else 1

    @property
    def decode_slots(self) -> int:
        """New tokens per rank and step: B with P = 1, else ceil(B / P)."""
        return math.ceil(self.workload.batch / self.decode_parts)

    @property
    def cache_kv_heads(self) -> int:
        """Key/value heads this rank caches (TSP: all: it projects its tokens with every head block)."""
        return self.config.n_kv_heads // (self.mesh.size(self.head_axis) if self.head_axis else 1)

    def cache_bytes(self) -> int:
        """Bytes of this rank's KV cache: 2 L m_loc d (B S / P + b N) x element size."""
        return kv_cache_bytes(self.config, self.decode_shape())

    def allocate_cache(self) -> KVCache:
        w, cfg = self.workload, self.config
        args = (cfg.n_layers, w.batch)
        tail = (self.cache_kv_heads, w.seq_len // self.decode_parts, w.decode_tokens, cfg.head_dim)
        dtype = torch_dtype(w.dtype)
        slots = None if self.decode_parts == 1 else self.decode_slots
        return KVCache.allocate(*args, *tail, dtype, self.device, slots=slots)

    def owned(self) -> list[int]:
        """The sequences of this rank's slots (-1: padding)."""
        if self.decode_parts == 1:
            return list(range(self.workload.batch))
        return owned_sequences(self.workload.batch, self.decode_parts, self.mesh.index(self.sequence_axis))

    # ------------------------------------------------------------------ the decode model's terms
    def decode_shape(self) -> DecodeShape:
        """This rank's decode as the cost terms size it (tspbench.costs.decode)."""
        w = self.workload
        heads = self.mesh.size(self.head_axis) if self.head_axis else 1
        return DecodeShape(self.decode_parts, heads, w.batch, w.seq_len, w.decode_tokens, w.dtype)

    def decode_held_widths(self) -> Widths:
        """The widths a rank's decode step holds at once (its activations): its own."""
        return widths(self.config, self.decode_shape())

    def decode_weights_bytes(self) -> int:
        """Weights a decode step holds beyond the rank's own (in flight, gathered): none."""
        return 0

    # ------------------------------------------------------------------ the run (no grad)
    def vocab_logits(self, logits: Tensor) -> Tensor:
        """[b, V_loc] -> [b, V]: the whole vocabulary, for the greedy argmax."""
        if self.vocab_axis and self.mesh.size(self.vocab_axis) > 1:
            return comm.all_gather(logits.contiguous(), self.group(self.vocab_axis), dim=-1)
        return logits

    def prefill(self, model: nn.Module, batch, cache: KVCache) -> tuple[Tensor, Tensor]:
        """The context into ``cache``; returns the first generated token of this rank's slots
        [b, 1] and the logits of position S-1 [B, V] (meaningful on sequence rank 0)."""
        logits = self.vocab_logits(model.prefill(batch.tokens, batch.positions, cache))
        first = logits.argmax(dim=-1)
        if self.decode_parts > 1:
            first = comm.broadcast(first, 0, self.group(self.sequence_axis))
        return self.slot_tokens(first), logits

    def slot_tokens(self, tokens: Tensor) -> Tensor:
        """Tokens of every sequence [B] -> this rank's slots [b, 1] (padding slots: token 0)."""
        owned = torch.tensor(self.owned(), device=tokens.device)
        return tokens[owned.clamp(min=0)].masked_fill(owned < 0, 0)[:, None]

    def next_tokens(self, logits: Tensor) -> Tensor:
        """Greedy: [b, V] -> [b, 1], ties to the lowest index; padding slots token 0."""
        padding = torch.tensor([i < 0 for i in self.owned()], device=logits.device)
        return logits.argmax(dim=-1).masked_fill(padding, 0)[:, None]

    def decode_step(self, model: nn.Module, tokens: Tensor, cache: KVCache, step: int) -> Tensor:
        """One step: tokens [b, 1] at position S + step; returns logits [b, V]."""
        positions = torch.full((tokens.shape[0],), self.workload.seq_len + step, device=tokens.device)
        return self.vocab_logits(model.decode_step(tokens, positions, cache, step))

    # ------------------------------------------------------------------ collectives declared
    def decode_traffic(self) -> list[Traffic]:
        """Every collective of ONE decode step on this rank (phase "decode"); the strategy's own.
        The decode model (tspbench.analytic.decode) prices them: exposed, or hidden behind the
        whole step's compute, or (``window``) behind a window of GEMMs of ``window_flops``, run
        ``window_count`` times (0: once per call), that read the largest of the window's messages."""
        return []

    def first_token_traffic(self) -> list[Traffic]:
        """The end of the prefill: the vocabulary gather of position S-1's logits [B, V], and for
        P > 1 the broadcast of the B token ids over the sequence axis."""
        w, out = self.workload, []
        if self.vocab_axis:
            nbytes = w.batch * self.config.vocab_size * w.element_size
            out.append(Traffic("all_gather", (self.vocab_axis,), nbytes, 1, "forward", "model"))
        if self.sequence_axis:
            out.append(
                Traffic("broadcast", (self.sequence_axis,), w.batch * INDEX_BYTES, 1, "forward", "model")
            )
        return out

    def query_traffic(self, axis: str, heads: int, count: int) -> list[Traffic]:
        """``count`` sharded-cache attentions of one step (tspbench.dist.decode): the query
        all-gather [P, b, heads, 1, d] and the partials all-to-all [P, b, heads, 1, d + 1]."""
        parts, slots, d, elt = (
            self.mesh.size(axis),
            self.decode_slots,
            self.config.head_dim,
            self.workload.element_size,
        )
        gathered = parts * slots * heads * d * elt
        partials = parts * slots * heads * (d + 1) * max(elt, 4)
        return [
            Traffic("all_gather", (axis,), gathered, count, "decode", "block"),
            Traffic("all_to_all", (axis,), partials, count, "decode", "block"),
        ]

    def decode_run_traffic(self) -> list[Traffic]:
        """What a decode run adds to its prefill's traffic: the first token's collectives, and
        ``decode_tokens`` x one step's."""
        n = self.workload.decode_tokens
        steps = [
            Traffic(t.op, t.axes, t.msg_bytes, t.count * n, "decode", t.scope, t.hidden, t.channel)
            for t in self.decode_traffic()
        ]
        return self.first_token_traffic() + steps

    # ------------------------------------------------------------------ checks (not measured)
    def gather_decoded(self, local: Tensor, prefill: bool) -> Tensor:
        """Results of the rank's slots [b, ...] (the prefill's: [B, ...], meaningful on sequence
        rank 0) -> every sequence of every replica [dp B, ...], in sequence order."""
        if self.decode_parts > 1:
            stacked = comm.all_gather(local.contiguous(), self.group(self.sequence_axis))  # [P, b, ...]
            if prefill:
                local = stacked[0]
            else:
                local = stacked.transpose(0, 1).reshape(-1, *local.shape[1:])[: self.workload.batch]
        return comm.all_gather(local.contiguous(), self.group(*self.batch_split_axes()), dim=0)
