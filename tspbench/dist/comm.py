"""Every collective a strategy uses, in one place, each call counted.

A call on a group of one rank is a no-op and is not counted. Otherwise it adds one CommRecord
to the active CommLog (see ``counting``): the op, the phase it ran in (see ``phase``), the group
(its mesh axes and channel, e.g. ``tsp#1``), its size n and the message size in bytes as
nccl-tests defines it. Bus bytes follow nccl-tests:

    op               message (bytes)              bus bytes = message x
    all_reduce       the buffer                   2 (n-1) / n
    all_gather       the gathered output          (n-1) / n
    reduce_scatter   the full input               (n-1) / n
    all_to_all       the buffer                   (n-1) / n
    broadcast        the buffer                   1
    reduce           the buffer                   1
    send_recv        the buffer sent (ring shift) 1

Bus bytes are what one rank's busiest link carries, so they compare across ops and group sizes.

Primitives take and return plain tensors (``async_op=True`` returns a Pending whose ``wait()``
gives the result). Autograd pairs below them (after Megatron-LM's mappings) carry gradients
through a collective; each docstring names its forward/backward pair and shapes.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from tspbench.core.bus import BUS_FACTOR
from tspbench.core.names import PHASES


@dataclass(frozen=True)
class CommRecord:
    """One collective (or ``count`` identical ones) as seen by one rank."""

    op: str
    phase: str
    group_size: int
    msg_bytes: int
    count: int = 1
    group: str = ""  # the group's label: its mesh axes and channel ("tsp", "dp+sp", "tsp#1")

    @property
    def bus_bytes(self) -> float:
        return BUS_FACTOR[self.op](self.group_size) * self.msg_bytes * self.count

    @property
    def key(self) -> tuple[str, str, str, int]:
        """What two counts must agree on: op, phase, the group (axes and channel) and its size."""
        return (self.op, self.phase, self.group, self.group_size)


@dataclass
class CommLog:
    """Records of one rank, thread-safe (CUDA backward runs on autograd's device threads)."""

    records: list[CommRecord] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, record: CommRecord) -> None:
        with self._lock:
            self.records.append(record)

    @property
    def bus_bytes(self) -> float:
        return sum(r.bus_bytes for r in self.records)


def summarize(records: Sequence[CommRecord]) -> dict[tuple[str, str, str, int], tuple[int, int]]:
    """(op, phase, group, group size) -> (calls, message bytes). A collective on the wrong group of
    the same size, or on the wrong channel, changes the key."""
    out: dict[tuple[str, str, str, int], list[int]] = defaultdict(lambda: [0, 0])
    for r in records:
        out[r.key][0] += r.count
        out[r.key][1] += r.msg_bytes * r.count
    return {k: (v[0], v[1]) for k, v in sorted(out.items())}


_log: CommLog | None = None
_phase = "forward"


@contextmanager
def counting() -> Iterator[CommLog]:
    """Count every collective issued inside the block (by this process) into a fresh CommLog."""
    global _log
    previous, _log = _log, CommLog()
    try:
        yield _log
    finally:
        _log = previous


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Attribute collectives issued inside the block to ``name`` (forward, backward, optimizer)."""
    global _phase
    if name not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {name!r}")
    previous, _phase = _phase, name
    try:
        yield
    finally:
        _phase = previous


def current_phase() -> str:
    return _phase


def _count(op: str, group: Group, msg_bytes: int) -> None:
    if _log is not None:
        _log.add(CommRecord(op, _phase, group.size, msg_bytes, group=group.name))


_simulating = False


@contextmanager
def simulate() -> Iterator[None]:
    """Collectives inside the block move no data: each returns a local result of the right shape.

    Still counted. With it, a step's compute alone can be timed (the compute-only bound).
    """
    global _simulating
    previous, _simulating = _simulating, True
    try:
        yield
    finally:
        _simulating = previous


@dataclass(frozen=True)
class Group:
    """Ranks along some mesh axes. ``rank`` is this process's index in ``ranks``; pg is None for n = 1."""

    name: str
    ranks: tuple[int, ...]
    rank: int
    pg: dist.ProcessGroup | None = None

    @property
    def size(self) -> int:
        return len(self.ranks)

    def global_rank(self, index: int) -> int:
        return self.ranks[index]

    @property
    def next(self) -> int:
        return self.ranks[(self.rank + 1) % self.size]

    @property
    def prev(self) -> int:
        return self.ranks[(self.rank - 1) % self.size]


