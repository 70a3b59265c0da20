"""TP+SP: a T x Σ mesh per replica, tensor parallel inside (innermost, tp) and sequence parallel
across (sp). Tokens are zigzag-sharded over sp; weights are TP-sharded and replicated over sp.

Per rank: TP's weight shards; tokens [B, S/Σ]. Collectives: TP's (on [B, S/Σ, h] messages,
group T) plus SP's K/V exchange (``kv_exchange``) of the local heads (n/T, m/T per rank, group
Σ; Ulysses needs both divisible by Σ). Gradients are all-reduced over (dp, sp).

Decode: the cache holds the rank's m/T heads at its sequence positions; new tokens are
batch-sharded over sp; a step is TP's (on [b, 1, h], group T) plus the sharded-cache attention
of the local n/T heads over sp (tspbench.dist.decode).
"""

from __future__ import annotations

from dataclasses import replace

from tspbench.strategies.sp import (
    check_kv_exchange,
    kv_exchange_traffic,
    zigzag_attention,
    zigzag_extra_bytes,
)
from tspbench.strategies.tp import TensorParallel

from tspbench.core.spec import Layout, Workload
from tspbench.costs.memory import Shapes
from tspbench.model.transformer import Transformer
from tspbench.strategy import Traffic, register


@register
class TensorSequenceParallel(TensorParallel):
    name = "tp_sp"
    axes = ("sp", "tp")
    sequence_axis = "sp"
    vocab_axis = "tp"
    summary = "2-D mesh: tensor parallel (T, inner) x sequence parallel (Σ, outer)"
    switches = ("megatron_sp", "kv_exchange")

    @classmethod
    def check(cls, layout: Layout, workload: Workload) -> None:
        super().check(layout, workload)
        cfg, t = workload.model, layout.tp
        check_kv_exchange(layout, workload, "sp", cfg.n_heads // t, cfg.n_kv_heads // t)

    def transform(self, model: Transformer) -> None:
        super().transform(model)
        zigzag_attention(model, self.group("sp"), self.workload.kv_exchange)

    def shapes(self) -> Shapes:
        return replace(super().shapes(), kv_exchange=self.workload.kv_exchange)

    def traffic(self) -> list[Traffic]:
        t = self.mesh.size("tp")
        heads, kv_heads = self.config.n_heads // t, self.config.n_kv_heads // t
        return super().traffic() + kv_exchange_traffic(self, "sp", heads, kv_heads)

    def elementwise_extra_bytes(self) -> int:
        return super().elementwise_extra_bytes() + zigzag_extra_bytes(self)

    def decode_traffic(self) -> list[Traffic]:
        heads = self.config.n_heads // self.mesh.size("tp")
        return super().decode_traffic() + self.query_traffic("sp", heads, self.config.n_layers)
