"""Attention written out for the K/V exchanges' tests (tests/dist/test_ring.py, test_ulysses.py):
seeded float64 q, k, v and an upstream gradient, and softmax(q k^T / sqrt(d) + mask) v with no
kernel in common with the code under test."""

from __future__ import annotations

import torch

B, N_HEADS, D_HEAD = 2, 4, 8


def random_inputs(seq: int, kv_heads: int, seed: int) -> tuple[torch.Tensor, ...]:
    """q [B, N_HEADS, seq, D_HEAD], k and v [B, kv_heads, seq, D_HEAD] and dout like q, float64."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, N_HEADS, seq, D_HEAD, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(B, kv_heads, seq, D_HEAD, generator=gen, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(B, N_HEADS, seq, D_HEAD, generator=gen, dtype=torch.float64)
    return q, k, v, dout


def explicit_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v, written out; K/V heads repeated to q's."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        s = scores.shape[-1]
        scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
    return scores.softmax(-1) @ v
