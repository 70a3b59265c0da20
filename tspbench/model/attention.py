"""Causal attention and the kernels behind it: which kernel each call gets, and why.

Shapes: q [B, n, Sq, d], k, v [B, m, Sk, d] (n = g m query heads per key/value head), Sq <= Sk,
bottom-right aligned (query i sees keys j <= i + Sk - Sq). Two call kinds only, the ones every
backend defines the same way: an unmasked rectangle, and a causal square (Sq == Sk, where top-left
and bottom-right alignment coincide). A chunk at an offset (Sq < Sk) is split into both and
merged by log-sum-exp (``LowerRightCausal``); no kernel is asked for a non-square causal mask.

Which kernel (``kernels_for``), per call:

    CUDA, bf16/fp16  cuDNN's attention where the device prefers it (``preferred_cuda_kernel``:
                     compute capability 9.0 or newer with cuDNN, not ROCm), else FlashAttention-2
                     (``flash``; on ROCm torch's flash op is ROCm's own). Falls back to flash
                     where a known cuDNN defect applies (``cudnn_defect``): one query token
                     (errors and NaN), deterministic mode (cuDNN is excluded there), a head
                     dimension over 128 or not a multiple of 8. No call passes a mask, so the
                     cuDNN mask defect (NaN gradients at lengths 64 mod 128) never applies.
    CPU              torch's CPU flash kernel (squares through SDPA, which picks the same one)
    elsewhere        SDPA's math path with an explicit mask

The choice follows the tensors' device and dtype, never their values: under fake tensors (the
fake world) each call is the one the real device runs. A simulated GPU has no capability to ask,
so the fake world names the kernel of the device it simulates (``simulated_cuda_kernel``, from
its hardware profile). ``record_kernels`` collects the kernels a step called, for its record.
Nothing here imports torch.distributed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from tspbench.core.names import CUDA_ATTENTION_KERNELS

CUDNN_MAX_HEAD_DIM = 128


def upcast(x: Tensor) -> Tensor:
    """float32 for half-precision tensors (norm statistics, softmax, loss); unchanged otherwise."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


@dataclass(frozen=True)
class FlashKernels:
    """A device's flash-style attention, called only where every backend agrees on the semantics.

    ``forward(q, k, v, causal)`` -> (o, lse [B, n, Sq] float32, saved) and ``backward(dout, q,
    k, v, o, lse, causal, saved)`` -> (dq, dk, dv), with ``causal`` only ever True for a square
    block. ``backward`` takes the o and lse it is given, not the call's own: with a merged o and
    its global log-sum-exp each part's gradient is exact (the ring-attention identity).
    ``square``: the causal square as an autograd op (None: SDPA's own choice is right here).
    """

    name: str
    forward: Callable[[Tensor, Tensor, Tensor, bool], tuple[Tensor, Tensor, tuple]]
    backward: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool, tuple], tuple[Tensor, ...]]
    square: Callable[[Tensor, Tensor, Tensor], Tensor] | None = None


# Looked up at call time (tests put math implementations of the same schemas in their place).
CUDA_FLASH_OPS = {
    "forward": torch.ops.aten._scaled_dot_product_flash_attention,
    "backward": torch.ops.aten._scaled_dot_product_flash_attention_backward,
}
CUDA_CUDNN_OPS = {
    "forward": torch.ops.aten._scaled_dot_product_cudnn_attention,
    "backward": torch.ops.aten._scaled_dot_product_cudnn_attention_backward,
}


def _flash_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, Tensor, tuple]:
    out = CUDA_FLASH_OPS["forward"](q, k, v, 0.0, causal)
    return out[0], out[1], tuple(out[2:8])  # cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused


def _flash_backward(dout, q, k, v, o, lse, causal: bool, saved: tuple) -> tuple[Tensor, ...]:
    cum_q, cum_k, max_q, max_k, philox_seed, philox_offset = saved
    return CUDA_FLASH_OPS["backward"](
        dout, q, k, v, o, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, philox_seed, philox_offset
    )


