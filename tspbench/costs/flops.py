"""Model FLOPs: the one convention MFU and TFLOP/s use.

Counted: every matrix multiply (2 m n k) of the model - Q, K, V and output projections, the
three gated-MLP projections, the LM head - and attention's two S x S products with the causal
triangle counted as HALF the square (S^2 / 2 query-key pairs per head: the work a causal flash
kernel does, as Megatron-LM counts it; torchtitan counts the whole square, which gives 1.33x
higher MFU at 32K tokens on a 7B model). Not counted: norms, RoPE, softmax, the embedding
lookup, the optimizer, and recomputation (model FLOPs are the same for every strategy and
recomputation mode; the analytic model reports hardware FLOPs, recomputation included,
separately). Training = 3 x forward (backward = 2 x forward).

Recomputation in hardware FLOPs (``autograd_flops``): selective re-runs the attention core;
full re-runs the block's forward up to its last saving op; op (torchtitan's per-op policy,
tspbench.model.recompute) re-runs the 2nd, 4th, 6th mm of the block and keeps the attention
kernels' outputs, so no attention FLOPs are repeated (``op_recomputed_gemm``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tspbench.core.spec import ModelConfig
from tspbench.costs.memory import Shapes, block_mm_calls


def attention_flops_per_layer(cfg: ModelConfig, seq_len: int) -> float:
    """Forward FLOPs of one layer's QK^T and PV over ``seq_len`` tokens, the causal half."""
    return 2 * 2 * cfg.n_heads * cfg.head_dim * seq_len * seq_len / 2


def forward_flops_per_sequence(cfg: ModelConfig, seq_len: int) -> float:
    """Forward model FLOPs of one sequence of ``seq_len`` tokens."""
    h, s = cfg.hidden, seq_len
    projections = 2 * s * h * (2 * h + 2 * cfg.kv_hidden)  # Q, O (h x h), K, V (h x kv)
    mlp = 2 * s * h * cfg.ffn_hidden * 3
    head = 2 * s * h * cfg.vocab_size
    return cfg.n_layers * (projections + mlp + attention_flops_per_layer(cfg, s)) + head


def model_flops_per_step(cfg: ModelConfig, n_seqs: int, seq_len: int, mode: str) -> float:
    """Model FLOPs of one step over ``n_seqs`` sequences (train: forward + backward)."""
    factor = 3 if mode == "train" else 1
    return factor * n_seqs * forward_flops_per_sequence(cfg, seq_len)


# What a record's MFU counts, in its own words (MFU figures are only comparable under one convention).
MODEL_FLOP_CONVENTION = (
    "model FLOPs: every matrix multiply of the model, causal attention as half the S x S square "
    "(Megatron-LM's convention), training 3 x forward, recomputation not counted"
)


def mfu(model_flops: float, step_s: float, world_size: int, peak_tflops: float) -> float:
    """Model FLOPs utilization: model FLOPs per second per device over the device's peak."""
    return model_flops / (step_s * world_size * peak_tflops * 1e12)


# ----------------------------------------------------------------------------- hardware FLOPs


@dataclass
class FlopTerms:
    """Hardware FLOPs of one step on one rank: what the kernels are asked to do.

    ``causal_fraction`` of the attention FLOPs come from square causal blocks (a query chunk
    against its own keys), which a flash kernel computes at half their counted cost; the rest
    are rectangles (a query chunk against the keys before it). The time model rates them apart.
    """

    gemm: float
    attention: float
    causal_fraction: float = 1.0
    causal_block: int = 0  # tokens per side of the square causal blocks (0: unknown)

    @property
    def total(self) -> float:
        return self.gemm + self.attention


def zigzag_rectangle(tokens: int, seq: int, parts: int, exchange: str = "allgather") -> float:
    """Query x key area one rank's attention calls cover: T^2 unsharded (a dense causal call is
    counted whole), C^2 (2P + 1) with zigzag chunks of C = S / 2P (the same on every rank).
    A ring (tspbench.dist.ring): its 2C square and P - 1 blocks of 2C^2, C^2 (2P + 2). Ulysses:
    the whole causal square S^2 for 1/P of the heads, counted here per rank's heads: 4P C^2."""
    if parts == 1:
        return float(tokens * tokens)
    c = seq / (2 * parts)
    extra = {"ring": 1.0, "ulysses": 2 * parts - 1.0}.get(exchange, 0.0)
    return c * c * (2 * parts + 1 + extra)


