"""Ring attention (tspbench.dist.ring) against attention computed here from the whole sequence.

The merge is checked by hand on one process: two partials over disjoint keys give the softmax
over all of them. Then one world per size (2 and 4) runs the ring on every rank's zigzag shard
of the same q, k, v and returns o, dq, dk, dv and the counted collectives; this process builds
the reference from an explicit causal mask (no kernel in common) and cuts it the same way.
"""

from __future__ import annotations

import pytest
import torch
from attention_cases import D_HEAD, N_HEADS, B, explicit_attention, random_inputs

from tspbench.dist import comm
from tspbench.dist.comm import summarize
from tspbench.dist.launch import launch
from tspbench.dist.mesh import Mesh
from tspbench.dist.ring import MATH, RingAttention
from tspbench.dist.zigzag import zigzag_shard
from tspbench.model.attention import merge_pair


def test_two_partials_over_disjoint_keys_merge_to_attention_over_all_of_them() -> None:
    q, k, v, _ = random_inputs(6, N_HEADS, 7)
    whole = explicit_attention(q, k, v, causal=False)
    o1, lse1, _ = MATH.forward(q, k[:, :, :2], v[:, :, :2], False)
    o2, lse2, _ = MATH.forward(q, k[:, :, 2:], v[:, :, 2:], False)
    o, lse = merge_pair(o1, lse1, o2, lse2)
    assert torch.allclose(o, whole, rtol=0, atol=1e-14)
    scores = q @ k.transpose(-1, -2) / D_HEAD**0.5
    assert torch.allclose(lse, scores.logsumexp(-1), rtol=0, atol=1e-13)


def test_math_backward_with_the_global_lse_gives_each_parts_exact_gradient() -> None:
    """The ring-attention identity: a part's backward given the merged o and lse is that part's
    share of the whole gradient (dq sums over parts; dk, dv are the part's columns)."""
    q, k, v, dout = random_inputs(6, N_HEADS, 7)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    explicit_attention(*leaves, causal=False).backward(dout)
    o1, lse1, _ = MATH.forward(q, k[:, :, :2], v[:, :, :2], False)
    o2, lse2, _ = MATH.forward(q, k[:, :, 2:], v[:, :, 2:], False)
    o, lse = merge_pair(o1, lse1, o2, lse2)
    dq1, dk1, dv1 = MATH.backward(dout, q, k[:, :, :2], v[:, :, :2], o, lse, False, ())
    dq2, dk2, dv2 = MATH.backward(dout, q, k[:, :, 2:], v[:, :, 2:], o, lse, False, ())
    for got, want in ((dq1 + dq2, leaves[0].grad), (torch.cat([dk1, dk2], 2), leaves[1].grad)):
        assert torch.allclose(got, want, rtol=0, atol=1e-13)
    assert torch.allclose(torch.cat([dv1, dv2], 2), leaves[2].grad, rtol=0, atol=1e-13)


# ----------------------------------------------------------------------------- on the ranks


def _rank(n: int, seq: int, kv_heads: int, dtype: torch.dtype) -> dict:
    r = torch.distributed.get_rank()
    group = Mesh({"sp": n}, r).group("sp")
    q, k, v, dout = (zigzag_shard(t, n, r, dim=2).to(dtype) for t in random_inputs(seq, kv_heads, 7))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with comm.counting() as log:
        o = RingAttention(group)(*leaves)
        with comm.phase("backward"):
            o.backward(dout)
    return {"o": o.detach(), "grads": [t.grad for t in leaves], "comm": summarize(log.records)}


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("kv_heads", [N_HEADS, 2])
def test_ring_equals_causal_attention_on_every_rank(n: int, kv_heads: int) -> None:
    seq = 2 * n * 3
    ranks = launch(_rank, n, n, seq, kv_heads, torch.float64, timeout=120)
    q, k, v, dout = random_inputs(seq, kv_heads, 7)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = explicit_attention(*leaves)
    o.backward(dout)
    for r, got in enumerate(ranks):
        assert torch.allclose(got["o"], zigzag_shard(o.detach(), n, r, dim=2), rtol=0, atol=1e-13)
        for g, want in zip(got["grads"], leaves, strict=True):
            assert torch.allclose(g, zigzag_shard(want.grad, n, r, dim=2), rtol=0, atol=1e-13)
        chunk = 2 * B * kv_heads * (seq // n) * D_HEAD * 8  # [2, B, m, 2C, d] float64
        assert got["comm"] == {
            ("send_recv", "forward", "sp", n): (n - 1, (n - 1) * chunk),
            ("send_recv", "backward", "sp", n): (2 * n - 1, (2 * n - 1) * chunk),
        }


@pytest.mark.slow
def test_dk_dv_travel_in_float32_when_the_model_runs_in_bfloat16() -> None:
    n, seq = 2, 8
    (got, _) = launch(_rank, n, n, seq, N_HEADS, torch.bfloat16, timeout=120)
    chunk = 2 * B * N_HEADS * (seq // n) * D_HEAD
    assert got["comm"][("send_recv", "backward", "sp", n)] == (2 * n - 1, (n - 1) * chunk * 2 + n * chunk * 4)
