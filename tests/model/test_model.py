"""The shared model: shapes, causal attention at an offset, RoPE, the fused autograd functions,
layout-independent initialisation, the 7B preset's size, and the single-device reference step.

Everything here runs in one process in float64 where exactness matters.
"""

from __future__ import annotations

import collections
import itertools
import math
import resource

import pytest
import torch
import torch.nn.functional as F

from tspbench.core.spec import ModelConfig, Workload
from tspbench.model.layers import apply_rope, causal_attention, rms_norm, rope_tables, swiglu
from tspbench.model.reference import Reference
from tspbench.model.transformer import Transformer, reference_parameter

TINY = ModelConfig.preset("tiny")
F64 = torch.float64


def _randn(*shape: int, seed: int = 0, dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ----------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("preset", ["tiny", "tiny-gqa"])
def test_forward_shapes(preset: str) -> None:
    cfg = ModelConfig.preset(preset)
    model = Transformer(cfg, seed=0)
    tokens = torch.randint(cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    assert model.hidden_states(tokens).shape == (2, 16, cfg.hidden)
    logits = model(tokens)
    assert logits.shape == (2, 16, cfg.vocab_size)
    # loss_sum is the summed token cross-entropy of those logits.
    targets = tokens.roll(-1, dims=1)
    expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
    torch.testing.assert_close(model.loss_sum(tokens, targets), expected)


# ----------------------------------------------------------------------------- attention


def _naive_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Softmax attention written out; query i (of Sq, the last rows of Sk) sees keys j <= i + Sk - Sq."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    sq, sk = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    scores = scores.masked_fill(j > i + (sk - sq), float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("n_heads, n_kv", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa2", "mqa"])
def test_full_causal_attention_matches_naive(n_heads: int, n_kv: int) -> None:
    q, k, v = (
        _randn(2, n_heads, 16, 8, seed=1),
        _randn(2, n_kv, 16, 8, seed=2),
        _randn(2, n_kv, 16, 8, seed=3),
    )
    torch.testing.assert_close(causal_attention(q, k, v), _naive_causal(q, k, v), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n_heads, n_kv", [(4, 4), (4, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize(
    "start, end",
    [(0, 16), (0, 5), (3, 9), (8, 16), (15, 16)],
    ids=["whole", "prefix(Sq=Sk)", "middle", "second-half", "last-row"],
)
def test_query_chunk_inside_key_prefix_equals_rows_of_full(
    n_heads: int, n_kv: int, start: int, end: int
) -> None:
    """What sequence parallelism relies on: a query chunk [start, end) attending to keys [0, end)."""
    S = 16
    q, k, v = _randn(2, n_heads, S, 8, seed=4), _randn(2, n_kv, S, 8, seed=5), _randn(2, n_kv, S, 8, seed=6)
    full = causal_attention(q, k, v)
    chunk = causal_attention(q[:, :, start:end], k[:, :, :end], v[:, :, :end])
    torch.testing.assert_close(chunk, full[:, :, start:end], rtol=1e-12, atol=1e-12)


def test_query_longer_than_keys_is_rejected() -> None:
    q, kv = _randn(1, 2, 8, 4), _randn(1, 2, 4, 4)
    with pytest.raises(ValueError, match="exceeds key length"):
        causal_attention(q, kv, kv)


# ----------------------------------------------------------------------------- rotary embeddings

POSITIONS = torch.tensor([0, 1, 6, 7, 12, 13, 30, 31])  # zigzag-like, non-contiguous


def test_rope_tables_at_positions_are_rows_of_full_tables() -> None:
    d = TINY.head_dim
    cos, sin = rope_tables(POSITIONS, d, TINY.rope_theta, F64)
    cos_full, sin_full = rope_tables(torch.arange(32), d, TINY.rope_theta, F64)
    assert cos.shape == sin.shape == (len(POSITIONS), d)
    torch.testing.assert_close(cos, cos_full[POSITIONS], rtol=0, atol=0)
    torch.testing.assert_close(sin, sin_full[POSITIONS], rtol=0, atol=0)


def test_rope_on_gathered_tokens_equals_gathering_full_rope() -> None:
    d = TINY.head_dim
    x = _randn(2, 4, 32, d, seed=7)
    full = apply_rope(x, *rope_tables(torch.arange(32), d, TINY.rope_theta, F64))
    part = apply_rope(x[:, :, POSITIONS], *rope_tables(POSITIONS, d, TINY.rope_theta, F64))
    torch.testing.assert_close(part, full[:, :, POSITIONS], rtol=0, atol=0)


def test_rope_scores_depend_only_on_relative_position() -> None:
    d = TINY.head_dim
    q, k = _randn(1, 1, 1, d, seed=8), _randn(1, 1, 1, d, seed=9)

    def score(pq: int, pk: int) -> float:
        rq = apply_rope(q, *rope_tables(torch.tensor([pq]), d, TINY.rope_theta, F64))
        rk = apply_rope(k, *rope_tables(torch.tensor([pk]), d, TINY.rope_theta, F64))
        return float((rq * rk).sum())

    assert score(5, 2) == pytest.approx(score(105, 102), rel=1e-10)
    assert score(5, 2) != pytest.approx(score(5, 3), rel=1e-3)


