"""TP+SP: a T x Σ mesh per replica, tensor parallel inside (innermost, tp) and sequence parallel
across (sp). Tokens are zigzag-sharded over sp; weights are TP-sharded and replicated over sp.

Per rank: TP's weight shards; tokens [B, S/Σ]. Collectives: TP's (on [B, S/Σ, h] messages,
group T) plus SP's K/V gathers of the local heads (m/T per rank, group Σ). Gradients are
all-reduced over (dp, sp).

Decode: the cache holds the rank's m/T heads at its sequence positions; new tokens are
batch-sharded over sp; a step is TP's (on [b, 1, h], group T) plus the sharded-cache attention
of the local n/T heads over sp (tspbench.dist.decode).
"""

from __future__ import annotations

from tspbench.strategies.sp import kv_gather_traffic, zigzag_attention, zigzag_extra_bytes
from tspbench.strategies.tp import TensorParallel

from tspbench.model.transformer import Transformer
from tspbench.strategy import Traffic, register


@register
class TensorSequenceParallel(TensorParallel):
    name = "tp_sp"
    axes = ("sp", "tp")
    sequence_axis = "sp"
    vocab_axis = "tp"
    summary = "2-D mesh: tensor parallel (T, inner) x sequence parallel (Σ, outer)"

    def transform(self, model: Transformer) -> None:
        super().transform(model)
        zigzag_attention(model, self.group("sp"))

    def traffic(self) -> list[Traffic]:
        kv_heads = self.config.n_kv_heads // self.mesh.size("tp")
        return super().traffic() + kv_gather_traffic(self, "sp", kv_heads)

    def elementwise_extra_bytes(self) -> int:
        return super().elementwise_extra_bytes() + zigzag_extra_bytes(self)

    def decode_traffic(self) -> list[Traffic]:
        heads = self.config.n_heads // self.mesh.size("tp")
        return super().decode_traffic() + self.query_traffic("sp", heads, self.config.n_layers)