class Pending:
    """An issued async collective; ``wait()`` blocks until done and returns its result."""

    def __init__(
        self,
        works: Sequence[dist.Work],
        result: Callable[[], object],
        unstage: Callable[[], None] | None = None,
        trace_row: int = -1,
    ) -> None:
        self._works, self._result, self._unstage, self._trace_row = works, result, unstage, trace_row

    def wait(self):
        while self._works:  # no loop variable may keep a finished work (and its tensors) alive
            self._works[0].wait()
            self._works = self._works[1:]
        if self._trace_row >= 0 and _tracer is not None:
            _tracer.wait(self._trace_row)
            self._trace_row = -1
        return self._finish()

    def future(self) -> torch.futures.Future:
        """A Future of the result, completed when the transfer is (what DDP's comm hooks return)."""
        if not self._works:
            done: torch.futures.Future = torch.futures.Future()
            done.set_result(self._result())
            return done
        futures = [w.get_future() for w in self._works]
        return torch.futures.collect_all(futures).then(lambda _: self._finish())

    def _finish(self):
        """The result, once the transfer is done (read back from staging copies, if any)."""
        if self._unstage is not None:
            self._unstage()
            self._unstage = None
        return self._result()


_staging = False
_GLOO_GROUPS: dict[str, bool] = {}


@contextmanager
def staging() -> Iterator[None]:
    """Inside the block, collectives on gloo run on staging copies of their tensors.

    gloo releases a finished work - and with it every tensor it was given - on its worker
    thread, a moment after the caller's wait returns: a buffer the program has dropped by then
    dies at a random point of the step, and the same step's peak memory differed from run to
    run. On a copy the program never sees, the program's own tensors die where the program
    drops them. The copies are made and read back outside the dispatcher (no mode or counter
    sees them, as none sees gloo's own buffers); the results are copied into the program's
    tensors without bumping their autograd version, as gloo's own in-place writes do not.
    The memory tracker turns this on (tspbench.measure.tracker); NCCL and the fake world are
    left as they are.
    """
    global _staging
    previous, _staging = _staging, True
    try:
        yield
    finally:
        _staging = previous


def _on_gloo(group: Group) -> bool:
    if group.name not in _GLOO_GROUPS:
        _GLOO_GROUPS[group.name] = dist.get_backend(group.pg) == "gloo"
    return _GLOO_GROUPS[group.name]


def _stage(operands: Sequence[Tensor], written: Sequence[int]) -> tuple[list[Tensor], Callable[[], None]]:
    """Staging copies of ``operands``, and what copies the ``written`` ones back."""
    with torch.no_grad(), torch._C._DisableTorchDispatch():
        copies = [t.detach().clone() for t in operands]

    def unstage() -> None:
        with torch.no_grad(), torch._C._DisableTorchDispatch():
            for i in written:
                version = operands[i]._version
                operands[i].copy_(copies[i])
                torch._C._autograd._unsafe_set_version_counter((operands[i],), (version,))
        copies.clear()

    return copies, unstage


