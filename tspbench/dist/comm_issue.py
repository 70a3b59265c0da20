"""How a collective is issued: the one path every primitive of tspbench.dist.comm takes.

``issue`` counts the call (tspbench.dist.comm_log), reports it to the tracer (``set_tracer``),
then starts its c10d op - on staging copies of its tensors inside ``staging()`` on gloo, or not
at all inside ``simulate()`` - and returns its result, or a Pending whose ``wait()`` gives it.
A call on a group of one (``solo``) moves nothing and is not counted. ``Group`` is the ranks a
collective runs over.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from tspbench.dist.comm_log import count


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


def issue(
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
    count(op, group.size, nbytes, group.name)
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
    """True while one of tspbench.dist.comm's primitives is starting its c10d op: a dispatch-level
    counter (tspbench.dist.c10d_count) leaves those to the count above, so nothing counts twice."""
    return getattr(_issuing, "active", False)


def solo(result: Callable[[], object], async_op: bool):
    """A collective on a group of one: nothing moves, nothing is counted."""
    return Pending((), result) if async_op else result()


def tensor_bytes(t: Tensor) -> int:
    return t.numel() * t.element_size()