def test_rope_with_negated_sin_is_the_transpose() -> None:
    """<R x, g> == <x, R^T g> with R^T = apply_rope(., cos, -sin); and R^T R = I."""
    d = TINY.head_dim
    cos, sin = rope_tables(POSITIONS, d, TINY.rope_theta, F64)
    x, g = _randn(2, 4, len(POSITIONS), d, seed=10), _randn(2, 4, len(POSITIONS), d, seed=11)
    lhs = (apply_rope(x, cos, sin) * g).sum()
    rhs = (x * apply_rope(g, cos, -sin)).sum()
    torch.testing.assert_close(lhs, rhs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(apply_rope(apply_rope(x, cos, sin), cos, -sin), x, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- fused autograd functions


def _plain_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_rms_norm_gradcheck() -> None:
    x = _randn(2, 3, 8, seed=12).requires_grad_()
    w = (1 + 0.1 * _randn(8, seed=13)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: rms_norm(x, w, 1e-5), (x, w))


def test_rms_norm_matches_plain_formula() -> None:
    x = _randn(2, 3, 8, seed=14).requires_grad_()
    w = (1 + 0.1 * _randn(8, seed=15)).requires_grad_()
    g = _randn(2, 3, 8, seed=16)
    y = rms_norm(x, w, 1e-5)
    dx, dw = torch.autograd.grad(y, (x, w), g)
    y_ref = _plain_rms_norm(x, w, 1e-5)
    dx_ref, dw_ref = torch.autograd.grad(y_ref, (x, w), g)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dw, dw_ref, rtol=1e-12, atol=1e-12)


def test_swiglu_gradcheck() -> None:
    h1, h3 = _randn(2, 3, 8, seed=17).requires_grad_(), _randn(2, 3, 8, seed=18).requires_grad_()
    assert torch.autograd.gradcheck(swiglu, (h1, h3))


def test_swiglu_matches_plain_formula() -> None:
    h1, h3 = _randn(2, 3, 8, seed=19).requires_grad_(), _randn(2, 3, 8, seed=20).requires_grad_()
    g = _randn(2, 3, 8, seed=21)
    a = swiglu(h1, h3)
    d1, d3 = torch.autograd.grad(a, (h1, h3), g)
    a_ref = F.silu(h1) * h3
    d1_ref, d3_ref = torch.autograd.grad(a_ref, (h1, h3), g)
    torch.testing.assert_close(a, a_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(d1, d1_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(d3, d3_ref, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- the 7B preset


def test_7b_on_meta_allocates_nothing_and_has_16_h2_L_block_weights() -> None:
    cfg = ModelConfig.preset("7b")
    rss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.device("meta"):
        model = Transformer(cfg, seed=0)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before_kib) / 1024
    assert all(p.is_meta for p in model.parameters())
    assert grown_mib < 256, f"building 7B on meta grew peak RSS by {grown_mib:.0f} MiB"

    block_linear = sum(p.numel() for n, p in model.layers.named_parameters() if "norm" not in n)
    assert block_linear == 16 * cfg.hidden**2 * cfg.n_layers == 8_589_934_592
    assert sum(p.numel() for p in model.parameters()) == cfg.n_params


# ----------------------------------------------------------------------------- initialisation


def test_reference_parameter_depends_only_on_name_and_seed() -> None:
    name_a, name_b = "layers.0.attention.wq.weight", "layers.0.attention.wk.weight"
    shape = (TINY.hidden, TINY.hidden)
    a_first = reference_parameter(TINY, name_a, shape, seed=0)
    b_second = reference_parameter(TINY, name_b, shape, seed=0)
    b_first = reference_parameter(TINY, name_b, shape, seed=0)  # built in the other order
    a_second = reference_parameter(TINY, name_a, shape, seed=0)
    assert torch.equal(a_first, a_second)
    assert torch.equal(b_first, b_second)
    assert not torch.equal(a_first, b_first)
    assert not torch.equal(a_first, reference_parameter(TINY, name_a, shape, seed=1))


def test_reference_parameter_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    reference_parameter(TINY, "layers.0.mlp.w1.weight", (TINY.ffn_hidden, TINY.hidden), seed=0)
    assert torch.equal(torch.get_rng_state(), state)


def test_reference_parameter_scales() -> None:
    """GPT-2 init: std 0.02, residual outputs (wo, w2) 0.02 / sqrt(2L); norms are ones."""
    wq = reference_parameter(TINY, "layers.1.attention.wq.weight", (256, 256), seed=0)
    wo = reference_parameter(TINY, "layers.1.attention.wo.weight", (256, 256), seed=0)
    norm = reference_parameter(TINY, "layers.1.mlp_norm.weight", (64,), seed=0)
    assert wq.std().item() == pytest.approx(0.02, rel=0.02)
    assert wo.std().item() == pytest.approx(0.02 / math.sqrt(2 * TINY.n_layers), rel=0.02)
    assert torch.equal(norm, torch.ones(64))


def test_a_layer_weight_does_not_depend_on_the_rest_of_the_model() -> None:
    two = Transformer(TINY, seed=0)
    three = Transformer(ModelConfig.preset("tiny", n_layers=3), seed=0)
    for name in ("embed.weight", "layers.0.attention.wq.weight", "layers.1.mlp.w1.weight"):
        assert torch.equal(two.get_parameter(name), three.get_parameter(name)), name


def test_model_weights_are_the_reference_parameters() -> None:
    model = Transformer(TINY, seed=3)
    for name, p in model.named_parameters():
        assert torch.equal(p, reference_parameter(TINY, name, tuple(p.shape), seed=3)), name


def test_same_seed_same_weights_other_seed_other_weights() -> None:
    a, b, c = Transformer(TINY, seed=0), Transformer(TINY, seed=0), Transformer(TINY, seed=1)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if "norm" not in name:
            assert not torch.equal(pa, pc), name


# ----------------------------------------------------------------------------- the reference step


def _reference(recompute: str = "none", dtype: str = "float32") -> Reference:
    return Reference(Workload(TINY, seq_len=32, recompute=recompute, dtype=dtype), n_seqs=2)


def test_reference_step_is_bitwise_deterministic() -> None:
    a, b = _reference(), _reference()
    for _ in range(2):
        loss_a, loss_b = a.train_step(), b.train_step()
        assert torch.equal(loss_a, loss_b)
        grads_a, grads_b = a.tensors(grads=True), b.tensors(grads=True)
        for name, g in grads_a.items():
            assert torch.equal(g, grads_b[name]), name


def test_reference_loss_decreases() -> None:
    ref = _reference()
    losses = [ref.train_step().item() for _ in range(5)]
    assert losses[0] == pytest.approx(math.log(TINY.vocab_size), rel=0.05)  # near-uniform at init
    assert all(later < earlier for earlier, later in itertools.pairwise(losses)), losses


def test_recomputation_modes_agree() -> None:
    results = {}
    for mode in ("none", "selective", "op", "full"):
        ref = _reference(mode, "float64")
        loss = ref.train_step()
        results[mode] = (loss, ref.tensors(grads=True))
    loss0, grads0 = results["none"]
    for mode in ("selective", "op", "full"):
        loss, grads = results[mode]
        torch.testing.assert_close(loss, loss0, rtol=1e-13, atol=0)
        for name, g in grads.items():
            torch.testing.assert_close(g, grads0[name], rtol=1e-12, atol=1e-15, msg=f"{mode}: {name}")


def test_unknown_recompute_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="recompute must be one of"):
        Transformer(TINY, seed=0).set_recompute("some")


# ----------------------------------------------------------------------------- op-level recomputation


def test_op_policy_saves_odd_mms_attention_and_the_functional_reduce_scatter() -> None:
    """torchtitan's rule: the 1st, 3rd, 5th, 7th mm of a block's forward kept, the 2nd, 4th, 6th
    recomputed; attention kernels and the functional reduce-scatter kept; anything else recomputed.
    The recompute counts its mm calls apart from the forward's."""
    from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

    from tspbench.model.recompute import policy

    save, again = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    counts: dict[str, int] = collections.defaultdict(int)
    forward, recompute = (
        SelectiveCheckpointContext(is_recompute=False),
        SelectiveCheckpointContext(is_recompute=True),
    )
    mm = torch.ops.aten.mm.default
    got = [policy(counts, forward, mm) for _ in range(7)]
    assert got == [save, again, save, again, save, again, save]  # wq wk wv wo w1 w3 w2
    assert policy(counts, recompute, mm) == save  # the recompute's own first mm
    assert policy(counts, forward, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default) == save
    assert policy(counts, forward, torch.ops._c10d_functional.reduce_scatter_tensor.default) == save
    assert policy(counts, forward, torch.ops.aten.add.Tensor) == again
    assert policy(counts, forward, torch.ops.aten.addmm.default) == again
    assert dict(counts) == {"forward_mm_count": 7, "recompute_mm_count": 1}


def test_op_recomputation_of_attention_at_an_offset_is_exact() -> None:
    """A query chunk at an offset merges two kernel calls whose outputs op-level recomputation
    keeps as they came out: its gradients equal the plain ones."""
    from tspbench.model.recompute import checkpoint_ops

    q, k, v = (_randn(1, 2, n, 8, seed=i).requires_grad_() for i, n in enumerate((16, 48, 48)))
    plain = torch.autograd.grad(causal_attention(q, k, v).square().sum(), (q, k, v))
    kept = torch.autograd.grad(checkpoint_ops(causal_attention, q, k, v).square().sum(), (q, k, v))
    for a, b in zip(plain, kept, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=0)