def _issue(
    op: str,
    group: Group,
    nbytes: int,
    start: Callable[..., dist.Work | list[dist.Work]],
    operands: Sequence[Tensor],
    result: Callable[[], object],
    async_op: bool,
    simulated: Callable[[], object] | None = None,
    written: Sequence[int] = (0,),
):
    """Count one collective, start it (``simulated`` instead, inside ``simulate()``), and return
    its result, or a Pending for it with ``async_op``. The one path every primitive takes.

    ``operands`` are the tensors the c10d call takes, in its order; ``written`` says which of them
    it writes (see ``staging``)."""
    _count(op, group, nbytes)
    row = _trace_issue(op, group, nbytes, async_op, [operands[i] for i in written])
    if _simulating:
        if simulated is not None:
            simulated()
        pending = Pending((), result, trace_row=row)
    else:
        unstage = None
        if _staging and _on_gloo(group):
            operands, unstage = _stage(operands, written)
        _issuing.active = True
        try:
            started = start(*operands)
        finally:
            _issuing.active = False
        # the Pending holds the only handles on the works: none may outlive its wait
        pending = Pending(started if isinstance(started, list) else [started], result, unstage, row)
        del started, operands
    return pending if async_op else pending.wait()


class Tracer(Protocol):
    """What records a step's collectives (tspbench.measure.trace.StepRecorder)."""

    def issue(self, op: str, label: str, ranks: tuple[int, ...], nbytes: int, async_op: bool) -> int: ...
    def pending(self, row: int, buffers: list[Tensor]) -> None: ...
    def wait(self, row: int) -> None: ...


_tracer: Tracer | None = None


def set_tracer(tracer: Tracer | None) -> None:
    """Report every collective issued (and every wait on one) to ``tracer`` (None: stop)."""
    global _tracer
    _tracer = tracer


def _trace_issue(op: str, group: Group, nbytes: int, async_op: bool, written: list[Tensor]) -> int:
    """The tracer's row for this collective (-1 without a tracer); an async one's written buffers
    are pending until its wait."""
    if _tracer is None:
        return -1
    row = _tracer.issue(op, group.name, group.ranks, nbytes, async_op)
    if async_op:
        _tracer.pending(row, written)
    return row


_issuing = threading.local()  # set while a primitive here starts its c10d op (see issued_here)


def issued_here() -> bool:
    """True while one of this module's primitives is starting its c10d op: a dispatch-level
    counter (tspbench.dist.c10d_count) leaves those to the count above, so nothing counts twice."""
    return getattr(_issuing, "active", False)


def _solo(result: Callable[[], object], async_op: bool):
    """A collective on a group of one: nothing moves, nothing is counted."""
    return Pending((), result) if async_op else result()


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


# ----------------------------------------------------------------------------- primitives


def all_reduce(x: Tensor, group: Group, op: str = "sum", async_op: bool = False):
    """In place on x [any]: the elementwise reduction over the group."""
    if group.size == 1:
        return _solo(lambda: x, async_op)
    start = partial(dist.all_reduce, op=_REDUCE_OPS[op], group=group.pg, async_op=True)
    return _issue("all_reduce", group, _nbytes(x), start, (x,), lambda: x, async_op)


def all_gather(x: Tensor, group: Group, dim: int | None = None, async_op: bool = False):
    """x [*] -> [n, *] stacked in group order (dim=None), or concatenated along ``dim``."""
    if group.size == 1:
        return _solo(lambda: x.unsqueeze(0) if dim is None else x, async_op)
    x = x.contiguous()
    stacked = x.new_empty((group.size, *x.shape))
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return _issue(
        "all_gather",
        group,
        _nbytes(stacked),
        partial(gather, group=group.pg, async_op=True),
        (stacked.view(-1), x.view(-1)),
        lambda: stacked if dim is None else torch.cat(stacked.unbind(0), dim=dim),
        async_op,
        simulated=lambda: stacked.copy_(x.unsqueeze(0).expand_as(stacked)),
    )


