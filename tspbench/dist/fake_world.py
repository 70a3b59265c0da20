"""Run ranks of a big world one after another, each on a fake process group of the full size.

A ``FakeWorld`` keeps ``workers`` Python processes (new interpreters, so ``env`` such as an
LD_PRELOAD applies before torch is imported there, and nothing of the caller's ``__main__``
runs again) alive between calls, so a sweep pays their start-up (importing torch) once;
``run(fn, ranks, world_size, ...)`` deals ``ranks`` out among them (``run_fake_ranks`` is the
one-call form). For each of its ranks a worker creates the process group

    dist.init_process_group("fake", store=FakeStore(), rank=r, world_size=world_size)

calls ``fn(*args)``, and destroys the group. Collectives on a fake group return at once and
move nothing (new_group, broadcast, all_reduce, all_gather/reduce_scatter into tensors,
reduce, all_to_all_single, isend/irecv), so no rank waits for another and any world size
works: rank 7 of 1,024 runs alone. The results come back in the order of ``ranks``.

Failures are results: the first rank that raises (or a worker that dies) becomes a RankError
naming the rank, its exception and traceback; a rank that takes longer than ``timeout``
(counted from the previous rank's result) raises LaunchTimeout. A worker says it is ready once
it has imported torch; one that has not within ``start_timeout`` (a hung import, an LD_PRELOAD
that blocks) raises WorkerStartTimeout with what it printed, and one that exits first a
RankError naming its exit code and its output. A worker left mid-job is
killed and replaced, and ``close`` (or leaving the ``with`` block) ends every worker, so no
process is left behind. A 7B rank takes about a minute: ``progress`` (a
tspbench.core.progress.Progress, silent by default) hears each rank as it finishes.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import IO, Any

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore  # also registers the "fake" backend

from tspbench.core.progress import Progress
from tspbench.dist.launch import LaunchTimeout, RankError

WORKER = "from tspbench.dist.fake_world import worker_main; worker_main()"
START_TIMEOUT_S = 300.0  # importing torch: ~13 s cold on a loaded 2-core host, far less warm


def worker_main() -> None:
    """A worker's body: the caller's sys.path and two pipe fds on stdin; then jobs on the first
    pipe until it closes, one message per rank on the second."""
    torch.set_num_threads(1)  # a fake op is bookkeeping: one thread, as many workers as cores
    path, jobs_fd, out_fd = pickle.load(sys.stdin.buffer)
    sys.path[:0] = [p for p in path if p not in sys.path]  # as multiprocessing's spawn does
    jobs, out = Connection(jobs_fd, writable=False), Connection(out_fd, readable=False)
    out.send_bytes(pickle.dumps(("ready", None, None)))  # torch imported: the parent stops its start clock
    while True:
        try:
            ranks, world_size, fn, args, kwargs = pickle.loads(jobs.recv_bytes())
        except EOFError:
            os._exit(0)
        for rank in ranks:
            payload = _run_rank(rank, world_size, fn, args, kwargs)
            try:
                out.send_bytes(pickle.dumps(payload))
            except Exception as exc:  # an unpicklable result
                out.send_bytes(pickle.dumps(("error", rank, _error(exc))))
            if payload[0] == "error":
                break


def _run_rank(rank: int, world_size: int, fn: Callable[..., Any], args: tuple, kwargs: dict) -> tuple:
    try:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
        try:
            return ("ok", rank, fn(*args, **kwargs))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:
        return ("error", rank, _error(exc))


def _error(exc: BaseException) -> tuple[str, str, str]:
    return type(exc).__name__, str(exc), traceback.format_exc()


def split(ranks: Sequence[int], workers: int) -> list[list[int]]:
    """``ranks`` dealt round-robin into at most ``workers`` non-empty shares."""
    workers = max(1, min(workers, len(ranks)))
    return [list(ranks[i::workers]) for i in range(workers)]


class Worker:
    """One worker process: its job pipe, its result pipe, its captured stderr."""

    def __init__(self, env: dict[str, str]) -> None:
        job_read, job_write = os.pipe()
        out_read, out_write = os.pipe()
        self.log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the worker
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=self.log, stderr=self.log,
            env={**os.environ, **env}, pass_fds=(job_read, out_write),
        )  # fmt: skip
        os.close(job_read)
        os.close(out_write)
        self.jobs = Connection(job_write, readable=False)
        self.results = Connection(out_read, writable=False)
        self.proc.stdin.write(pickle.dumps((sys.path, job_read, out_write)))
        self.proc.stdin.close()
        self.todo: list[int] = []
        self.started = False

    def submit(self, ranks: list[int], job: tuple) -> None:
        self.todo = list(ranks)
        self.jobs.send_bytes(pickle.dumps((ranks, *job)))

    def output(self) -> str:
        """The end of what the worker printed (its stdout and stderr)."""
        self.log.seek(0)
        return self.log.read()[-3000:].decode(errors="replace")

    def died(self) -> RankError:
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # closed its pipe but lives on: as dead
            self.proc.kill()
            self.proc.wait(timeout=5)
        when = "" if self.started else " before it started"
        tail = self.output()
        last = f": {tail.strip().splitlines()[-1]}" if tail.strip() else ""
        message = f"exited with code {self.proc.returncode}{when}{last}"
        return RankError(self.todo[0], "ProcessDied", message, tail)

    def close(self) -> None:
        self.jobs.close()  # the worker exits at the end of its job pipe
        try:
            self.proc.wait(timeout=0 if self.todo else 5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.results.close()
        self.log.close()


class FakeWorld:
    """``workers`` worker processes kept alive between ``run`` calls. A worker that failed to
    finish a job (timed out, died) is replaced by a fresh one for the next call."""

    def __init__(
        self,
        workers: int = 1,
        env: dict[str, str] | None = None,
        progress: Progress | None = None,
        start_timeout: float = START_TIMEOUT_S,
    ) -> None:
        self.size, self.env, self.start_timeout = max(1, workers), dict(env or {}), start_timeout
        self.pool: list[Worker] = []
        self.progress = progress or Progress()

    def __enter__(self) -> FakeWorld:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for worker in self.pool:
            worker.close()
        self.pool = []

    def run(
        self, fn: Callable[..., Any], ranks: Sequence[int], world_size: int, *args: Any,
        timeout: float = 600.0, **kwargs: Any,
    ) -> list[Any]:  # fmt: skip
        """``fn(*args, **kwargs)`` on each of ``ranks`` of a fake world of ``world_size``; the
        results in the order of ``ranks``. ``timeout`` bounds each rank."""
        bad = [r for r in ranks if not 0 <= r < world_size]
        if bad or not ranks:
            raise ValueError(f"ranks {bad or list(ranks)} are not ranks of a world of {world_size}")
        shares = split(ranks, self.size)
        while len(self.pool) < len(shares):
            self.pool.append(Worker(self.env))
        busy = self.pool[: len(shares)]
        for worker, share in zip(busy, shares, strict=True):
            worker.todo = list(share)
        try:
            _await_start(busy, self.start_timeout)
            for worker, share in zip(busy, shares, strict=True):
                worker.submit(share, (world_size, fn, args, kwargs))
            self.progress.start(len(ranks), f"fake world of {world_size:,} ranks")
            self.progress.update(len(busy), _running(busy))
            results = _collect(busy, timeout, self.progress)
        finally:  # a worker with ranks left is mid-job (or dead): replace it
            for worker in [w for w in busy if w.todo and w in self.pool]:
                worker.close()
                self.pool.remove(worker)
        return [results[r] for r in ranks]


def run_fake_ranks(
    fn: Callable[..., Any],
    ranks: Sequence[int],
    world_size: int,
    *args: Any,
    workers: int = 1,
    env: dict[str, str] | None = None,
    timeout: float = 600.0,
    **kwargs: Any,
) -> list[Any]:
    """One ``FakeWorld.run`` in a world of its own (its workers gone when it returns)."""
    with FakeWorld(workers, env) as world:
        return world.run(fn, ranks, world_size, *args, timeout=timeout, **kwargs)


def _running(busy: list[Worker]) -> str:
    """'ranks 0, 1 running': the rank each worker is executing now."""
    now = [w.todo[0] for w in busy if w.todo]
    return f"rank{'s' if len(now) > 1 else ''} {', '.join(map(str, now))} running" if now else ""


class WorkerStartTimeout(LaunchTimeout):
    """A worker process said nothing within its start-up time: its ranks never ran."""

    def __init__(self, timeout: float, pending: list[int], output: str) -> None:
        self.pending, self.timeout, self.output = pending, timeout, output
        last = output.strip().splitlines()[-1] if output.strip() else "nothing"
        TimeoutError.__init__(
            self,
            f"the fake world's worker process did not start within {timeout:.0f} s (it imports torch "
            f"first), so ranks {pending} never ran; it was killed; it printed: {last[:300]}",
        )

    def __reduce__(self):
        return (WorkerStartTimeout, (self.timeout, self.pending, self.output))


def _await_start(workers: list[Worker], timeout: float) -> None:
    """Each new worker's first message, its ready, within ``timeout``: a worker that hangs in its
    start-up raises WorkerStartTimeout, one that exits a RankError (its code and output)."""
    waiting = [w for w in workers if not w.started]
    deadline = time.monotonic() + timeout
    while waiting:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WorkerStartTimeout(timeout, sorted(r for w in waiting for r in w.todo), waiting[0].output())
        ready = wait([w.results for w in waiting], timeout=min(remaining, 1.0))
        for worker in [w for w in waiting if w.results in ready]:
            try:
                worker.results.recv_bytes()
            except EOFError:
                raise worker.died() from None
            worker.started = True
            waiting.remove(worker)


def _collect(busy: list[Worker], timeout: float, progress: Progress) -> dict[int, Any]:
    results: dict[int, Any] = {}
    waiting = list(busy)
    deadline = time.monotonic() + timeout
    while waiting:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LaunchTimeout(timeout, sorted(r for w in waiting for r in w.todo))
        ready = wait([w.results for w in waiting], timeout=min(remaining, 1.0))
        for worker in [w for w in waiting if w.results in ready]:
            try:
                status, rank, value = pickle.loads(worker.results.recv_bytes())
            except EOFError:  # died without a word: segfault, abort, the OOM killer
                raise worker.died() from None
            if status == "error":
                raise RankError(rank, *value)
            results[rank] = value
            deadline = time.monotonic() + timeout  # the limit is per rank: ranks run one after another
            worker.todo.remove(rank)
            if not worker.todo:
                waiting.remove(worker)
            progress.finished("completed", f"rank {rank}")
            progress.update(len(waiting), _running(waiting))
    return results
