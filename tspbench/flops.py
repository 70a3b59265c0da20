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
