"""TSP: tensor and sequence parallelism folded onto ONE axis of D ranks (arXiv 2604.26294).

Rank p holds 1/D of every weight AND 1/D of the tokens:

    attention   packed [Wq_p; Wk_p; Wv_p; Wo_p^T]  [2 (n + m) d / D, h]   heads block p
    MLP         packed [W1_p; W3_p; W2_p^T]         [3 f / D, h]          columns/rows p
    embedding, LM head                              [V / D, h]            vocabulary block p
    norms       replicated (their gradients all-reduced over dp x tsp)
    tokens      zigzag chunks p and 2D-1-p          [B, S / D]

Attention runs the broadcast schedule (strategies/tsp_attention.py): owners broadcast their
packed shard, every rank projects its own tokens, K/V of one head block are all-gathered over
the sequence, and the output projection accumulates locally. The MLP, embedding and LM head run
the ring schedule (strategies/tsp_ring.py): shards circulate with async send/recv overlapped
with the GEMMs, gradient accumulators ride home behind them. No activation is all-reduced.

Weights move on channel 1 of the tsp group, K/V and gradients on channel 0, so on NCCL the two
streams proceed side by side. ``overlap=False`` issues every transfer blocking (same math).
Recomputation: ``full`` checkpoints the block (the broadcasts, gathers and ring shifts of its
forward repeat in backward); ``selective`` equals ``none`` here, because the attention core is
always recomputed in backward (keeping it would keep K/V of every head block).
"""

from __future__ import annotations

from strategies.tsp_attention import AttentionSpec, TSPAttention
from strategies.tsp_ring import Ring, RingEmbedding, RingHead, RingMLP
from tspbench.mesh import Layout
from tspbench.model import Transformer
from tspbench.strategy import Piece, Placement, Strategy, Traffic, Workload, divisible, register


def _packed(prefix: str, names: tuple[str, ...], transposed: str) -> tuple[Piece, ...]:
    return tuple(Piece(f"{prefix}{n}.weight", 1 if n == transposed else 0, n == transposed) for n in names)


@register
class FoldedParallel(Strategy):
    name = "tsp"
    axes = ("tsp",)
    sequence_axis = "tsp"
    channels = 2
    weight_axes = ("tsp",)
    summary = "folded tensor+sequence parallel: 1/D of every weight and 1/D of the tokens per rank"

    @classmethod
    def check(cls, layout: Layout, workload: Workload) -> None:
        super().check(layout, workload)
        cfg, d = workload.model, layout.tsp
        divisible(cfg.n_heads, d, "n_heads", "tsp")
        divisible(cfg.n_kv_heads, d, "n_kv_heads", "tsp")
        divisible(cfg.ffn_hidden, d, "ffn_hidden", "tsp")
        divisible(cfg.vocab_size, d, "vocab_size", "tsp")

    def placement(self, name: str, shape: tuple[int, ...]) -> Placement:
        if "norm" in name:
            return Placement((Piece(name),), reduce=("dp", "tsp"))
        prefix = name.removesuffix("shard")
        if name.endswith("attention.shard"):
            pieces = _packed(prefix, ("wq", "wk", "wv", "wo"), "wo")
        elif name.endswith("mlp.shard"):
            pieces = _packed(prefix, ("w1", "w3", "w2"), "w2")
        else:  # embed.weight, head.weight: vocabulary blocks
            pieces = (Piece(name, 0),)
        return Placement(pieces, axis="tsp", reduce=("dp",))

    def transform(self, model: Transformer) -> None:
        cfg, d = self.config, self.mesh.size("tsp")
        kv_group, w_group = self.group("tsp"), self.group("tsp", channel=1)
        overlap = self.workload.overlap
        spec = AttentionSpec(cfg.hidden // d, cfg.kv_hidden // d, cfg.head_dim, kv_group, w_group, overlap)
        ring = Ring(w_group, kv_group, overlap)
        for layer in model.layers:
            layer.attention = TSPAttention(spec.rows, cfg.hidden, spec)
            layer.mlp = RingMLP(3 * cfg.ffn_hidden // d, cfg.hidden, ring)
        model.embed = RingEmbedding(cfg.vocab_size // d, cfg.hidden, ring)
        model.head = RingHead(cfg.vocab_size // d, cfg.hidden, ring)

    def traffic(self) -> list[Traffic]:
        cfg, d, elt, L = self.config, self.mesh.size("tsp"), self.workload.element_size, self.config.n_layers
        train = self.workload.mode == "train"
        attn_shard = (2 * cfg.hidden + 2 * cfg.kv_hidden) // d * cfg.hidden * elt
        kv = 2 * self.local_batch * self.workload.seq_len * cfg.kv_hidden // d * elt
        mlp_shard = 3 * cfg.ffn_hidden // d * cfg.hidden * elt
        vocab_shard = cfg.vocab_size // d * cfg.hidden * elt
        out = [
            Traffic("broadcast", d, attn_shard, d * L, "forward", "block"),
            Traffic("all_gather", d, kv, d * L, "forward", "block"),
            Traffic("send_recv", d, mlp_shard, (d - 1) * L, "forward", "block"),
            Traffic("send_recv", d, vocab_shard, 2 * (d - 1), "forward", "model"),  # embedding, head
        ]
        if train:
            out += [
                Traffic("broadcast", d, attn_shard, d * L, "backward"),
                Traffic("all_gather", d, kv, d * L, "backward"),
                Traffic("reduce_scatter", d, kv, d * L, "backward"),
                Traffic("reduce", d, attn_shard, d * L, "backward"),
                Traffic("send_recv", d, mlp_shard, (2 * d - 1) * L, "backward"),  # shards + accumulators
                Traffic("send_recv", d, vocab_shard, d, "backward"),  # embedding accumulators
                Traffic("send_recv", d, vocab_shard, 2 * d - 1, "backward"),  # head shards + accumulators
            ]
        return out