def _flash_square(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return CUDA_FLASH_OPS["forward"](q, k, v, 0.0, True)[0]


def _cudnn_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, Tensor, tuple]:
    """cuDNN's lse is [B, n, Sq, 1]: returned as [B, n, Sq] (a view), like flash's."""
    out = CUDA_CUDNN_OPS["forward"](q, k, v, None, True, 0.0, causal)
    return out[0], out[1].squeeze(-1), (out[6], out[7], out[2], out[3], out[4], out[5])


def _cudnn_backward(dout, q, k, v, o, lse, causal: bool, saved: tuple) -> tuple[Tensor, ...]:
    philox_seed, philox_offset, cum_q, cum_k, max_q, max_k = saved
    lse = lse.unsqueeze(-1).contiguous()
    return CUDA_CUDNN_OPS["backward"](
        dout, q, k, v, o, lse, philox_seed, philox_offset, None, cum_q, cum_k, max_q, max_k, 0.0, causal
    )


def _cudnn_square(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
    needs_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return CUDA_CUDNN_OPS["forward"](q, k, v, None, needs_lse, 0.0, True)[0]


def _cpu_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, Tensor, tuple]:
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return o, lse, ()


def _cpu_backward(dout, q, k, v, o, lse, causal: bool, saved: tuple) -> tuple[Tensor, ...]:
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    return kernel(dout, q, k, v, o, lse, 0.0, causal)


def settle_float64_exp() -> None:
    """One small float64 exp, once per process, before any that matters. The first float64 exp
    a process runs on CPU was seen 3.3e-9 off (relative; every later one within 2.2e-16) in 3 of
    40 fresh processes that had imported pandas after torch, and never in 180 that had run one
    small exp first: the merge weights of the offset split are exps, so gpu-check's float64
    attention check failed at random (tests/checks/test_gpu_check.py repeats it in fresh processes)."""
    torch.ones(16, dtype=torch.float64).exp()


settle_float64_exp()

CUDA_FLASH = FlashKernels("flash", _flash_forward, _flash_backward, square=_flash_square)
CUDA_CUDNN = FlashKernels("cudnn", _cudnn_forward, _cudnn_backward, square=_cudnn_square)
CPU_FLASH = FlashKernels("cpu_flash", _cpu_forward, _cpu_backward)
BY_NAME = {"cudnn": CUDA_CUDNN, "flash": CUDA_FLASH}

# ----------------------------------------------------------------------------- the choice

_simulated: list[str] = []  # the kernel a simulated GPU runs (innermost last)
_keeping = False


@contextmanager
def keeping_kernel_outputs() -> Iterator[None]:
    """Inside, no attention kernel's output is written in place: op-level selective
    recomputation (tspbench.model.recompute) keeps them for backward as they came out, and
    torch's cache refuses a kept tensor that was changed since. Costs one output-sized
    temporary where the offset split merges its two parts (``LowerRightCausal``)."""
    global _keeping
    previous, _keeping = _keeping, True
    try:
        yield
    finally:
        _keeping = previous


_recorders: list[set[str]] = []


@contextmanager
def simulated_cuda_kernel(name: str) -> Iterator[None]:
    """Calls on CUDA tensors inside pick ``name`` as the device's preferred kernel (the fake
    world's simulated GPU, whose profile names it: cuDNN on Hopper, ROCm's flash on MI300X)."""
    if name not in CUDA_ATTENTION_KERNELS:
        raise ValueError(f"attention kernel must be one of {list(CUDA_ATTENTION_KERNELS)}, got {name!r}")
    _simulated.append(name)
    try:
        yield
    finally:
        _simulated.pop()


def preferred_cuda_kernel(device: torch.device) -> str:
    """cuDNN on compute capability 9.0+ with cuDNN (SDPA's own first choice there), else flash."""
    if _simulated:
        return _simulated[-1]
    if torch.version.hip or not torch.backends.cudnn.is_available():
        return "flash"
    return "cudnn" if torch.cuda.get_device_capability(device)[0] >= 9 else "flash"


