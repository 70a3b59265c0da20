"""What memory a tensor holds: its storages (through wrapper subclasses), their identity, the
tensors an op writes to, and the bytes of a model's persistent state. Shared by the dispatch
tracker (tspbench.measure.tracker) and the runner's state record."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves


def storage_key(storage: torch.UntypedStorage) -> int:
    """The identity of a storage (its StorageImpl), the same for every view of it. Not its data
    pointer: under fake tensors every storage's data pointer is 0."""
    return storage._cdata


def storages(t: Tensor) -> list[torch.UntypedStorage]:
    """The storages behind ``t``: its own, or for a wrapper subclass (FSDP2's DTensor
    parameters, gradients and optimizer state) those of the local tensors it wraps. (As
    torch.distributed._tools.common_utils.get_untyped_storages does; that module costs 2.4 s to
    import.)"""
    if is_traceable_wrapper_subclass(t):
        attrs, _ = t.__tensor_flatten__()
        return [s for a in attrs if isinstance(inner := getattr(t, a), Tensor) for s in storages(inner)]
    return [t.untyped_storage()]


_WRITTEN_ARGS: dict[object, tuple[tuple[int, str], ...]] = {}


def written_tensors(func, args: tuple, kwargs: dict | None) -> list[Tensor]:
    """The tensors ``func`` writes to (its schema's mutable arguments: ``self`` of an in-place op,
    ``out=``), whose storages it may reallocate."""
    if func not in _WRITTEN_ARGS:
        schema = getattr(func, "_schema", None)
        _WRITTEN_ARGS[func] = tuple(
            (i, a.name)
            for i, a in enumerate(schema.arguments if schema is not None else ())
            if a.alias_info is not None and a.alias_info.is_write
        )
    out = []
    for i, name in _WRITTEN_ARGS[func]:
        value = args[i] if i < len(args) else (kwargs or {}).get(name)
        out += [t for t in tree_leaves(value) if isinstance(t, Tensor)]
    return out


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """Every tensor of the optimizer's state on its parameter's device, the float32 master
    weights of tspbench.model.optim.MasterAdamW included.

    0-dim tensors count too: torch AdamW keeps a ``step`` scalar per parameter (4 B each here,
    a 512 B block each on CUDA with the fused optimizer), as torch's MemTracker counts it. A state
    tensor on another device than its parameter (an unfused AdamW's CPU ``step`` of a CUDA
    parameter) is host memory, not the device's.
    """
    tensors: list[Tensor] = []
    for param, state in optimizer.state.items():
        tensors.extend(v for v in state.values() if isinstance(v, Tensor) and v.device == param.device)
    master = getattr(optimizer, "master_params", None)
    if master:
        tensors.extend(master)
    return tensors


def persistent_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state (storages counted once)."""

    def total(tensors: Iterable[Tensor]) -> int:
        seen: dict[int, int] = {}
        for t in tensors:
            for s in storages(t):
                seen[storage_key(s)] = s.nbytes()
        return sum(seen.values())

    params = list(model.parameters())
    return {
        "parameters": total(params),
        "gradients": total(p.grad for p in params if p.grad is not None),
        "optimizer": total(optimizer_state_tensors(optimizer)) if optimizer is not None else 0,
    }
