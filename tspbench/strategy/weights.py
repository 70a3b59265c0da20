"""Where every parameter comes from: a strategy's weights built from their Placement, and gathered
back to full shape for checks (tspbench.strategy.base.Strategy inherits it).

A plugin says, per parameter, which slice of which reference weight a rank holds (``placement``),
swaps the model's hook points for its collectives (``transform``) and may hand the built model to
torch's own wrappers (``wrap``). The rest follows here once from those declarations: the meta
model, each rank's shards cut from the reference weights (the same seed as the single-device
reference, so losses and gradients compare exactly), the local shapes the analytic model counts,
and the full tensors a check compares.

Uses Strategy's ``config``, ``workload``, ``layout`` and ``device``, its ``placements``,
``data_axes``, ``group`` and ``_axis`` (tspbench.strategy.base).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from tspbench.dist import comm
from tspbench.model.optim import torch_dtype
from tspbench.model.transformer import Transformer, reference_parameter
from tspbench.strategy.placement import Piece, Placement, reference_shape


class Weights:
    """The parameters' half of Strategy (mixed into it; uses its config, mesh and placements)."""

    # ------------------------------------------------------------------ the hooks a plugin gives
    def placement(self, name: str, shape: tuple[int, ...]) -> Placement:
        """Where local parameter ``name`` of the (unsharded-shape) meta model comes from."""
        return Placement((Piece(name),), reduce=self.data_axes())

    def transform(self, model: Transformer) -> None:
        """Swap hook points and modules for this strategy's collectives (on the meta model)."""

    def wrap(self, model: nn.Module) -> None:
        """Hand the built model, its weights materialized, to torch's own parallel wrappers
        (DDP's reducer, FSDP2's fully_shard), in place: it keeps its parameter names."""

    def resident_tensors(self) -> list[Tensor]:
        """Buffers a wrapper holds across steps besides parameters, gradients and optimizer
        state (DDP's gradient buckets): the CPU memory tracker counts them from a step's start."""
        return []

    # ------------------------------------------------------------------ building this rank's model
    def _meta_model(self) -> Transformer:
        with torch.device("meta"):
            model = Transformer(self.config, seed=None)
        self.transform(model)
        for name, param in model.named_parameters():
            self.placements[name] = self.placement(name, tuple(param.shape))
        return model

    def build(self) -> nn.Module:
        """This rank's model: hooks swapped, every parameter its slice of the reference weights."""
        model = self._meta_model()
        for name, placement in self.placements.items():
            module_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(module_name), attr, nn.Parameter(self.materialize(placement)))
        model.set_recompute(self.workload.recompute)
        self.wrap(model)
        return model

    # ------------------------------------------------------------------ shapes and shards
    def local_parameters(self) -> dict[str, tuple[tuple[int, ...], Placement]]:
        """Local shape and placement of every parameter this rank holds (cached: building even a
        meta 7B model costs ~30 ms, and the planner asks for thousands of points)."""
        key = (type(self), self.layout, self.config, self.workload.megatron_sp)
        if key not in _PARAMETER_PLANS:
            self._meta_model()
            _PARAMETER_PLANS[key] = {name: (self.local_shape(pl), pl) for name, pl in self.placements.items()}
        return _PARAMETER_PLANS[key]

    def local_shape(self, placement: Placement) -> tuple[int, ...]:
        parts = self._axis(placement.axis)[0]
        shapes = []
        for piece in placement.pieces:
            shape = list(reference_shape(self.config, piece.full_name))
            if piece.dim is not None:
                shape[piece.dim] //= parts
            shapes.append(shape[::-1] if piece.transpose else shape)
        return (sum(sh[0] for sh in shapes), *shapes[0][1:])

    def materialize(self, placement: Placement) -> Tensor:
        parts, index = self._axis(placement.axis)
        slices = []
        for piece in placement.pieces:
            full = self.reference(piece.full_name)
            part = full if piece.dim is None else full.chunk(parts, dim=piece.dim)[index]
            slices.append(part.t() if piece.transpose else part)
        return torch.cat(slices, dim=0).contiguous() if len(slices) > 1 else slices[0].clone()

    def reference(self, full_name: str) -> Tensor:
        shape = reference_shape(self.config, full_name)
        return reference_parameter(
            self.config, full_name, shape, self.workload.seed, self.device, torch_dtype(self.workload.dtype)
        )

    # ------------------------------------------------------------------ checks (not measured)
    def full_tensors(self, model: nn.Module, grads: bool = False) -> dict[str, Tensor]:
        """Every reference parameter (or its gradient) reassembled at full shape, on every rank."""
        out: dict[str, Tensor] = {}
        for name, p in model.named_parameters():
            local = p.grad if grads else p.detach()
            if local is None:
                local = torch.zeros_like(p)
            if isinstance(local, DTensor):  # FSDP2's shards: DTensor gathers itself
                local = local.full_tensor()
            out.update(self._unshard(self.placements[name], local))
        return out

    def _unshard(self, placement: Placement, local: Tensor) -> dict[str, Tensor]:
        parts, _ = self._axis(placement.axis)
        stacked = (
            comm.all_gather(local.contiguous(), self.group(placement.axis)) if parts > 1 else local[None]
        )
        sizes = [self._piece_rows(piece, placement.axis) for piece in placement.pieces]
        out = {}
        for piece, rows in zip(placement.pieces, stacked.split(sizes, dim=1), strict=True):
            chunks = [r.t() if piece.transpose else r for r in rows.unbind(0)]
            out[piece.full_name] = chunks[0] if piece.dim is None else torch.cat(chunks, dim=piece.dim)
        return {k: v.contiguous() for k, v in out.items()}

    def _piece_rows(self, piece: Piece, axis: str | None) -> int:
        shape = list(reference_shape(self.config, piece.full_name))
        if piece.dim is not None:
            shape[piece.dim] //= self._axis(axis)[0]
        return shape[1] if piece.transpose else shape[0]


_PARAMETER_PLANS: dict[tuple, dict[str, tuple[tuple[int, ...], Placement]]] = {}
