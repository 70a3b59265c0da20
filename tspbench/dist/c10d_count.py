"""Collectives counted at dispatch level: every c10d op of a step, whichever library issues it.

torch.distributed sends every collective through a c10d operator in the dispatcher
(``c10d::allreduce_``, ``c10d::_allgather_base_``, ...), which is what torch's own CommDebugMode
counts. A TorchDispatchMode sees each one with its tensors and its process group, so DDP's
bucket all-reduces and FSDP2's all-gathers and reduce-scatters become the same CommRecords
(op, phase, group size, message bytes) as tspbench.dist.comm's primitives, in their convention:

    c10d op                                                   op               message
    allreduce_, allreduce_coalesced_                          all_reduce       the tensors
    _allgather_base_, allgather_, allgather_into_tensor_coalesced_
                                                              all_gather       the outputs
    _reduce_scatter_base_, reduce_scatter_, reduce_scatter_tensor_coalesced_
                                                              reduce_scatter   the inputs
    alltoall_base_, alltoall_                                 all_to_all       the inputs
    broadcast_                                                broadcast        the tensors
    reduce_                                                   reduce           the tensors
    send (its recv_ is the other half)                        send_recv        the tensors sent

Not counted: barriers (synchronisation, not data), ``recv_`` (counted at the sender) and ops on
a group of one. Any other collective - gather, scatter, the functional collectives of
``torch.distributed._functional_collectives`` - raises, so nothing moves uncounted.

``C10dCounter.records`` holds every collective seen, including the ones tspbench.dist.comm
issued and counted itself (the cross-check of those counts); ``into`` receives only the others,
so a step's CommLog counts each collective exactly once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tspbench.dist import comm
from tspbench.dist.comm import CommLog, CommRecord

# tspbench op, index of the counted tensors, index of the process group: the c10d ops that are it
_OPS = {
    ("all_reduce", 0, 1): "allreduce_ allreduce_coalesced_",
    ("all_gather", 0, 2): "_allgather_base_ allgather_ allgather_into_tensor_coalesced_",
    ("reduce_scatter", 1, 2): "_reduce_scatter_base_ reduce_scatter_ reduce_scatter_tensor_coalesced_",
    ("all_to_all", 1, 2): "alltoall_base_ alltoall_",
    ("broadcast", 0, 1): "broadcast_",
    ("reduce", 0, 1): "reduce_",
    ("send_recv", 0, 1): "send",
}
# c10d op -> (tspbench op, index of the counted tensors, index of the process group)
C10D_OPS: dict[str, tuple[str, int, int]] = {
    name: how for how, names in _OPS.items() for name in names.split()
}
NOT_DATA = ("barrier", "monitored_barrier_", "recv_", "recv_any_source_")


def _nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(tensors) if isinstance(t, torch.Tensor))


class C10dCounter(TorchDispatchMode):
    """Inside ``with C10dCounter(log):`` every c10d collective this thread dispatches is counted.

    ``labels`` maps a process group's c10d name (``ProcessGroup.group_name``) to the label
    tspbench.dist.mesh gives it ("dp+fsdp"); unknown groups keep their c10d name.
    """

    def __init__(self, into: CommLog | None = None, labels: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.into = into
        self.labels = dict(labels or {})
        self.records: list[CommRecord] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, _, name = func.name().partition("::")
        if namespace in ("c10d", "_c10d_functional"):
            self._count(namespace, name, args)
        return func(*args, **(kwargs or {}))

    def _count(self, namespace: str, name: str, args: tuple) -> None:
        if name in NOT_DATA or name.startswith("wait"):
            return
        if namespace != "c10d" or name not in C10D_OPS:
            raise RuntimeError(f"collective {namespace}::{name} is not counted by tspbench.dist.c10d_count")
        op, tensors, group = C10D_OPS[name]
        pg = dist.ProcessGroup.unbox(args[group])
        if pg.size() == 1:
            return
        label = self.labels.get(pg.group_name, pg.group_name)
        record = CommRecord(op, comm.current_phase(), pg.size(), _nbytes(args[tensors]), group=label)
        self.records.append(record)
        if self.into is not None and not comm.issued_here():
            self.into.add(record)