def reduce_scatter(x: Tensor, group: Group, dim: int | None = None, async_op: bool = False):
    """Sum over the group, each rank keeping its slice.

    x [n, *] -> [*] (dim=None), or x [.., n s, ..] -> [.., s, ..] along ``dim``.
    """
    n = group.size
    if n == 1:
        return _solo(lambda: x[0] if dim is None else x, async_op)
    stacked = (x if dim is None else torch.stack(x.chunk(n, dim=dim), dim=0)).contiguous()
    out = stacked.new_empty(stacked.shape[1:])
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return _issue(
        "reduce_scatter",
        group,
        _nbytes(stacked),
        partial(scatter, group=group.pg, async_op=True),
        (out.view(-1), stacked.view(-1)),
        lambda: out,
        async_op,
        simulated=lambda: out.copy_(stacked[group.rank]),
    )


def broadcast(x: Tensor, src: int, group: Group, async_op: bool = False):
    """In place on x [any]: every rank gets the value held by group member ``src``."""
    if group.size == 1:
        return _solo(lambda: x, async_op)
    start = partial(dist.broadcast, src=group.global_rank(src), group=group.pg, async_op=True)
    return _issue("broadcast", group, _nbytes(x), start, (x,), lambda: x, async_op)


def reduce(x: Tensor, dst: int, group: Group, async_op: bool = False):
    """Sum of x [any] over the group, in place on group member ``dst`` (others' x is undefined after)."""
    if group.size == 1:
        return _solo(lambda: x, async_op)
    start = partial(dist.reduce, dst=group.global_rank(dst), group=group.pg, async_op=True)
    return _issue("reduce", group, _nbytes(x), start, (x,), lambda: x, async_op)


def all_to_all(x: Tensor, group: Group, async_op: bool = False):
    """x [n, *] -> [n, *]: slice i goes to member i; slice j of the result came from member j."""
    if group.size == 1:
        return _solo(lambda: x, async_op)
    x = x.contiguous()
    out = torch.empty_like(x)
    start = partial(dist.all_to_all_single, group=group.pg, async_op=True)
    return _issue(
        "all_to_all", group, _nbytes(x), start, (out, x), lambda: out, async_op, lambda: out.copy_(x)
    )


def ring_shift(x: Tensor, group: Group, async_op: bool = False):
    """Send x [any] to the next member and receive the previous member's [same shape].

    A plain isend and irecv, not ``batch_isend_irecv``, which refuses fake tensors. Even members
    send first and odd ones receive first, so where both directions of one pair share a stream
    (two members, NCCL) each send meets a posted receive.
    """
    if group.size == 1:
        return _solo(lambda: x, async_op)
    x = x.contiguous()
    out = torch.empty_like(x)

    def start(sent: Tensor, received: Tensor) -> list[dist.Work]:
        send = partial(dist.isend, sent, group.next, group.pg)
        recv = partial(dist.irecv, received, group.prev, group.pg)
        first, second = (send, recv) if group.rank % 2 == 0 else (recv, send)
        return [first(), second()]

    return _issue(
        "send_recv", group, _nbytes(x), start, (x, out), lambda: out, async_op, lambda: out.copy_(x), (1,)
    )


