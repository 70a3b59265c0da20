"""The model's operators: fused RMSNorm and SwiGLU, rotary embeddings, causal attention.

Each fused operator is an autograd Function that saves what a fused kernel would (so the
memory the CPU tracker measures is what a GPU kernel keeps). Causal attention is bottom-right
aligned, so a query chunk can sit at the end of a longer key prefix (sequence parallelism).
Shapes follow the legend in tspbench/model/transformer.py. Nothing here imports
torch.distributed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


class _RMSNorm(torch.autograd.Function):
    """y = x * rsqrt(mean(x^2) + eps) * w. Saves x and rstd [B, S, 1], like a fused kernel.

    The statistics are float32 for half-precision x (float64 stays float64). The working set is
    kept small, since at long sequences a [B, S, h] float32 temporary is bigger than the MLP's
    (TP shards the MLP, never the norm): forward holds x * rstd (float32) and y; backward
    x-hat and dx-hat (float32, updated in place) and one product at a time - 3 float32
    [B, S, h] at most.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        square_norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=stat_dtype(x)).square_()
        rstd = square_norm.div_(x.shape[-1]).add_(eps).rsqrt_()
        ctx.save_for_backward(x, rstd, weight)
        normed = x * rstd  # float32 for half x (type promotion), no upcast copy of x
        return normed.to(x.dtype).mul_(weight) if normed.dtype != x.dtype else normed.mul_(weight)

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, rstd, weight = ctx.saved_tensors
        xhat = x * rstd
        dw = (dy * xhat).reshape(-1, x.shape[-1]).sum(0)
        dxhat = dy * upcast(weight)
        mean = (dxhat * xhat).mean(-1, keepdim=True)
        dx = dxhat.sub_(xhat.mul_(mean)).mul_(rstd)  # rstd (dxhat - xhat mean(dxhat xhat))
        return dx.to(x.dtype), dw.to(weight.dtype), None


class _SwiGLU(torch.autograd.Function):
    """a = silu(h1) * h3. Saves h1 and h3 only (a fused gated activation)."""

    @staticmethod
    def forward(ctx, h1: Tensor, h3: Tensor) -> Tensor:
        ctx.save_for_backward(h1, h3)
        return F.silu(h1) * h3

    @staticmethod
    def backward(ctx, da: Tensor):
        h1, h3 = ctx.saved_tensors
        return swiglu_backward(h1, h3, da)


def upcast(x: Tensor) -> Tensor:
    """float32 for half-precision tensors (norm statistics, softmax, loss); unchanged otherwise."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def stat_dtype(x: Tensor) -> torch.dtype:
    """The dtype statistics of ``x`` are computed in: float32 for half precision, else its own."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def swiglu_backward(h1: Tensor, h3: Tensor, da: Tensor) -> tuple[Tensor, Tensor]:
    """Gradients of silu(h1) * h3 with respect to h1 and h3."""
    sig = torch.sigmoid(h1)
    silu = h1 * sig
    return da * h3 * sig * (1 + h1 * (1 - sig)), da * silu


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return _RMSNorm.apply(x, weight, eps)


def swiglu(h1: Tensor, h3: Tensor) -> Tensor:
    return _SwiGLU.apply(h1, h3)


