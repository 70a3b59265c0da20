"""Recording a step trace (tspbench.core.trace) where the step runs: a real CPU rank or a rank of
the fake world, op by op, with the same dispatch-level view that counts memory, comm and FLOPs.

    with StepRecorder(rank, mesh.labels()) as recorder:   # a TorchDispatchMode
        run.step()
    trace = recorder.trace()

What it sees, in program order:
- every aten op (on the local tensors of a DTensor): its name, shapes and dtypes, cost class,
  hardware FLOPs (FlopCounterMode's formulas), bytes read and written, phase and CUDA stream;
- every collective: tspbench's own as tspbench.dist.comm issues them (op, group, message bytes,
  async or blocking) and where ``Pending.wait`` waits on them; those torch's wrappers issue (DDP,
  FSDP2) at dispatch level, async, waited where their result is first used;
- on the simulated GPU (tspbench.measure.simulated_gpu), the stream each op runs on and the
  events and stream waits that order the streams (FSDP2's all-gather and reduce-scatter streams);
- marks around each decoder layer's forward (``mark_layers``), for the Gantt figure.
Ops issued while a collective's result is pending and that touch its buffers wait for it first
(a WAIT row before the op): that is where a program without an explicit wait consumes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from tspbench.core.names import PHASES
from tspbench.core.trace import (
    ASYNC,
    ATTENTION,
    CAUSAL,
    COLLECTIVE,
    COMPUTE,
    EVENT,
    ISSUE,
    MARK,
    RECORD,
    VIEW,
    WAIT,
    Group,
    RankTrace,
    op_class,
)
from tspbench.dist import comm
from tspbench.dist.c10d_count import C10D_OPS, NOT_DATA
from tspbench.measure import simulated_gpu
from tspbench.measure.flop_counter import register_cpu_attention_flops

_DEVICE = torch.ops.prim.device.default
# where is_causal sits among an attention op's positional arguments
_CAUSAL_ARG = {
    "_scaled_dot_product_flash_attention": 4,
    "_scaled_dot_product_flash_attention_for_cpu": 4,
    "_scaled_dot_product_flash_attention_backward": 11,
    "_scaled_dot_product_flash_attention_for_cpu_backward": 7,
    "_scaled_dot_product_cudnn_attention": 6,
    "_scaled_dot_product_cudnn_attention_backward": 14,
}
_PHASE = {p: i for i, p in enumerate(PHASES)}


class StepRecorder(TorchDispatchMode):
    """Records every op and collective of the step run inside it (this thread and the autograd
    threads it hands its modes to), as a RankTrace."""

    def __init__(self, rank: int, labels: Mapping[str, str] | None = None) -> None:
        super().__init__()
        register_cpu_attention_flops()
        self.rank, self.labels = rank, dict(labels or {})
        self.rows: list[tuple] = []
        self.names: list[str] = []
        self._name_ids: dict[str, int] = {}
        self.sigs: list[str] = []
        self._sig_ids: dict[tuple, int] = {}
        self.groups: list[Group] = []
        self._group_ids: dict[Group, int] = {}
        self._pending: dict[int, int] = {}  # storage key of a collective's buffer -> its ISSUE row
        self._classes: dict[Any, int] = {}
        self._fake_mode: object = None

    # ---------------------------------------------------------------- tables
    def _name(self, name: str) -> int:
        if name not in self._name_ids:
            self._name_ids[name] = len(self.names)
            self.names.append(name)
        return self._name_ids[name]

    def _sig(self, tensors: list[Tensor], outputs: list[Tensor]) -> int:
        key = (
            *[(tuple(t.shape), t.dtype) for t in tensors],
            None,
            *[(tuple(t.shape), t.dtype) for t in outputs],
        )
        if key not in self._sig_ids:
            self._sig_ids[key] = len(self.sigs)
            self.sigs.append(_signature(tensors, outputs))
        return self._sig_ids[key]

    def _group(self, label: str, ranks: tuple[int, ...]) -> int:
        group = Group(label, ranks)
        if group not in self._group_ids:
            self._group_ids[group] = len(self.groups)
            self.groups.append(group)
        return self._group_ids[group]

    def _row(self, kind: int, name: str, **cols: Any) -> int:
        row = (
            kind,
            self._name(name),
            cols.get("sig", -1),
            cols.get("cls", VIEW),
            cols.get("flags", 0),
            float(cols.get("flops", 0)),
            float(cols.get("nbytes", 0)),
            cols.get("size", 0),
            cols.get("stream", simulated_gpu.current_stream_id()),
            _PHASE.get(comm.current_phase(), 0),
            cols.get("group", -1),
            cols.get("ref", -1),
        )
        self.rows.append(row)
        return len(self.rows) - 1

    # ---------------------------------------------------------------- collectives
    def issue(self, op: str, label: str, ranks: tuple[int, ...], nbytes: int, async_op: bool) -> int:
        """A collective issued (ISSUE row); its row number, for ``wait``."""
        flags = ASYNC if async_op else 0
        return self._row(
            ISSUE, op, cls=COLLECTIVE, nbytes=nbytes, group=self._group(label, ranks), flags=flags
        )

    def pending(self, row: int, buffers: list[Tensor]) -> None:
        """The buffers an async collective writes: an op touching one waits for it first."""
        for t in buffers:
            self._pending[t.untyped_storage()._cdata] = row

    def wait(self, row: int) -> None:
        """The current stream waits for the collective at ``row`` (WAIT row)."""
        self._row(WAIT, self.names[self.rows[row][1]], ref=row)
        for key in [k for k, r in self._pending.items() if r == row]:
            del self._pending[key]

    def mark(self, label: str, end: bool) -> None:
        self._row(MARK, label, ref=int(end))

    def stream_event(self, kind: int, stream: int, event: int) -> None:
        self._row(kind, "record" if kind == RECORD else "wait_event", stream=stream, ref=event)

    # ---------------------------------------------------------------- dispatch
    def __enter__(self) -> StepRecorder:
        self._fake_mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
        comm.set_tracer(self)
        simulated_gpu.set_listener(self)
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        comm.set_tracer(None)
        simulated_gpu.set_listener(None)
        super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _DEVICE:
            return func(*args, **kwargs)
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            return NotImplemented  # a DTensor op: record the local ops it desugars into
        leaves = [t for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)]
        if FakeTensor in types and any(self._inferring(t) for t in leaves):
            return func(*args, **kwargs)  # DTensor's placement inference on fake tensors
        if func.namespace == "c10d":
            return self._c10d(func, args, kwargs)
        if func.namespace == "_c10d_functional":
            return func(*args, **kwargs)  # only DTensor's loss_parallel uses these here: not timed
        self._consume(leaves)
        out = func(*args, **kwargs)
        self._compute(func, args, kwargs, leaves, out)
        return out

    def _inferring(self, t: Tensor) -> bool:
        return isinstance(t, FakeTensor) and t.fake_mode is not self._fake_mode

    def _consume(self, tensors: list[Tensor]) -> None:
        """WAIT rows for the pending collectives whose buffers this op touches."""
        if not self._pending:
            return
        rows = {self._pending.get(t.untyped_storage()._cdata) for t in tensors} - {None}
        for row in sorted(rows):
            self.wait(row)

    def _compute(self, func, args: tuple, kwargs: dict, tensors: list[Tensor], out: object) -> None:
        cls = self._class(func)
        outputs = [
            t for t in ((out,) if isinstance(out, Tensor) else tree_leaves(out)) if isinstance(t, Tensor)
        ]
        name = func.overloadpacket.__name__
        cols: dict[str, Any] = {"cls": cls, "sig": self._sig(tensors, outputs)}
        if cls != VIEW:
            cols["nbytes"] = _moved(func, args, tensors, outputs)
            formula = flop_registry.get(func._overloadpacket)
            if formula is not None:
                cols["flops"] = formula(*args, **kwargs, out_val=out)
        if cls == ATTENTION:
            cols.update(_attention(name, args, kwargs))
        self._row(COMPUTE, name, **cols)

    def _class(self, func) -> int:
        if func not in self._classes:
            returns = getattr(func, "_schema", None)
            aliasing = (
                returns is not None
                and returns.returns
                and all(r.alias_info is not None and not r.alias_info.is_write for r in returns.returns)
            )
            named = op_class(func.overloadpacket.__name__)
            self._classes[func] = VIEW if aliasing or named == VIEW else named
        return self._classes[func]

    def _c10d(self, func, args: tuple, kwargs: dict):
        """A c10d op: tspbench's own are recorded by comm as it issues them; a wrapper's (DDP,
        FSDP2) here, async, its written buffers pending until first use."""
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if comm.issued_here() or name in NOT_DATA or name.startswith("wait") or name not in C10D_OPS:
            return out
        op, counted, group_arg = C10D_OPS[name]
        pg = dist.ProcessGroup.unbox(args[group_arg])
        if pg.size() == 1:
            return out
        nbytes = sum(_nbytes(t) for t in tree_leaves(args[counted]) if isinstance(t, Tensor))
        ranks = tuple(dist.get_process_group_ranks(pg))
        row = self.issue(op, self.labels.get(pg.group_name, pg.group_name), ranks, nbytes, True)
        self.pending(row, _written(func, args))
        return out

    def trace(self) -> RankTrace:
        events = np.array(self.rows, dtype=EVENT) if self.rows else np.zeros(0, dtype=EVENT)
        return RankTrace(
            self.rank,
            events,
            list(self.names),
            list(self.sigs),
            list(self.groups),
            simulated_gpu.stream_names(),
        )


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


OVERWRITES = frozenset({"copy_", "_foreach_copy_", "fill_", "zero_"})  # write a destination unread
# Copy their first argument's tensors into a slot of a buffer they take and return whole.
SLOT_COPIES = frozenset({"all_gather_copy_in"})  # FSDP2: the shards into the all-gather input


# Read only their argument's shape and dtype: what they move is what they write.
FILLS = frozenset({"zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full"})


def _moved(func, args: tuple, tensors: list[Tensor], outputs: list[Tensor]) -> int:
    """Bytes an op reads and writes: its tensor arguments (not the destination an overwrite
    does not read, nor the template of a fill), its outputs, and the arguments it writes
    without returning them (fused AdamW, ``_foreach_*_``); a slot copy reads and writes its
    inputs' size, not its buffer's."""
    name = func.overloadpacket.__name__
    if name in SLOT_COPIES:
        return 2 * sum(_nbytes(t) for t in tree_leaves(args[0]) if isinstance(t, Tensor))
    if name in FILLS:
        return sum(_nbytes(t) for t in outputs)
    written = _written(func, args)
    unread = {id(t) for t in written} if name in OVERWRITES else set()
    returned = {id(t) for t in outputs}
    reads = [t for t in tensors if id(t) not in unread]
    writes = outputs + [t for t in written if id(t) not in returned]
    return sum(_nbytes(t) for t in reads + writes)


def _written(func, args: tuple) -> list[Tensor]:
    schema = func._schema
    out = []
    for i, a in enumerate(schema.arguments):
        if i < len(args) and a.alias_info is not None and a.alias_info.is_write:
            out += [t for t in tree_leaves(args[i]) if isinstance(t, Tensor)]
    return out


def _attention(name: str, args: tuple, kwargs: dict) -> dict[str, int]:
    """Query length and the causal flag of a flash call (a causal call is always square here)."""
    first = 1 if name.endswith("_backward") else 0  # backward: (grad_out, q, k, v, ...)
    q = args[first]
    at = _CAUSAL_ARG.get(name, -1)
    causal = bool(kwargs.get("is_causal", args[at] if 0 <= at < len(args) else False))
    return {"size": int(q.shape[-2]), "flags": CAUSAL if causal else 0}


def _signature(tensors: list[Tensor], outputs: list[Tensor]) -> str:
    def one(t: Tensor) -> str:
        dtype = str(t.dtype).removeprefix("torch.")
        return f"{dtype}[{','.join(map(str, t.shape))}]"

    return f"{', '.join(map(one, tensors))} -> {', '.join(map(one, outputs))}"


@contextmanager
def mark_layers(model: nn.Module, recorder: StepRecorder) -> Iterator[None]:
    """MARK rows around each decoder layer's forward (recomputed forwards included)."""
    handles = []
    for i, layer in enumerate(getattr(model, "layers", ())):
        handles.append(layer.register_forward_pre_hook(_marker(recorder, f"layer {i}", False)))
        handles.append(layer.register_forward_hook(_marker(recorder, f"layer {i}", True)))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _marker(recorder: StepRecorder, label: str, end: bool) -> Callable[..., None]:
    def hook(*_: object) -> None:
        recorder.mark(label, end)

    return hook
