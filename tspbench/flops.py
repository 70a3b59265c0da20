"""Model FLOPs: the one convention MFU and TFLOP/s use.

Counted: every matrix multiply (2 m n k) of the model - Q, K, V and output projections, the
three gated-MLP projections, the LM head - and attention's two S x S products with the causal
triangle counted as HALF the square (S^2 / 2 query-key pairs per head: the work a causal flash
kernel does, as Megatron-LM counts it; torchtitan counts the whole square, which gives ~1.4x
higher MFU at 32K tokens on a 7B model). Not counted: norms, RoPE, softmax, the embedding
lookup, the optimizer, and recomputation (model FLOPs are the same for every strategy and
recomputation mode; the analytic model reports hardware FLOPs, recomputation included,
separately). Training = 3 x forward (backward = 2 x forward).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.flop_counter import register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count

from tspbench.memory_model import Shapes
from tspbench.model import ModelConfig


def forward_flops_per_sequence(cfg: ModelConfig, seq_len: int) -> float:
    """Forward model FLOPs of one sequence of ``seq_len`` tokens."""
    h, s = cfg.hidden, seq_len
    projections = 2 * s * h * (2 * h + 2 * cfg.kv_hidden)  # Q, O (h x h), K, V (h x kv)
    mlp = 2 * s * h * cfg.ffn_hidden * 3
    attention = 2 * 2 * cfg.n_heads * cfg.head_dim * s * s / 2  # QK^T and PV, causal half
    head = 2 * s * h * cfg.vocab_size
    return cfg.n_layers * (projections + mlp + attention) + head


def model_flops_per_step(cfg: ModelConfig, n_seqs: int, seq_len: int, mode: str) -> float:
    """Model FLOPs of one step over ``n_seqs`` sequences (train: forward + backward)."""
    factor = 3 if mode == "train" else 1
    return factor * n_seqs * forward_flops_per_sequence(cfg, seq_len)


# ----------------------------------------------------------------------------- hardware FLOPs


@dataclass
class FlopTerms:
    """Hardware FLOPs of one step on one rank: what the kernels are asked to do."""

    gemm: float
    attention: float

    @property
    def total(self) -> float:
        return self.gemm + self.attention


def zigzag_rectangle(tokens: int, seq: int, parts: int) -> float:
    """Query x key area one rank's attention calls cover: T^2 unsharded (a dense causal call is
    counted whole), C^2 (2P + 1) with zigzag chunks of C = S / 2P (the same on every rank)."""
    if parts == 1:
        return float(tokens * tokens)
    c = seq / (2 * parts)
    return c * c * (2 * parts + 1)


def block_gemm_flops(s: Shapes, q: int, kv: int, ffn: int) -> tuple[float, float]:
    """Forward GEMM FLOPs of one block's (attention, MLP) on B x T local tokens."""
    bt = s.batch * s.tokens
    return 2 * bt * s.hidden * (2 * q + 2 * kv), 6 * bt * s.hidden * ffn


def autograd_flops(s: Shapes, mode: str, recompute: str) -> FlopTerms:
    """dp, tp, sp, tp_sp: backward = 2x forward GEMMs and 2.5x forward attention (flash
    backward recomputes the scores); selective recomputation re-runs the attention core, full
    re-runs the block's forward up to its last saving op (the MLP output GEMM is skipped)."""
    attn_gemm, mlp_gemm = block_gemm_flops(s, s.q, s.kv, s.ffn)
    core = 4 * s.batch * s.heads * (s.q // s.heads) * zigzag_rectangle(s.tokens, s.seq, s.kv_parts)
    head = 2 * s.batch * s.tokens * s.hidden * s.vocab
    L = s.layers
    if mode != "train":
        return FlopTerms(L * (attn_gemm + mlp_gemm) + head, L * core)
    gemm, attention = 3 * (L * (attn_gemm + mlp_gemm) + head), 3.5 * L * core
    if recompute in ("selective", "full"):
        attention += L * core
    if recompute == "full":
        gemm += L * (attn_gemm + mlp_gemm * 2 / 3)
    return FlopTerms(gemm, attention)


_REGISTERED = False


def register_cpu_attention_flops() -> None:
    """Teach torch's FlopCounterMode the ops it misses: the CPU flash-attention kernels (it counts
    only GPU ones) and in-place ``addmm_`` (TSP accumulates its output projections with it)."""
    global _REGISTERED
    forward = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if _REGISTERED or forward is None or backward is None:
        return

    @register_flop_formula(torch.ops.aten.addmm_)
    def _addmm_(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]

    @register_flop_formula(forward)
    def _forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query_shape, key_shape, value_shape)

    @register_flop_formula(backward)
    def _backward(
        grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
    ) -> int:
        return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)

    _REGISTERED = True