def causal_block(tokens: int, seq: int, parts: int, exchange: str = "allgather") -> int:
    """Tokens per side of a rank's square causal blocks: the local sequence unsharded, a zigzag
    chunk C = S / 2P otherwise; the ring's local pair 2C; Ulysses' whole sequence."""
    if parts == 1:
        return tokens
    return {"ring": seq // parts, "ulysses": seq}.get(exchange, seq // (2 * parts))


def causal_fraction(parts: int, exchange: str = "allgather") -> float:
    """The share of zigzag_rectangle in square causal blocks: all of it unsharded; with zigzag
    chunks each of the two local chunks has one C x C diagonal block, 2 of the 2P + 1 C^2; the
    ring's 2C square is 4 of 2P + 2; Ulysses' one square is all of it."""
    if parts == 1 or exchange == "ulysses":
        return 1.0
    return 4 / (2 * parts + 2) if exchange == "ring" else 2 / (2 * parts + 1)


def qkv_gemm_flops(s: Shapes) -> float:
    """Forward FLOPs of a block's q, k, v projections on B x T local tokens (the rank's widths)."""
    return 2 * s.batch * s.tokens * s.hidden * (s.q + 2 * s.kv)


def block_gemm_flops(s: Shapes, q: int, kv: int, ffn: int) -> tuple[float, float]:
    """Forward GEMM FLOPs of one block's (attention, MLP) on B x T local tokens."""
    return rows_gemm_flops(s.batch * s.tokens, s.hidden, q, kv, ffn)


def rows_gemm_flops(rows: int, hidden: int, q: int, kv: int, ffn: int) -> tuple[float, float]:
    """Forward GEMM FLOPs of one block's (attention, MLP) on ``rows`` tokens: the q, k, v and
    output projections at widths q, kv (2 m n k each) and the three MLP projections at ffn."""
    return 2 * rows * hidden * (2 * q + 2 * kv), 6 * rows * hidden * ffn


@dataclass(frozen=True)
class ForwardFlops:
    """Forward hardware FLOPs of one rank's pieces: a block's attention and MLP GEMMs, a block's
    attention core (the rectangles its calls cover) and the LM head; ``layers`` blocks."""

    attn_gemm: float
    mlp_gemm: float
    core: float
    head: float
    layers: int
    causal_fraction: float = 1.0
    causal_block: int = 0

    @classmethod
    def of(cls, s: Shapes) -> ForwardFlops:
        """Whole local widths (q, kv, ffn, vocab as the Shapes hold them) on the local tokens."""
        attn_gemm, mlp_gemm = block_gemm_flops(s, s.q, s.kv, s.ffn)
        ex, parts = s.kv_exchange, s.kv_parts
        core = 4 * s.batch * s.heads * (s.q // s.heads) * zigzag_rectangle(s.tokens, s.seq, parts, ex)
        head = 2 * s.batch * s.tokens * s.hidden * s.vocab
        block = causal_block(s.tokens, s.seq, parts, ex)
        return cls(attn_gemm, mlp_gemm, core, head, s.layers, causal_fraction(parts, ex), block)

    @property
    def blocks_gemm(self) -> float:
        return self.layers * (self.attn_gemm + self.mlp_gemm)

    def prefill(self) -> FlopTerms:
        return self.terms(self.blocks_gemm + self.head, self.layers * self.core)

    def terms(self, gemm: float, attention: float) -> FlopTerms:
        return FlopTerms(gemm, attention, self.causal_fraction, self.causal_block)


def op_recomputed_gemm(s: Shapes, calls: list[tuple[int, int]]) -> float:
    """Forward FLOPs of the mm calls of one block that op-level recomputation re-runs: the 2nd,
    4th, 6th ... of ``calls`` ((k, n) in call order, tspbench.costs.memory.block_mm_calls), the
    others' outputs being kept (tspbench.model.recompute)."""
    return sum(2 * s.batch * s.tokens * k * n for k, n in calls[1::2])


def op_kept_gemm(s: Shapes, calls: list[tuple[int, int]]) -> float:
    """Forward FLOPs of the mm calls whose outputs op-level recomputation keeps (1st, 3rd, ...)."""
    return sum(2 * s.batch * s.tokens * k * n for k, n in calls[::2])


def autograd_flops(s: Shapes, mode: str, recompute: str) -> FlopTerms:
    """dp, tp, sp, tp_sp: backward = 2x forward GEMMs and 2.5x forward attention (flash
    backward recomputes the scores); selective recomputation re-runs the attention core, full
    re-runs the block's forward up to its last saving op (the MLP output GEMM is skipped), op
    re-runs 3 of its 7 GEMMs (wk, wo, w3) and never the attention core (its outputs are kept)."""
    f = ForwardFlops.of(s)
    if mode != "train":
        return f.prefill()
    gemm, attention = 3 * (f.blocks_gemm + f.head), 3.5 * f.layers * f.core
    if recompute in ("selective", "full"):
        attention += f.layers * f.core
    if recompute == "full":
        gemm += f.layers * (f.attn_gemm + f.mlp_gemm * 2 / 3)
    if recompute == "op":
        gemm += f.layers * op_recomputed_gemm(s, block_mm_calls(s))
    return f.terms(gemm, attention)
