"""Which attention kernel each call gets (tspbench.model.attention), and the exact math of every
CUDA path, run on CPU with stand-ins of the CUDA ops' schemas (FlashAttention-2's and cuDNN's),
computed in float64 with the softmax written out."""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from tspbench.model import attention
from tspbench.model.attention import (
    CUDA_CUDNN,
    CUDA_FLASH,
    LowerRightCausal,
    causal_attention,
    kernels_for,
    one_query_attention,
    record_kernels,
    repeat_kv,
    simulated_cuda_kernel,
)

F64 = torch.float64


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _naive_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Query i (of Sq, the last rows of Sk) sees keys j <= i + Sk - Sq; softmax written out."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    sq, sk = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    future = torch.arange(sk)[None, :] > torch.arange(sq)[:, None] + (sk - sq)
    return scores.masked_fill(future, float("-inf")).softmax(-1) @ v


class MathKernel:
    """The math behind both CUDA ops, for documented inputs only: no mask, or a causal square (a
    causal call with Sq != Sk is refused, since backends disagree on its alignment). The backward
    takes the o and lse it is given. ``flash_*`` and ``cudnn_*`` have the aten ops' schemas."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bool]] = []

    def _probs(self, q, k, causal: bool, lse=None):
        sq, sk = q.shape[-2], k.shape[-2]
        assert not causal or sq == sk, f"causal call with Sq {sq} != Sk {sk}"
        assert q.shape[1] == k.shape[1], "grouped K/V reach a kernel only repeated"
        self.calls.append((sq, sk, causal))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if causal:
            scores = scores.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(1), float("-inf"))
        lse = scores.logsumexp(-1) if lse is None else lse
        return (scores - lse.unsqueeze(-1)).exp(), lse

    def _grads(self, dout, q, k, v, out, lse, causal):
        p, _ = self._probs(q, k, causal, lse)
        dp = dout @ v.transpose(-1, -2)
        ds = p * (dp - (dout * out).sum(-1, keepdim=True)) / math.sqrt(q.shape[-1])
        return ds @ k, ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ dout

    def flash_forward(self, q, k, v, dropout_p, is_causal):
        assert dropout_p == 0.0
        p, lse = self._probs(q, k, is_causal)
        empty = torch.empty(0)
        return p @ v, lse, empty, empty, q.shape[-2], k.shape[-2], empty, empty, empty

    def flash_backward(
        self, dout, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, dropout_p, causal, seed, off
    ):
        return self._grads(dout, q, k, v, out, lse, causal)

    def cudnn_forward(self, q, k, v, attn_bias, compute_lse, dropout_p, is_causal):
        assert attn_bias is None and dropout_p == 0.0
        p, lse = self._probs(q, k, is_causal)
        empty = torch.empty(0)
        return p @ v, lse.unsqueeze(-1), None, None, q.shape[-2], k.shape[-2], empty, empty, None

    def cudnn_backward(self, dout, q, k, v, out, lse, seed, off, bias, cq, ck, mq, mk, dropout_p, causal):
        assert lse.shape[-1] == 1 and lse.is_contiguous(), "cuDNN takes lse as [B, n, Sq, 1]"
        assert bias is None
        return self._grads(dout, q, k, v, out, lse.squeeze(-1), causal)


@pytest.fixture
def math_kernel(monkeypatch: pytest.MonkeyPatch) -> MathKernel:
    kernel = MathKernel()
    for ops, prefix in ((attention.CUDA_FLASH_OPS, "flash"), (attention.CUDA_CUDNN_OPS, "cudnn")):
        monkeypatch.setitem(ops, "forward", getattr(kernel, f"{prefix}_forward"))
        monkeypatch.setitem(ops, "backward", getattr(kernel, f"{prefix}_backward"))
    return kernel


@pytest.mark.parametrize("kernels", [CUDA_FLASH, CUDA_CUDNN], ids=["flash", "cudnn"])
@pytest.mark.parametrize("sq, sk", [(4, 16), (8, 12), (1, 9)])
def test_chunk_at_an_offset_calls_only_documented_semantics_and_is_exact(
    math_kernel: MathKernel, kernels: attention.FlashKernels, sq: int, sk: int
) -> None:
    """The split of a query chunk at an offset (the key prefix unmasked, the last Sq keys a
    causal square, merged by log-sum-exp; backward from the merged o and lse), through each CUDA
    kernel's schema: output and gradients equal bottom-right causal attention written out, and
    no causal call is ever non-square."""
    q = _randn(2, 4, sq, 8, seed=7).requires_grad_()
    k, v = _randn(2, 2, sk, 8, seed=8).requires_grad_(), _randn(2, 2, sk, 8, seed=9).requires_grad_()
    dout = _randn(2, 4, sq, 8, seed=10)
    got = LowerRightCausal.apply(q, repeat_kv(k, 4), repeat_kv(v, 4), kernels)
    grads = torch.autograd.grad(got, (q, k, v), dout)
    want = _naive_causal(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(grads, torch.autograd.grad(want, (q, k, v), dout), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    assert {c for *_, c in math_kernel.calls} == {False, True}  # both halves, forward and backward
    assert all(a == b for a, b, causal in math_kernel.calls if causal)


def test_cudnn_square_repeats_grouped_kv_and_is_exact(math_kernel: MathKernel) -> None:
    q = _randn(1, 4, 6, 8, seed=1)
    k, v = _randn(1, 2, 6, 8, seed=2), _randn(1, 2, 6, 8, seed=3)
    torch.testing.assert_close(CUDA_CUDNN.square(q, k, v), _naive_causal(q, k, v), rtol=1e-12, atol=1e-12)
    assert math_kernel.calls == [(6, 6, True)]


def _fake_cuda(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="cuda")


@pytest.mark.parametrize(
    "device_kernel, sq, head_dim, deterministic, expected",
    [
        ("cudnn", 128, 128, False, "cudnn"),
        ("cudnn", 128, 64, False, "cudnn"),
        ("flash", 128, 128, False, "flash"),  # ROCm, pre-Hopper: the device prefers flash
        ("cudnn", 1, 128, False, "flash"),  # one query token: a known cuDNN defect
        ("cudnn", 128, 128, True, "flash"),  # deterministic mode excludes cuDNN
        ("cudnn", 128, 256, False, "flash"),  # cuDNN's head dim limit
        ("cudnn", 128, 36, False, "flash"),  # not a multiple of 8
    ],
)
def test_kernel_per_call_follows_the_device_and_the_known_defects(
    device_kernel: str, sq: int, head_dim: int, deterministic: bool, expected: str
) -> None:
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        with FakeTensorMode(), simulated_cuda_kernel(device_kernel):
            assert kernels_for(_fake_cuda(1, 4, sq, head_dim)).name == expected
    finally:
        torch.use_deterministic_algorithms(previous)


def test_no_kernel_for_float32_on_cuda_and_cpu_flash_on_cpu() -> None:
    with FakeTensorMode(), simulated_cuda_kernel("cudnn"):
        assert kernels_for(_fake_cuda(1, 4, 16, 64, dtype=torch.float32)) is None
    assert kernels_for(_randn(1, 4, 16, 8)).name == "cpu_flash"


def test_unknown_simulated_kernel_is_refused() -> None:
    with pytest.raises(ValueError, match="attention kernel must be one of"), simulated_cuda_kernel("fa3"):
        pass


@pytest.mark.parametrize("kernel", ["cudnn", "flash"])
def test_a_simulated_gpu_runs_the_kernel_it_names(kernel: str) -> None:
    """Under fake tensors the model's causal square calls the kernel the simulated device names,
    and the call is recorded by name (the offset split and backward need the fake world's CUDA
    shim: tests/measure/test_fake.py)."""
    seen: list[str] = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func._overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with FakeTensorMode(), simulated_cuda_kernel(kernel), record_kernels() as used, Ops():
        qkv = _fake_cuda(1, 4, 128, 64)
        causal_attention(qkv, qkv, qkv)
    assert used == {kernel}
    ops = {"cudnn": "_scaled_dot_product_cudnn_attention", "flash": "_scaled_dot_product_flash_attention"}
    assert seen.count(ops[kernel]) == 1
    assert not set(ops.values()) - {ops[kernel]} & set(seen)


def test_one_query_attention_is_exact() -> None:
    """Decode's query against every cached position (grouped K/V): attention written out, and the
    call is recorded by name."""
    q, k, v = _randn(2, 4, 1, 8, seed=11), _randn(2, 2, 9, 8, seed=12), _randn(2, 2, 9, 8, seed=13)
    with record_kernels() as used:
        got = one_query_attention(q, k, v)
    torch.testing.assert_close(got, _naive_causal(q, k, v), rtol=1e-12, atol=1e-12)
    assert used == {"sdpa_one_query"}
