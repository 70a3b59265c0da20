"""Ulysses (tspbench.dist.ulysses): the all-to-all's layout against hand-built cases, and the
attention it gives against attention on the whole sequence, on every rank of worlds of 2 and 4.

Each rank starts from its zigzag shard of the same q, k, v; after ``to_heads`` rank r must hold
heads [r n/D, (r+1) n/D) of q (and [r m/D, (r+1) m/D) of k, v) for every token in sequence
order, which this process cuts from the whole tensors by hand.
"""

from __future__ import annotations

import pytest
import torch
from attention_cases import D_HEAD, N_HEADS, B, explicit_attention, random_inputs

from tspbench.dist import comm
from tspbench.dist.comm import summarize
from tspbench.dist.launch import launch
from tspbench.dist.mesh import Mesh
from tspbench.dist.ulysses import UlyssesAttention, heads_problem, to_heads, to_sequence
from tspbench.dist.zigzag import zigzag_shard


def test_heads_that_do_not_split_over_the_degree_are_refused_with_the_reason() -> None:
    assert heads_problem(8, 8, 4) is None and heads_problem(8, 4, 4) is None
    assert "6 query heads" in heads_problem(6, 6, 4)
    assert "fewer K/V heads than ranks" in heads_problem(8, 2, 4)
    assert "fewer" not in heads_problem(12, 6, 4)


def _rank(n: int, seq: int, kv_heads: int) -> dict:
    r = torch.distributed.get_rank()
    group = Mesh({"sp": n}, r).group("sp")
    q, k, v, dout = (zigzag_shard(t, n, r, dim=2) for t in random_inputs(seq, kv_heads, 11))
    with torch.no_grad():
        heads = to_heads(q, k, v, group)
        back = to_sequence(heads[0], group)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with comm.counting() as log:
        o = UlyssesAttention(group)(*leaves)
        with comm.phase("backward"):
            o.backward(dout)
    return {
        "heads": heads,
        "back": back,
        "o": o.detach(),
        "grads": [t.grad for t in leaves],
        "comm": summarize(log.records),
    }


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_all_to_all_layout_and_attention_on_every_rank(n: int) -> None:
    seq, kv_heads = 2 * n * 2, n  # GQA: n heads of K/V, one per rank
    ranks = launch(_rank, n, n, seq, kv_heads, timeout=120)
    q, k, v, dout = random_inputs(seq, kv_heads, 11)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = explicit_attention(*leaves)
    o.backward(dout)
    hq, hkv = N_HEADS // n, kv_heads // n
    for r, got in enumerate(ranks):
        want = (q[:, r * hq : (r + 1) * hq], k[:, r * hkv : (r + 1) * hkv], v[:, r * hkv : (r + 1) * hkv])
        for g, w in zip(got["heads"], want, strict=True):
            assert torch.equal(g, w)  # pure data movement: bit for bit
        assert torch.equal(got["back"], zigzag_shard(q, n, r, dim=2))
        assert torch.allclose(got["o"], zigzag_shard(o.detach(), n, r, dim=2), rtol=0, atol=1e-13)
        for g, w in zip(got["grads"], leaves, strict=True):
            assert torch.allclose(g, zigzag_shard(w.grad, n, r, dim=2), rtol=0, atol=1e-13)
        row = B * (seq // n) * D_HEAD * 8
        packed, out = row * (N_HEADS + 2 * kv_heads), row * N_HEADS
        for phase in ("forward", "backward"):
            assert got["comm"][("all_to_all", phase, "sp", n)] == (2, packed + out)
