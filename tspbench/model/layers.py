"""The model's operators: fused RMSNorm and SwiGLU, rotary embeddings, attention against a cache.

Each fused operator is an autograd Function that saves what a fused kernel would (so the
memory the CPU tracker measures is what a GPU kernel keeps). Causal attention is bottom-right
aligned, so a query chunk can sit at the end of a longer key prefix (sequence parallelism).
Shapes follow the legend in tspbench/model/transformer.py. Nothing here imports
torch.distributed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# causal attention and its kernels live in tspbench.model.attention; re-exported for callers here
from tspbench.model.attention import (  # noqa: F401
    LowerRightCausal,
    attention_with_lse,
    causal_attention,
    merge_partials,
    repeat_kv,
    upcast,
)


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


def identity(x: Tensor) -> Tensor:
    return x
