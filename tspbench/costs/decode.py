"""Decode cost terms: the KV cache, a decode step's FLOPs, element-wise bytes and working memory,
per rank.

Pure functions of the model, the rank's degrees, the context S, the batch B, the decode tokens N
and the element size, written to the shared spec of issue #15 (decode with a KV cache). The
degrees come from the strategy (tspbench.strategy.decode.Decoding.decode_shape), as do a step's
collectives (each plugin's ``decode_traffic``) and what its step holds beyond its own widths
(``decode_held_widths``, ``decode_weights_bytes``); nothing here knows a strategy by name. Per
model replica:

    P   sequence degree: ranks the cache's context (and the new tokens' slots) are sharded over
    T   tensor degree: ranks the attention heads (and the cache's) are split over
    b   slots per rank: ceil(B / P) with P > 1 (sequence b on rank b mod P, padded), else B

    cache per rank   2 L m_loc d (B S / P + b N) x elt      m_loc = m / T
    a decode step    one new token per slot: projections, MLP and head on b rows with the
                     rank's widths (every shard that visits counts: whole widths); attention of
                     P b queries to the rank's S / P context positions plus the owner's tail
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tspbench.core.names import DTYPE_BYTES
from tspbench.core.spec import ModelConfig
from tspbench.costs.flops import rows_gemm_flops

ELEMENTWISE_PASSES = 4  # passes over a step's [rows, h] and [rows, ffn] tensors per layer
# The ops with a kernel (every aten op but views) of one decode step of the model on one rank
# holding whole sequences, in bf16: per layer, and outside the layers (embedding, RoPE's angles,
# the final norm, the head). tests/analytic/test_decode.py counts them on the model itself. On one
# H200 a graphed step of the 7B ran 1,495 kernels against the 1,303 counted here (cuBLAS and
# SDPA launch a few more than one kernel per op; results/h200/2026-12-04_149a5a5).
KERNELS_PER_LAYER, KERNELS_OUTSIDE_LAYERS = 40, 23


@dataclass(frozen=True)
class DecodeShape:
    """One rank's decode: its degrees, the sizes and the element size."""

    seq_parts: int  # P
    tensor_parts: int  # T
    batch: int  # B sequences per replica (fsdp: per rank, as its micro-batch)
    context: int  # S
    decode_tokens: int  # N
    dtype: str

    @property
    def elt(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def slots(self) -> int:
        """Rows of a rank's decode GEMMs: ceil(B / P) owned slots, or all B sequences with P = 1."""
        return math.ceil(self.batch / self.seq_parts)

    @property
    def partial_elt(self) -> int:
        """Bytes per element of the attention partials and their log-sum-exp (float32 at least)."""
        return max(self.elt, 4)


@dataclass(frozen=True)
class Widths:
    """What a rank's decode GEMMs span: query/KV heads attended, MLP width, vocabulary rows."""

    q_heads: int
    kv_heads: int
    ffn: int
    vocab: int


def widths(cfg: ModelConfig, s: DecodeShape) -> Widths:
    """The tensor degree splits heads, MLP and vocabulary; else whole widths (sharded weights
    that visit in turn still compute them all)."""
    t = s.tensor_parts
    return Widths(cfg.n_heads // t, cfg.n_kv_heads // t, cfg.ffn_hidden // t, cfg.vocab_size // t)


def kv_cache_bytes(cfg: ModelConfig, s: DecodeShape) -> int:
    """K and V of every layer a rank holds: context [B, m_loc, S/P, d] and tail [b, m_loc, N, d]."""
    m_loc, d = widths(cfg, s).kv_heads, cfg.head_dim
    positions = s.batch * (s.context // s.seq_parts) + s.slots * s.decode_tokens
    return 2 * cfg.n_layers * m_loc * d * positions * s.elt


def gemm_weight_bytes(cfg: ModelConfig, s: DecodeShape) -> int:
    """Bytes of the weight matrices a rank's decode GEMMs read in one step (the embedding is a
    lookup of b rows, not a GEMM): its tensor shard of every one (sharded weights all visit)."""
    w = widths(cfg, s)
    h, d = cfg.hidden, cfg.head_dim
    block = h * d * (2 * w.q_heads + 2 * w.kv_heads) + 3 * h * w.ffn
    return (cfg.n_layers * block + w.vocab * h) * s.elt


@dataclass(frozen=True)
class DecodeFlops:
    """Hardware FLOPs of one rank's decode step, and the bytes its kernels must read."""

    gemm: float
    attention: float
    weight_bytes: int  # weight matrices the GEMMs read
    cache_bytes: int  # K/V the attention reads (the context and the tail filled so far)


def decode_kernels(cfg: ModelConfig) -> int:
    """Kernels one decode step launches on a rank (KERNELS_PER_LAYER per layer and the rest)."""
    return cfg.n_layers * KERNELS_PER_LAYER + KERNELS_OUTSIDE_LAYERS


def decode_flops(cfg: ModelConfig, s: DecodeShape, step: int) -> DecodeFlops:
    """Step ``step`` (0-based: the token at position S + step): every block's GEMMs on b rows at
    the rank's widths (tspbench.costs.flops, as training counts them) and the head's, attention
    4 d per (query head, key) pair, as FlopCounterMode counts SDPA: P b queries to S / P context
    keys plus each owned slot to its tail (step + 1 keys)."""
    w, h, d = widths(cfg, s), cfg.hidden, cfg.head_dim
    rows = s.slots
    block = sum(rows_gemm_flops(rows, h, w.q_heads * d, w.kv_heads * d, w.ffn))
    gemm = cfg.n_layers * block + 2 * rows * h * w.vocab
    pairs = s.seq_parts * rows * (s.context // s.seq_parts) + rows * (step + 1)
    attention = cfg.n_layers * 4 * w.q_heads * d * pairs
    cache = 2 * cfg.n_layers * w.kv_heads * d * (s.batch * (s.context // s.seq_parts) + rows * (step + 1))
    return DecodeFlops(float(gemm), float(attention), gemm_weight_bytes(cfg, s), cache * s.elt)


def decode_elementwise_bytes(cfg: ModelConfig, s: DecodeShape) -> int:
    """Bytes a decode step's element-wise ops move on one rank: ELEMENTWISE_PASSES passes over
    its rows' [b, h] and [b, ffn] tensors (4 of h, 3 of the rank's MLP width) per layer."""
    return ELEMENTWISE_PASSES * cfg.n_layers * s.slots * (4 * cfg.hidden + 3 * widths(cfg, s).ffn) * s.elt


@dataclass(frozen=True)
class DecodeWork:
    """Working memory of a decode step on one rank, beyond parameters and the cache, by term."""

    activations: int  # the step's own tensors: stream, projections, MLP, scores, logits
    exchange: int  # gathered queries and the partials sent and received (P > 1)
    weights: int  # weights in flight: visiting shards, gathered blocks and root

    @property
    def total(self) -> int:
        return self.activations + self.exchange + self.weights


def decode_work(cfg: ModelConfig, s: DecodeShape, held: Widths, weights: int) -> DecodeWork:
    """The larger moment of a decode step (at its last step, the longest keys): the rank's rows
    through the widths it ``held`` at once (sharded weights: one head block, one MLP shard), the
    whole logits row its argmax needs, attention scores [P b, heads, keys] at max(elt, 4) as an
    unfused kernel holds them (a flash kernel holds none: this overstates a GPU's by that
    much), and the ``weights`` the strategy holds in flight."""
    w, h, d, e = widths(cfg, s), cfg.hidden, cfg.head_dim, s.elt
    rows, p, q_heads = s.slots, s.seq_parts, held.q_heads
    keys = s.context // p + s.decode_tokens
    scores = p * rows * q_heads * keys * s.partial_elt
    vocab = cfg.vocab_size  # the whole row: gathered over the tensor degree for the argmax
    logits = rows * (w.vocab + vocab) * e if s.tensor_parts > 1 else rows * vocab * e
    block = rows * e * (3 * h + (2 * q_heads + 2 * held.kv_heads) * d + 3 * held.ffn)
    activations = max(block + scores, rows * h * e + logits)
    exchange = 0
    if p > 1:
        exchange = p * rows * q_heads * d * e + 2 * p * rows * q_heads * (d + 1) * s.partial_elt
    return DecodeWork(activations, exchange, weights)
