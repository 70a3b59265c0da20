"""Overhead of tspbench.comm's counted wrappers against raw torch.distributed, at world size 2.

Each round issues CALLS all-reduces of the same tensor; the difference between the two variants
is the wrappers' bookkeeping (size checks, counting, Pending) per call.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tspbench.dist import comm
from tspbench.dist.mesh import Mesh

CALLS = 200
SIZES = {"4KiB": 1024, "1MiB": 256 * 1024}
_GROUP: list = []


def all_reduces(numel: int, wrapped: bool) -> None:
    if not _GROUP:
        _GROUP.append(Mesh({"x": 2}, dist.get_rank()).group("x"))
    group = _GROUP[0]
    x = torch.ones(numel)
    with comm.counting():
        for _ in range(CALLS):
            if wrapped:
                comm.all_reduce(x, group)
            else:
                dist.all_reduce(x, group=group.pg)


@pytest.mark.parametrize("wrapped", [False, True], ids=["torch.distributed", "tspbench.comm"])
@pytest.mark.parametrize("size", list(SIZES))
def test_all_reduce_overhead(benchmark, world2, size: str, wrapped: bool) -> None:
    world2.call(all_reduces, SIZES[size], wrapped)
    benchmark.group = f"all_reduce x{CALLS} {size}"
    benchmark.pedantic(world2.call, args=(all_reduces, SIZES[size], wrapped), rounds=10, iterations=1)
