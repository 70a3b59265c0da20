"""Where each local parameter comes from: a Placement names the slices of reference parameters
a rank holds and the mesh axes its gradient is summed over. Shard building, gradient sync and
gathering back to full shape for checks all follow from it (tspbench.strategy.base)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tspbench.core.spec import ModelConfig
from tspbench.model.transformer import Transformer


@dataclass(frozen=True)
class Piece:
    """A slice of one reference parameter: chunk ``index`` of ``parts`` along ``dim`` (None: whole)."""

    full_name: str
    dim: int | None = None
    transpose: bool = False  # stored transposed, so packed pieces share their row length


@dataclass(frozen=True)
class Placement:
    """How a local parameter maps to reference parameters, and where its gradient is summed.

    The local tensor is its pieces' slices concatenated along dim 0; the slice index is this
    rank's coordinate on ``axis``. ``reduce`` lists the mesh axes over which the gradient is
    all-reduced after backward (the axes where the data differs and the weight does not).
    """

    pieces: tuple[Piece, ...]
    axis: str | None = None
    reduce: tuple[str, ...] = ()


def reference_shape(config: ModelConfig, full_name: str) -> tuple[int, ...]:
    """Shape of a reference parameter, read off a meta-device model (cached per config)."""
    return _shapes(config)[full_name]


_SHAPE_CACHE: dict[ModelConfig, dict[str, tuple[int, ...]]] = {}
_PLAN_CACHE: dict[tuple, dict[str, tuple[tuple[int, ...], Placement]]] = {}


def _shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    if config not in _SHAPE_CACHE:
        with torch.device("meta"):
            model = Transformer(config, seed=None)
        _SHAPE_CACHE[config] = {n: tuple(p.shape) for n, p in model.named_parameters()}
    return _SHAPE_CACHE[config]
