"""What the collectives of a block were: one CommRecord per call, counted into the active CommLog.

Every primitive of tspbench.dist.comm (and every c10d op tspbench.dist.c10d_count sees) adds a
CommRecord here while ``counting()`` is active: the op, the phase it ran in (see ``phase``), the
group (its mesh axes and channel, e.g. ``tsp#1``), its size n and the message size in bytes as
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
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

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


def count(op: str, group_size: int, msg_bytes: int, group: str) -> None:
    """One collective on the group labelled ``group``, into the active CommLog (if any)."""
    if _log is not None:
        _log.add(CommRecord(op, _phase, group_size, msg_bytes, group=group))
