"""SP: tokens sharded zigzag over Σ ranks, weights replicated, K/V exchanged for attention.

Per rank: the whole model; tokens [B, S/Σ] (chunks p and 2Σ-1-p, at their true positions for
RoPE). Collectives (forward / backward), per layer, by ``kv_exchange`` (the attention core):

    allgather  K, V all-gather [Σ, B, m, S/Σ, d] -> [B, m, S, d] / reduce-scatter back
    ring       Σ-1 pass_kv [2, B, m, S/Σ, d] / Σ-1 pass_kv and Σ pass_kv_grads (tspbench.dist.ring)
    ulysses    exchange_heads [Σ, B, (n+2m)/Σ, S/Σ, d] and [Σ, B, n/Σ, S/Σ, d] / the same two
               (tspbench.dist.ulysses; n and m must divide by Σ)

Every gradient is all-reduced over (dp, sp) after backward. Selective recomputation re-runs the
attention core, K/V gather included; full recomputation re-runs the whole block.

Decode (tspbench.dist.decode), whatever the exchange: the prefill caches each rank's context K/V
of every sequence (its own tokens, all heads: the block writes the cache before the core, so a
Ulysses prefill leaves the same token-sharded cache as the others); new
tokens are batch-sharded over sp (sequence i on rank i mod Σ); per layer and step the queries
are all-gathered, every rank attends them to its context shard, and the partials are sent to
their owners (all-to-all) and merged by log-sum-exp.
"""

from __future__ import annotations

from dataclasses import replace

from tspbench.core.errors import LayoutError
from tspbench.core.spec import Layout, Workload
from tspbench.costs.elementwise import over_step, recomputed_forwards, zigzag_attention_bytes
from tspbench.costs.memory import Shapes
from tspbench.dist.comm import Group
from tspbench.dist.decode import ShardedDecodeAttention
from tspbench.dist.ring import RingAttention
from tspbench.dist.ulysses import UlyssesAttention, heads_problem
from tspbench.dist.zigzag import ZigzagAttention
from tspbench.model.transformer import Transformer
from tspbench.strategy import Strategy, Traffic, register

CORES = {"allgather": ZigzagAttention, "ring": RingAttention, "ulysses": UlyssesAttention}


def kv_gather_traffic(strategy: Strategy, axis: str, kv_heads: int) -> list[Traffic]:
    """The K and V all-gathers of every layer over ``axis`` and their backward reduce-scatters."""
    msg = strategy.local_batch * strategy.workload.seq_len * kv_heads * strategy.config.head_dim
    msg *= strategy.workload.element_size
    count = 2 * strategy.config.n_layers
    out = [Traffic("all_gather", (axis,), msg, count, "forward", "core")]
    if strategy.workload.mode == "train":
        out.append(Traffic("reduce_scatter", (axis,), msg, count, "backward"))
    return out


def kv_exchange_traffic(strategy: Strategy, axis: str, heads: int, kv_heads: int) -> list[Traffic]:
    """The attention core's collectives over ``axis`` for the workload's ``kv_exchange``
    (``heads``, ``kv_heads``: the query and K/V heads a rank holds before the exchange)."""
    exchange = strategy.workload.kv_exchange
    if exchange == "ring":
        return ring_traffic(strategy, axis, heads, kv_heads)
    if exchange == "ulysses":
        return ulysses_traffic(strategy, axis, heads, kv_heads)
    return kv_gather_traffic(strategy, axis, kv_heads)


def ring_traffic(strategy: Strategy, axis: str, heads: int, kv_heads: int) -> list[Traffic]:
    """tspbench.dist.ring per layer: Σ-1 K/V passes forward, each under one block of 2C^2 scores
    (4 FLOPs per score and head dimension: QK^T and PV); in backward Σ-1 K/V passes and Σ dK/dV
    passes (float32 at least), a pair in flight under each block's backward (2x its forward),
    the last dK/dV pass (home) exposed."""
    w, cfg, parts = strategy.workload, strategy.config, strategy.mesh.size(axis)
    tokens, L = strategy.local_seq, cfg.n_layers
    per_chunk = strategy.local_batch * tokens * kv_heads * cfg.head_dim
    kv, grads = 2 * per_chunk * w.element_size, 2 * per_chunk * max(w.element_size, 4)
    block = 2.0 * strategy.local_batch * tokens * tokens * heads * cfg.head_dim
    fwd, bwd = dict(hidden=True, window="ring forward"), dict(hidden=True, window="ring backward")
    out = [Traffic("send_recv", (axis,), kv, (parts - 1) * L, "forward", "core", window_flops=block, **fwd)]
    if w.mode == "train":  # a recomputed forward keeps its own window: it runs before the backward
        out += [
            Traffic("send_recv", (axis,), kv, (parts - 1) * L, "backward", window_flops=2 * block, **bwd),
            Traffic("send_recv", (axis,), grads, (parts - 1) * L, "backward", window_flops=2 * block, **bwd),
            Traffic("send_recv", (axis,), grads, L, "backward"),
        ]
    return out