def rope_tables(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos, sin [S, d] for the given (true, possibly non-contiguous) token positions."""
    inv_freq = theta ** -(
        torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float64) / head_dim
    )
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x [B, n, S, d] by its positions (half-split layout).

    The rotation is orthogonal: its transpose (the backward) is apply_rope(g, cos, -sin).
    """
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal attention with bottom-right alignment: o [B, n, Sq, d] from q [B, n, Sq, d], k, v [B, m, Sk, d].

    A query chunk may sit at the end of a longer key prefix (Sq <= Sk): query i sees keys
    j <= i + Sk - Sq. Sequence-parallel strategies rely on this. Where a flash kernel exists (CUDA
    in bf16/fp16, CPU), a chunk at an offset is split into what every backend defines the same
    way - the key prefix with no mask, and a causal square (top-left and bottom-right alignment
    coincide) - merged by log-sum-exp (``LowerRightCausal``); no kernel is ever asked for a
    non-square causal mask, whose alignment differs between backends and which SDPA refuses on
    its flash path. No O(Sq Sk) mask is built. Elsewhere: SDPA's math path with an explicit mask.

    The kernel follows the tensors' device and dtype only, never whether their values exist:
    under fake tensors (tspbench.measure.fake) each call is the one the real device runs. On
    CUDA the flash kernel is called by name, because SDPA's own choice asks the GPU, and fake
    CUDA tensors would get the math path with its [Sq, Sk] score matrix.
    """
    sq, sk = q.shape[-2], k.shape[-2]
    if sq > sk:
        raise ValueError(f"query length {sq} exceeds key length {sk}")
    kernels = flash_kernels(q)
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


def lower_right_mask(sq: int, sk: int, like: Tensor) -> Tensor:
    """Additive [Sq, Sk] mask: query i sees keys j <= i + Sk - Sq."""
    keep = torch.ones(sq, sk, dtype=torch.bool, device=like.device).tril(sk - sq)
    return torch.zeros(sq, sk, dtype=like.dtype, device=like.device).masked_fill_(~keep, float("-inf"))


@dataclass(frozen=True)
class FlashKernels:
    """A device's flash attention, called only where every backend agrees on the semantics.

    ``forward(q, k, v, causal)`` -> (o, lse, saved) and ``backward(dout, q, k, v, o, lse, causal,
    saved)`` -> (dq, dk, dv), with ``causal`` only ever True for a square (Sq == Sk) block.
    ``backward`` takes the o and lse it is given, not the call's own: with a merged o and its
    global log-sum-exp each part's gradient is exact (the ring-attention identity).
    ``square``: the causal square as an autograd op (None: SDPA's own choice is right here).
    """

    name: str
    forward: Callable[[Tensor, Tensor, Tensor, bool], tuple[Tensor, Tensor, tuple]]
    backward: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool, tuple], tuple[Tensor, ...]]
    square: Callable[[Tensor, Tensor, Tensor], Tensor] | None = None


# Looked up at call time (tests put a math implementation of the same schema in their place).
CUDA_FLASH_OPS = {
    "forward": torch.ops.aten._scaled_dot_product_flash_attention,
    "backward": torch.ops.aten._scaled_dot_product_flash_attention_backward,
}


def _cuda_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, Tensor, tuple]:
    out = CUDA_FLASH_OPS["forward"](q, k, v, 0.0, causal)
    return out[0], out[1], tuple(out[2:8])  # cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused


def _cuda_backward(dout, q, k, v, o, lse, causal: bool, saved: tuple) -> tuple[Tensor, ...]:
    cum_q, cum_k, max_q, max_k, philox_seed, philox_offset = saved
    return CUDA_FLASH_OPS["backward"](
        dout, q, k, v, o, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, philox_seed, philox_offset
    )


def _cuda_square(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return CUDA_FLASH_OPS["forward"](q, k, v, 0.0, True)[0]


def _cpu_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, Tensor, tuple]:
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return o, lse, ()


def _cpu_backward(dout, q, k, v, o, lse, causal: bool, saved: tuple) -> tuple[Tensor, ...]:
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    return kernel(dout, q, k, v, o, lse, 0.0, causal)


# CUDA: the FlashAttention-2 kernel; its causal square is the call SDPA makes for is_causal.
CUDA_FLASH = FlashKernels("cuda flash", _cuda_forward, _cuda_backward, square=_cuda_square)
# CPU: torch's CPU flash kernel; squares go through SDPA, which picks the same kernel here.
CPU_FLASH = FlashKernels("cpu flash", _cpu_forward, _cpu_backward)


def flash_kernels(q: Tensor) -> FlashKernels | None:
    """The flash kernels for q's device and dtype, or None where there are none (math path)."""
    if q.is_cuda:
        return CUDA_FLASH if q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256 else None
    if q.device.type == "cpu" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
        return CPU_FLASH
    return None


class LowerRightCausal(torch.autograd.Function):
    """Bottom-right causal attention of a query chunk at an offset (Sq < Sk), with no [Sq, Sk] mask.

    The key prefix before the query chunk is fully visible and the last Sq keys form a square
    causal block: two flash calls (no mask; causal square) merged by their log-sum-exps. K/V
    have the query's heads (grouped K/V are repeated first, as SDPA does for them). Saves
    q, k, v, o and the merged log-sum-exp, as a flash kernel does. Backward calls each part's
    flash backward with the merged o and lse, whose softmax normaliser is the global one (the
    ring-attention identity), sums dq and concatenates dk, dv.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, kernels: FlashKernels) -> Tensor:
        split = k.shape[-2] - q.shape[-2]
        o1, lse1, saved1 = kernels.forward(q, k[:, :, :split], v[:, :, :split], False)
        o2, lse2, saved2 = kernels.forward(q, k[:, :, split:], v[:, :, split:], True)
        lse = torch.logaddexp(lse1, lse2)
        w1, w2 = (lse1 - lse).exp().unsqueeze(-1), (lse2 - lse).exp().unsqueeze(-1)
        # o1 w1 + o2 w2 in float32 at least, in place on o1 (or its one upcast copy)
        out = upcast(o1).mul_(w1).addcmul_(o2, w2).to(q.dtype)
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


def identity(x: Tensor) -> Tensor:
    return x
