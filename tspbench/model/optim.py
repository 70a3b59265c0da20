"""The dtype policy and the optimizer every strategy and the reference use.

    dtype      weights, activations, grads    optimizer (AdamW)
    float64    float64                        torch AdamW, states float64   (CPU exactness checks)
    float32    float32                        torch AdamW, states float32
    bfloat16   bfloat16                       float32 master weights + float32 m, v (12 B/param)

Each rank steps only the parameters it holds, so sharded parameters mean sharded optimizer
state. torch's AdamW runs per parameter (``foreach=False``) on CPU, and fused on CUDA, so its
working memory stays at a few parameter-sized buffers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn

TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.95), 1e-8, 0.1


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a dtype name (tspbench.core.names.DTYPES)."""
    if name not in TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {list(TORCH_DTYPES)}, got {name!r}")
    return TORCH_DTYPES[name]


class MasterAdamW:
    """AdamW on float32 master copies of low-precision parameters (same math as torch.optim.AdamW)."""

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        lr: float = LR,
        betas: tuple[float, float] = BETAS,
        eps: float = EPS,
        weight_decay: float = WEIGHT_DECAY,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.master_params = [p.detach().float().clone() for p in self.params]
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.state: dict[Tensor, dict[str, Tensor]] = {}
        self.steps = 0

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        b1, b2 = self.betas
        bc1, bc2_sqrt = 1 - b1**self.steps, math.sqrt(1 - b2**self.steps)
        for p, master in zip(self.params, self.master_params, strict=True):
            if p.grad is None:
                continue
            if master not in self.state:  # once (a setdefault default is built, and zeroed, every step)
                self.state[master] = {
                    "exp_avg": torch.zeros_like(master),
                    "exp_avg_sq": torch.zeros_like(master),
                }
            state = self.state[master]
            grad = p.grad.float()
            state["exp_avg"].lerp_(grad, 1 - b1)
            state["exp_avg_sq"].mul_(b2).addcmul_(grad, grad, value=1 - b2)
            del grad
            master.mul_(1 - self.lr * self.weight_decay)
            denom = (state["exp_avg_sq"].sqrt() / bc2_sqrt).add_(self.eps)
            master.addcdiv_(state["exp_avg"], denom, value=-self.lr / bc1)
            p.copy_(master)


def step_bytes_per_element(element_size: int, on_gpu: bool) -> int:
    """Bytes one AdamW step of ``build_optimizer``'s choice reads and writes per parameter element
    (the time model prices the optimizer by them), kernel by kernel, at e = ``element_size``:

        MasterAdamW (16-bit, float32 master, m, v): gradient cast 2 + 4, lerp_ m 12, mul_ v 8,
            addcmul_ v 16, decay mul_ 8, sqrt 8, div 8, add_ 8, addcdiv_ 16, copy out 4 + 2 = 96
        fused (GPU): reads parameter, gradient, m, v; writes parameter, m, v and, as its
            schema declares, the gradient (unscaled in place under a grad scaler)     = 8 e
        per parameter (CPU): decay mul_ 2e, lerp_ 3e, mul_ 2e, addcmul_ 4e, sqrt 2e,
            div 2e, add_ 2e, addcdiv_ 4e                                            = 21 e
    """
    if element_size < 4:
        return 96
    return 8 * element_size if on_gpu else 21 * element_size


def build_optimizer(params: Iterable[nn.Parameter], dtype: torch.dtype):
    """AdamW for ``params`` under the dtype policy above."""
    params = [p for p in params if p.requires_grad]
    if dtype in (torch.float16, torch.bfloat16):
        return MasterAdamW(params)
    impl = {"fused": True} if params and params[0].is_cuda else {"foreach": False}
    return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, **impl)
