"""The named process groups a layout needs (the layout itself is tspbench.core.spec.Layout).

Ranks are placed row-major over the axes, outer to inner: ``dp`` first, the strategy's axes
after it, innermost last. The innermost axis holds consecutive ranks, so it stays inside a node
(the model-parallel group innermost, as Megatron and torchtitan place it).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.distributed.device_mesh import DeviceMesh

from tspbench.dist.comm import Group


class Mesh:
    """Process groups over named axes. ``dims`` is ordered outer to inner.

    ``group("tp")`` is this rank's group along tp; ``group("dp", "sp")`` the group over both
    axes; ``channel=1`` a second, independent communicator over the same ranks (so two streams
    of collectives can run side by side on NCCL). Groups of every axis combination are created
    up front: ``new_group`` is collective, and at most three axes make seven combinations.
    """

    def __init__(self, dims: dict[str, int], rank: int = 0, channels: int = 1, create: bool = True) -> None:
        self.dims = dict(dims)
        self.names = tuple(self.dims)
        self.rank = rank
        self.world_size = math.prod(self.dims.values())
        self.coords = self._coords(rank)
        self._groups: dict[tuple[tuple[str, ...], int], Group] = {}
        # Every combination of axes, in the same order on every rank (new_group is collective).
        for size in range(1, len(self.names) + 1):
            for combo in itertools.combinations(self.names, size):
                for channel in range(channels):
                    self._groups[(combo, channel)] = self._build(combo, channel, create)

    def _canonical(self, axes: Sequence[str]) -> tuple[str, ...]:
        unknown = [a for a in axes if a not in self.dims]
        if unknown:
            raise KeyError(f"unknown mesh axes {unknown}; this mesh has {list(self.names)}")
        return tuple(a for a in self.names if a in axes)

    def _coords(self, rank: int) -> dict[str, int]:
        coords = {}
        for name in reversed(self.names):
            coords[name] = rank % self.dims[name]
            rank //= self.dims[name]
        return coords

    def _rank_of(self, coords: dict[str, int]) -> int:
        rank = 0
        for name in self.names:
            rank = rank * self.dims[name] + coords[name]
        return rank

    @classmethod
    def planning(cls, dims: dict[str, int], channels: int = 1) -> Mesh:
        """Sizes and rank-0 coordinates only, no process groups: for analytic models and checks."""
        return cls(dims, 0, channels, create=False)

    def _build(self, combo: tuple[str, ...], channel: int, create: bool) -> Group:
        """Create every group of this axis combination (all ranks must call, in the same order)."""
        label = "+".join(combo) + (f"#{channel}" if channel else "")
        others = [a for a in self.names if a not in combo]
        mine: Group | None = None
        for fixed in itertools.product(*(range(self.dims[a]) for a in others)):
            base = dict(zip(others, fixed, strict=True))
            members = tuple(
                self._rank_of({**base, **dict(zip(combo, free, strict=True))})
                for free in itertools.product(*(range(self.dims[a]) for a in combo))
            )
            pg = dist.new_group(list(members)) if create and len(members) > 1 else None
            if self.rank in members:
                mine = Group(label, members, members.index(self.rank), pg)
        assert mine is not None
        return mine

    def group(self, *axes: str, channel: int = 0) -> Group:
        key = (self._canonical(axes), channel)
        if key not in self._groups:
            raise KeyError(f"group {axes} channel {channel}: this mesh has {self.names}, channels 0..")
        return self._groups[key]

    def by_name(self, label: str) -> Group:
        """The group whose label is ``label`` (as recorded in CommRecord.group)."""
        for group in self._groups.values():
            if group.name == label:
                return group
        raise KeyError(f"no group labelled {label!r}; have {sorted(g.name for g in self._groups.values())}")

    def labels(self) -> dict[str, str]:
        """The label of each of this rank's process groups, by its c10d name (for counting at
        dispatch level, tspbench.dist.c10d_count)."""
        return {g.pg.group_name: g.name for g in self._groups.values() if g.pg is not None}

    def size(self, *axes: str) -> int:
        return math.prod(self.dims[a] for a in self._canonical(axes))

    def index(self, axis: str) -> int:
        return self.coords[axis]


def device_mesh(groups: Sequence[Group], device_type: str, names: Sequence[str] | None = None) -> DeviceMesh:
    """torch's DeviceMesh over tspbench's process groups (outermost first), for torch's own
    wrappers (FSDP2). The mesh is host-side bookkeeping (a CPU tensor of ranks it reads with
    ``tolist``), so it is built with any fake tensor mode suspended: a fake world's ranks build
    the same mesh a real one does."""
    with unset_fake_temporarily():
        if len(groups) == 1:
            return DeviceMesh.from_group(groups[0].pg, device_type)
        sizes = [g.size for g in groups]
        ranks = torch.arange(math.prod(sizes)).view(*sizes)
        return DeviceMesh.from_group(
            [g.pg for g in groups], device_type, ranks, mesh_dim_names=tuple(names or ())
        )