def replay(records: Sequence[CommRecord], resolve: Callable[[str], Group]) -> None:
    """Issue the recorded collectives again, blocking, in order, on scratch buffers of their sizes.

    Every rank must replay the same records. The comm-only bound of a step: its data movement
    with no compute to hide behind.
    """
    for r in records:
        group = resolve(r.group)
        for _ in range(r.count):
            msg = r.msg_bytes
            if r.op == "all_gather":
                all_gather(torch.empty(msg // group.size, dtype=torch.uint8), group)
            elif r.op in ("reduce_scatter", "all_to_all"):
                buf = torch.empty(group.size, msg // group.size, dtype=torch.uint8)
                (reduce_scatter if r.op == "reduce_scatter" else all_to_all)(buf, group)
            elif r.op == "send_recv":
                ring_shift(torch.empty(msg, dtype=torch.uint8), group)
            elif r.op == "broadcast":
                broadcast(torch.empty(msg, dtype=torch.uint8), 0, group)
            elif r.op == "reduce":
                reduce(torch.empty(msg, dtype=torch.uint8), 0, group)
            else:
                all_reduce(torch.empty(msg, dtype=torch.uint8), group)


# ----------------------------------------------------------------------------- decode (no autograd)


def gather_queries(q: Tensor, group: Group) -> Tensor:
    """Decode over a sequence-sharded cache: every member's new-token queries.

    q [b, n, 1, d] (this member's b slots) -> [P, b, n, 1, d] in group order. One all-gather,
    message P b n d x element size (the gathered output). Decode runs under no_grad: no backward.
    """
    return all_gather(q, group)


def exchange_partials(partials: Tensor, group: Group) -> Tensor:
    """Decode over a sequence-sharded cache: send each slot owner the partial attentions of its slots.

    partials [P, b, n, 1, d + 1] (slice i: this member's partial o and log-sum-exp for member
    i's slots, float32, float64 in float64 runs) -> [P, b, n, 1, d + 1] (slice j: member j's
    partials of this member's slots). One all-to-all of the buffer. No backward.
    """
    return all_to_all(partials, group)


def barrier(group: Group) -> None:
    """Not counted: a synchronisation point for timing, not data movement."""
    if group.size > 1:
        dist.barrier(group=group.pg)


# ----------------------------------------------------------------------------- autograd pairs


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: Group) -> Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, dy: Tensor):
        return all_reduce(dy.contiguous(), ctx.group), None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: Group) -> Tensor:
        return all_reduce(x.contiguous(), group)

    @staticmethod
    def backward(ctx, dy: Tensor):
        return dy, None


class _GatherFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: Group, dim: int | None) -> Tensor:
        ctx.group, ctx.dim = group, dim
        return all_gather(x, group, dim)

    @staticmethod
    def backward(ctx, dy: Tensor):
        return reduce_scatter(dy, ctx.group, ctx.dim), None, None


class _ReduceScatterToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: Group, dim: int | None) -> Tensor:
        ctx.group, ctx.dim = group, dim
        return reduce_scatter(x, group, dim)

    @staticmethod
    def backward(ctx, dy: Tensor):
        return all_gather(dy, ctx.group, ctx.dim), None, None


def copy_to_group(x: Tensor, group: Group) -> Tensor:
    """Forward identity, backward all-reduce. x [*] -> [*]. Megatron's ``f`` (column-parallel input)."""
    return x if group.size == 1 else _CopyToGroup.apply(x, group)


def reduce_from_group(x: Tensor, group: Group) -> Tensor:
    """Forward all-reduce, backward identity. x [*] -> [*]. Megatron's ``g`` (row-parallel output)."""
    return x if group.size == 1 else _ReduceFromGroup.apply(x, group)


def gather_from_group(x: Tensor, group: Group, dim: int | None = None) -> Tensor:
    """Forward all-gather, backward reduce-scatter.

    dim=None: x [*] -> [n, *] (stacked); else x [.., s, ..] -> [.., n s, ..] along ``dim``.
    Sequence-parallel K/V exchange and Megatron-SP column-parallel inputs.
    """
    return gather_identity(x, dim) if group.size == 1 else _GatherFromGroup.apply(x, group, dim)


def reduce_scatter_to_group(x: Tensor, group: Group, dim: int | None = None) -> Tensor:
    """Forward reduce-scatter, backward all-gather.

    dim=None: x [n, *] -> [*]; else x [.., n s, ..] -> [.., s, ..] along ``dim``.
    Megatron-SP row-parallel outputs.
    """
    if group.size == 1:
        return x[0] if dim is None else x
    return _ReduceScatterToGroup.apply(x, group, dim)


def gather_identity(x: Tensor, dim: int | None) -> Tensor:
    return x.unsqueeze(0) if dim is None else x
