"""FlopCounterMode, taught the ops it does not count: the CPU flash-attention kernels (it knows
only the GPU ones) and in-place ``addmm_`` (TSP accumulates its output projections with it).
Hardware FLOPs counted this way are what the analytic model's FLOP terms are checked against."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import (
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

_REGISTERED = False


def register_cpu_attention_flops() -> None:
    """Teach torch's FlopCounterMode the ops it misses: the CPU flash-attention kernels (it counts
    only GPU ones) and in-place ``addmm_`` (TSP accumulates its output projections with it)."""
    global _REGISTERED
    forward = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if _REGISTERED or forward is None or backward is None:
        return

    @register_flop_formula(torch.ops.aten.addmm_)
    def _addmm_(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]

    @register_flop_formula(forward)
    def _forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query_shape, key_shape, value_shape)

    @register_flop_formula(backward)
    def _backward(
        grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
    ) -> int:
        return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)

    _REGISTERED = True


class FlopTally(TorchDispatchMode):
    """Hardware FLOPs of the ops run inside it, by FlopCounterMode's own formulas (torch's
    registry and the ones above), without FlopCounterMode's module hooks: those add autograd
    nodes that keep tensors alive under recomputation, so a FlopCounterMode step can never be
    the memory-measured step, while a FlopTally step can (the fake world saves a step so)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out
