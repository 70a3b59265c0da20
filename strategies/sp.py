"""SP: tokens sharded zigzag over Σ ranks, weights replicated, K/V all-gathered for attention.

Per rank: the whole model; tokens [B, S/Σ] (chunks p and 2Σ-1-p, at their true positions for
RoPE). Collectives (forward / backward), per layer:

    K, V   all-gather [Σ, B, m, S/Σ, d] -> [B, m, S, d] / reduce-scatter back    (attention core)

Every gradient is all-reduced over (dp, sp) after backward. Selective recomputation re-runs the
attention core, K/V gather included; full recomputation re-runs the whole block.

Decode (tspbench.dist.decode): the prefill caches each rank's context K/V of every sequence; new
tokens are batch-sharded over sp (sequence i on rank i mod Σ); per layer and step the queries
are all-gathered, every rank attends them to its context shard, and the partials are sent to
their owners (all-to-all) and merged by log-sum-exp.
"""

from __future__ import annotations

from tspbench.costs.elementwise import over_step, recomputed_forwards, zigzag_attention_bytes
from tspbench.dist.comm import Group
from tspbench.dist.decode import ShardedDecodeAttention
from tspbench.dist.zigzag import ZigzagAttention
from tspbench.model.transformer import Transformer
from tspbench.strategy import Strategy, Traffic, register


def kv_gather_traffic(strategy: Strategy, axis: str, kv_heads: int) -> list[Traffic]:
    """The K and V all-gathers of every layer over ``axis`` and their backward reduce-scatters."""
    msg = strategy.local_batch * strategy.workload.seq_len * kv_heads * strategy.config.head_dim
    msg *= strategy.workload.element_size
    count = 2 * strategy.config.n_layers
    out = [Traffic("all_gather", (axis,), msg, count, "forward", "core")]
    if strategy.workload.mode == "train":
        out.append(Traffic("reduce_scatter", (axis,), msg, count, "backward"))
    return out


def zigzag_attention(model: Transformer, group: Group) -> None:
    """Every layer's attention over tokens sharded zigzag on ``group``: K/V all-gathered for the
    prefill and training (ZigzagAttention), the sequence-sharded cache for decode
    (ShardedDecodeAttention)."""
    for layer in model.layers:
        layer.attention.core = ZigzagAttention(group)
        layer.attention.cached_core = ShardedDecodeAttention(group)


def zigzag_extra_bytes(strategy: Strategy) -> int:
    """Element-wise bytes the zigzag attention core adds over a step's layers (its forward runs
    again in backward under recomputation; no backward in a forward)."""
    w = strategy.workload
    forwards = recomputed_forwards(w.mode, w.recompute)
    return over_step(strategy.config.n_layers, w.mode, forwards, zigzag_attention_bytes(strategy.shapes()))


@register
class SequenceParallel(Strategy):
    name = "sp"
    axes = ("sp",)
    sequence_axis = "sp"
    summary = "sequence parallel: tokens split zigzag, weights replicated, K/V all-gathered"

    def transform(self, model: Transformer) -> None:
        zigzag_attention(model, self.group("sp"))

    def traffic(self) -> list[Traffic]:
        return kv_gather_traffic(self, "sp", self.config.n_kv_heads)

    def elementwise_extra_bytes(self) -> int:
        return zigzag_extra_bytes(self)

    def decode_traffic(self) -> list[Traffic]:
        return self.query_traffic("sp", self.config.n_heads, self.config.n_layers)
