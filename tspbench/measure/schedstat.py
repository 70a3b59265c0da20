"""Where a rank's wall time goes on a Linux host: on a core, waiting for one, or asleep.

The kernel keeps, per thread, the nanoseconds it ran and the nanoseconds it waited in a run queue
(``/proc/thread-self/schedstat``, present where the kernel has CONFIG_SCHED_INFO). The rest of
the thread's wall time it slept: blocked on a collective, or on a peer that has not issued it.
``getrusage`` adds what the process's other threads ran: gloo's, which copy every byte a
collective moves over loopback TCP.

    with Spent() as spent:
        run.step()
    spent.seconds   # {"wall_s", "on_cpu_s", "runqueue_s", "blocked_s", "comm_threads_cpu_s"}

Where the file is absent (not Linux) ``seconds`` is None: nothing is guessed.
"""

from __future__ import annotations

import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

SCHEDSTAT = Path("/proc/thread-self/schedstat")


@dataclass(frozen=True)
class Sample:
    """Clocks of the calling thread and its process, in seconds."""

    wall: float
    on_cpu: float  # this thread, on a core
    runqueue: float  # this thread, runnable but waiting for a core
    process_cpu: float  # every thread of the process, user and system


def sample() -> Sample | None:
    """The calling thread's clocks now; None where the kernel does not keep them."""
    try:
        ran_ns, waited_ns, _ = SCHEDSTAT.read_text().split()
    except (OSError, ValueError):
        return None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    process = usage.ru_utime + usage.ru_stime
    return Sample(time.perf_counter(), int(ran_ns) * 1e-9, int(waited_ns) * 1e-9, process)


def between(before: Sample, after: Sample) -> dict[str, float]:
    """Seconds from ``before`` to ``after``: wall, on a core, waiting for one, asleep (the rest),
    and what the process's other threads ran meanwhile."""
    wall = after.wall - before.wall
    on_cpu = after.on_cpu - before.on_cpu
    runqueue = after.runqueue - before.runqueue
    return {
        "wall_s": wall,
        "on_cpu_s": on_cpu,
        "runqueue_s": runqueue,
        "blocked_s": max(wall - on_cpu - runqueue, 0.0),
        "comm_threads_cpu_s": max(after.process_cpu - before.process_cpu - on_cpu, 0.0),
    }


def median(samples: list[dict[str, float] | None]) -> dict[str, float] | None:
    """Each clock's median over steps; None if any step has no clocks (or there are none)."""
    if not samples or None in samples:
        return None
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}  # type: ignore[index]


def mean_over_ranks(per_rank: list[dict[str, float] | None]) -> dict[str, float] | None:
    """Each clock's mean over ranks, with busy (on a core or waiting for one) added; None if any
    rank has no clocks."""
    if not per_rank or None in per_rank:
        return None
    mean = {k: sum(r[k] for r in per_rank) / len(per_rank) for k in per_rank[0]}  # type: ignore[index]
    return {**mean, "busy_s": mean["on_cpu_s"] + mean["runqueue_s"]}


class Spent:
    """A context manager: ``seconds`` is ``between`` its entry and exit (None off Linux)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] | None = None
        self._before: Sample | None = None

    def __enter__(self) -> Spent:
        self._before = sample()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        after = sample()
        if self._before is not None and after is not None:
            self.seconds = between(self._before, after)