def cudnn_defect(q: Tensor) -> str | None:
    """Why cuDNN must not take this call (a known defect or exclusion), or None."""
    if q.shape[-2] == 1:
        return "one query token (errors and NaN with a single query)"
    if torch.are_deterministic_algorithms_enabled():
        return "deterministic mode (cuDNN attention is excluded)"
    d = q.shape[-1]
    if d > CUDNN_MAX_HEAD_DIM or d % 8:
        return f"head dim {d} (cuDNN's needs a multiple of 8, at most {CUDNN_MAX_HEAD_DIM})"
    return None


def kernels_for(q: Tensor) -> FlashKernels | None:
    """The kernels for a call with query q (module doc), or None for SDPA's math path."""
    if q.is_cuda:
        if q.dtype not in (torch.float16, torch.bfloat16) or q.shape[-1] > 256:
            return None
        name = preferred_cuda_kernel(q.device)
        return CUDA_CUDNN if name == "cudnn" and cudnn_defect(q) is None else CUDA_FLASH
    if q.device.type == "cpu" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
        return CPU_FLASH
    return None


@contextmanager
def record_kernels() -> Iterator[set[str]]:
    """The names of the attention kernels called inside (``math`` for SDPA's math path)."""
    used: set[str] = set()
    _recorders.append(used)
    try:
        yield used
    finally:
        _recorders.remove(used)


def _called(name: str) -> None:
    for used in _recorders:
        used.add(name)


# ----------------------------------------------------------------------------- attention


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal attention with bottom-right alignment: o [B, n, Sq, d] (module doc)."""
    sq, sk = q.shape[-2], k.shape[-2]
    if sq > sk:
        raise ValueError(f"query length {sq} exceeds key length {sk}")
    kernels = kernels_for(q)
    _called(kernels.name if kernels is not None else "math")
    if kernels is not None and sq < sk:
        k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
        return LowerRightCausal.apply(q, k, v, kernels)
    if kernels is not None and kernels.square is not None:
        return kernels.square(q, k, v)
    gqa = q.shape[1] != k.shape[1]
    if sq == sk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=lower_right_mask(sq, sk, q), enable_gqa=gqa)


def repeat_kv(x: Tensor, heads: int) -> Tensor:
    """K or V [B, m, S, d] repeated to [B, heads, S, d]: query head i uses key head i // (heads / m)."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def lower_right_mask(sq: int, sk: int, like: Tensor) -> Tensor:
    """Additive [Sq, Sk] mask: query i sees keys j <= i + Sk - Sq."""
    keep = torch.ones(sq, sk, dtype=torch.bool, device=like.device).tril(sk - sq)
    return torch.zeros(sq, sk, dtype=like.dtype, device=like.device).masked_fill_(~keep, float("-inf"))