def ulysses_traffic(strategy: Strategy, axis: str, heads: int, kv_heads: int) -> list[Traffic]:
    """tspbench.dist.ulysses per layer: q, k, v to head shards and o back, one all-to-all each
    way; backward the same two. Message: the local tokens of every head moved, [B, S/Σ, .].
    Selective recomputation re-runs the first only: the core's checkpoint stops once attention's
    saved tensors are back, and nothing after it saves any; full and op re-run both."""
    w, cfg = strategy.workload, strategy.config
    row = strategy.local_batch * strategy.local_seq * cfg.head_dim * w.element_size
    L, out = cfg.n_layers, []
    for phase in ("forward", "backward") if w.mode == "train" else ("forward",):
        out += [
            Traffic("all_to_all", (axis,), row * (heads + 2 * kv_heads), L, phase, "core"),
            Traffic("all_to_all", (axis,), row * heads, L, phase, "block"),
        ]
    return out


def check_kv_exchange(layout: Layout, workload: Workload, axis: str, heads: int, kv_heads: int) -> None:
    """Refuse Ulysses where the heads a rank holds do not split over the sequence degree."""
    if workload.kv_exchange == "ulysses":
        problem = heads_problem(heads, kv_heads, layout.degree(axis))
        if problem:
            raise LayoutError(f"kv_exchange ulysses: {problem}")


def zigzag_attention(model: Transformer, group: Group, exchange: str = "allgather") -> None:
    """Every layer's attention over tokens sharded zigzag on ``group``: K/V exchanged for the
    prefill and training by ``exchange`` (CORES), the sequence-sharded cache for decode
    (ShardedDecodeAttention)."""
    for layer in model.layers:
        layer.attention.core = CORES[exchange](group)
        layer.attention.cached_core = ShardedDecodeAttention(group)


def zigzag_extra_bytes(strategy: Strategy) -> int:
    """Element-wise bytes the zigzag attention core adds over a step's layers (its forward runs
    again in backward under recomputation; no backward in a forward)."""
    w, s = strategy.workload, strategy.shapes()
    forwards = recomputed_forwards(w.mode, w.recompute)
    block = zigzag_attention_bytes(s) if w.kv_exchange == "allgather" else exchange_bytes(s)
    return over_step(strategy.config.n_layers, w.mode, forwards, block)


def exchange_bytes(s: Shapes) -> tuple[int, int]:
    """(forward, backward) element-wise bytes a ring or Ulysses core adds to a block, counted
    from the code (tspbench/dist/ring.py, ulysses.py), not measured op by op. Ring: K/V
    stacked 4e T kv, each of D - 1 merges ~6s per output element, o cast and transposed 4e T q;
    backward K/V stacked again, per step dq and dK/dV accumulated 3s T (q + 2 kv), the gradients
    cast 2e T (q + 2 kv). Ulysses: q, k, v packed, made contiguous and put in sequence order
    6e T (q + 2 kv), o cut back, flattened and transposed 6e T q; backward the mirror."""
    if s.kv_parts == 1:
        return 0, 0
    e, f, t, q, kv, d = s.elt, s.stat, s.batch * s.tokens, s.q, s.kv, s.kv_parts
    if s.kv_exchange == "ring":
        forward = 4 * e * t * kv + (d - 1) * 6 * f * t * q + 4 * e * t * q
        return forward, 4 * e * t * kv + (d - 1) * 3 * f * t * (q + 2 * kv) + 2 * e * t * (q + 2 * kv)
    moved = 6 * e * t * (q + 2 * kv) + 6 * e * t * q
    return moved, moved


class ExchangesKV(Strategy):
    """Tokens sharded zigzag over the "sp" axis, K/V exchanged as the workload's ``kv_exchange``
    says: the check, the attention cores and the shapes sp and fsdp_sp share (a base, never
    registered itself)."""

    switches = ("kv_exchange",)

    @classmethod
    def check(cls, layout: Layout, workload: Workload) -> None:
        super().check(layout, workload)
        cfg = workload.model
        check_kv_exchange(layout, workload, "sp", cfg.n_heads, cfg.n_kv_heads)

    def transform(self, model: Transformer) -> None:
        zigzag_attention(model, self.group("sp"), self.workload.kv_exchange)

    def shapes(self) -> Shapes:
        return replace(super().shapes(), kv_exchange=self.workload.kv_exchange)


@register
class SequenceParallel(ExchangesKV):
    name = "sp"
    axes = ("sp",)
    sequence_axis = "sp"
    summary = "sequence parallel: tokens split zigzag, weights replicated, K/V exchanged"

    def traffic(self) -> list[Traffic]:
        return kv_exchange_traffic(self, "sp", self.config.n_heads, self.config.n_kv_heads)

    def elementwise_extra_bytes(self) -> int:
        return zigzag_extra_bytes(self)

    def decode_traffic(self) -> list[Traffic]:
        return self.query_traffic("sp", self.config.n_heads, self.config.n_layers)