class LowerRightCausal(torch.autograd.Function):
    """Bottom-right causal attention of a query chunk at an offset (Sq < Sk), with no [Sq, Sk] mask.

    The key prefix before the query chunk is fully visible and the last Sq keys form a square
    causal block: two kernel calls (no mask; causal square) merged by their log-sum-exps. K/V
    have the query's heads (grouped K/V are repeated first, as SDPA does for them). Saves
    q, k, v, o and the merged log-sum-exp, as a flash kernel does. Backward calls each part's
    backward with the merged o and lse, whose softmax normaliser is the global one (the
    ring-attention identity), sums dq and concatenates dk, dv.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, kernels: FlashKernels) -> Tensor:
        split = k.shape[-2] - q.shape[-2]
        o1, lse1, saved1 = kernels.forward(q, k[:, :, :split], v[:, :, :split], False)
        o2, lse2, saved2 = kernels.forward(q, k[:, :, split:], v[:, :, split:], True)
        lse = torch.logaddexp(lse1, lse2)
        w1, w2 = (lse1 - lse).exp().unsqueeze(-1), (lse2 - lse).exp().unsqueeze(-1)
        # o1 w1 + o2 w2 in float32 at least, in place on o1 (or its one upcast copy) unless the
        # kernel's outputs are kept as they came (keeping_kernel_outputs)
        wide = upcast(o1)
        scaled = wide * w1 if wide is o1 and _keeping else wide.mul_(w1)
        out = scaled.addcmul_(o2, w2).to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.kernels, ctx.saved = kernels, (saved1, saved2)
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        split, backward = k.shape[-2] - q.shape[-2], ctx.kernels.backward
        dout = dout.contiguous()
        prefix, square = ctx.saved
        dq1, dk1, dv1 = backward(dout, q, k[:, :, :split], v[:, :, :split], out, lse, False, prefix)
        dq2, dk2, dv2 = backward(dout, q, k[:, :, split:], v[:, :, split:], out, lse, True, square)
        return dq1 + dq2, torch.cat([dk1, dk2], dim=2), torch.cat([dv1, dv2], dim=2), None


# ----------------------------------------------------------------------------- decode: one query


def attention_with_lse(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Unmasked attention of q [B, n, Sq, d] to k, v [B, m, Sk, d] (GQA: n = g m) and its
    log-sum-exp: o [B, n, Sq, d] in q's dtype, lse [B, n, Sq] in float32 (float64 stays float64).

    A partial result over some of the keys: partials over disjoint key sets merge exactly by
    ``merge_partials`` (the ring-attention identity). For decode, where Sq is 1, the scores
    [B, n, Sq, Sk] are d times smaller than the keys.
    """
    B, n, sq, d = q.shape
    m = k.shape[1]
    grouped = q.reshape(B, m, (n // m) * sq, d)  # query head i uses key/value head i // g
    scores = upcast(grouped @ k.transpose(-1, -2)).mul_(d**-0.5)
    lse = scores.logsumexp(dim=-1, keepdim=True)
    probs = scores.sub_(lse).exp_()
    o = probs.to(v.dtype) @ v
    return o.view(B, n, sq, d), lse.view(B, n, sq)


def merge_partials(o: Tensor, lse: Tensor) -> tuple[Tensor, Tensor]:
    """Merge P partial attentions stacked on dim 0: o [P, *, d], lse [P, *] -> o [*, d], lse [*].

    o = sum_p exp(lse_p - lse) o_p with lse = log sum_p exp(lse_p), in lse's dtype.
    """
    total = torch.logsumexp(lse, dim=0)
    weights = (lse - total).exp().unsqueeze(-1)
    return (upcast(o) * weights).sum(dim=0), total


def merge_pair(o1: Tensor, lse1: Tensor, o2: Tensor, lse2: Tensor) -> tuple[Tensor, Tensor]:
    """Two partial attentions over disjoint keys merged: o [*, d] (float32 at least), lse [*].

    The ring's step merge (tspbench.dist.ring), the same identity as ``LowerRightCausal``'s:
    lse = log(e^lse1 + e^lse2), o = e^(lse1 - lse) o1 + e^(lse2 - lse) o2. Out of place, so
    kernel outputs kept for op-level recomputation are never written.
    """
    lse = torch.logaddexp(lse1, lse2)
    w1, w2 = (lse1 - lse).exp().unsqueeze(-1), (lse2 - lse).exp().unsqueeze(-1)
    return upcast(o1) * w1 + upcast(o2) * w2, lse


ONE_QUERY_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def one_query_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Decode: o [B, n, 1, d] of q [B, n, 1, d] against every cached position k, v [B, m, S, d]
    (all precede it: no mask), through SDPA but never cuDNN (errors and NaN with a single query
    token). On one H200, over one layer of the 7B's 16K cache at batch 4, SDPA's kernel took
    0.30 ms (3.6 TB/s, results/h200/2026-12-04_887f825); it beat the scores and weighted sum as
    two batched matmuls (0.38 vs 0.54 ms, 2026-12-04_959b60b) and the keys split into five
    chunks attended as heads of a strided view of the cache and merged by log-sum-exp (0.57 ms,
    2026-12-04_887f825)."""
    _called("sdpa_one_query")
    with sdpa_kernel(ONE_QUERY_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])
