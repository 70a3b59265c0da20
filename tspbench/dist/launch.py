"""Run a function on N ranks of this machine and hand back each rank's return value.

Ranks are forked from a forkserver that has torch and tspbench preloaded: a start costs ~0.1 s
after the first, and no rank inherits the caller's threads (forking a process that has run
multithreaded torch ops or holds a TCPStore server thread can deadlock the child). CPU: gloo,
one thread per rank. CUDA (``device="cuda"``, N GPUs visible): one GPU and NCCL per rank. The
rendezvous is a TCPStore hosted by rank 0 on 127.0.0.1 at a free port. (A TCPStore held by the
caller stalled about one start in seven by exactly 5 s here; a FileStore made creating process
groups ~20x slower.)

If any rank raises (or dies), the caller gets a RankError naming the rank that failed first,
its exception type, message and traceback within a second, and every other rank is killed
(they may be stuck in a collective waiting for the dead one). A world that outlives ``timeout``
is killed the same way and raises LaunchTimeout. No process is left behind either way, not even
when the caller itself is killed (SIGKILL): each rank holds a lifeline pipe to the caller and
kills itself when it closes. (A parent-death signal would not do: a rank's parent is the
forkserver, which outlives a killed caller for as long as any rank keeps its pipe open.)
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
import torch.distributed as dist

from tspbench.core.errors import WorkloadError


class RankError(RuntimeError):
    """A rank raised. ``exc_type`` is the name of its exception type."""

    def __init__(self, rank: int, exc_type: str, message: str, tb: str) -> None:
        self.rank, self.exc_type, self.message, self.traceback = rank, exc_type, message, tb
        super().__init__(f"rank {rank} raised {exc_type}: {message}\n{tb}")

    @property
    def is_oom(self) -> bool:
        return (
            self.exc_type in ("OutOfMemoryError", "torch.OutOfMemoryError")
            or "out of memory" in self.message.lower()
        )

    def __reduce__(self):  # picklable for sweeps that run launch() inside a job
        return (RankError, (self.rank, self.exc_type, self.message, self.traceback))


class LaunchTimeout(TimeoutError):
    """The world did not finish in time; ``pending`` lists the ranks that had not returned."""

    def __init__(self, timeout: float, pending: list[int]) -> None:
        self.pending = pending
        super().__init__(f"ranks {pending} did not finish within {timeout:.0f} s; all ranks were killed")


def local_device() -> torch.device:
    """The device of this rank: its GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# torch._dynamo is imported lazily by the first optimizer step (~1 s): pay it once, here.
_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "tspbench.measure.runner", "tspbench.strategies"]


def _context() -> mp.context.BaseContext:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    _start_forkserver()
    return ctx


def _start_forkserver() -> None:
    """Start the forkserver deaf to Ctrl-C: the terminal sends SIGINT to every process of the
    command, and one still importing torch would print a traceback under the caller's one line.
    The caller handles the interrupt and kills the ranks (they inherit the same deafness)."""
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()  # signal handlers can be set from the main thread only
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    device: str,
    conn: Connection,
    lifeline: Connection,
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    timeout_s: float,
) -> None:
    torch.set_num_threads(1)  # first: a forked child of a multithreaded parent hangs otherwise
    _die_with_caller(lifeline)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        backend = "nccl" if device == "cuda" else "gloo"
        if device == "cuda":
            torch.cuda.set_device(rank)
        store = dist.TCPStore(
            "127.0.0.1", port, world_size, is_master=rank == 0, timeout=timedelta(seconds=timeout_s)
        )
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
        )
        _barrier(device, rank)  # every rank connected before any can finish and exit
        result = fn(*args, **kwargs)
        _barrier(device, rank)  # no rank exits while a peer's last transfer to it is in flight
        payload = ("ok", result)
    except BaseException as exc:
        payload = ("error", (type(exc).__name__, str(exc), traceback.format_exc(), time.time()))
    try:
        conn.send_bytes(pickle.dumps(payload))
    except Exception as exc:  # unpicklable result
        error = (type(exc).__name__, str(exc), traceback.format_exc(), time.time())
        conn.send_bytes(pickle.dumps(("error", error)))
    conn.close()
    os._exit(0)  # skip gloo/NCCL teardown, which can block when peers are gone


def _die_with_caller(lifeline: Connection) -> None:
    """SIGKILL this rank as soon as the caller's end of ``lifeline`` closes: the caller never
    writes to it, so the read returns only when the caller has finished with the world or died."""

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv_bytes()
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="tspbench-lifeline", daemon=True).start()


def _barrier(device: str, rank: int) -> None:
    dist.barrier(device_ids=[rank]) if device == "cuda" else dist.barrier()


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    device: str = "cpu",
    timeout: float = 300.0,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return the results in rank order."""
    if device == "cuda" and torch.cuda.device_count() < world_size:
        raise WorkloadError(
            f"device 'cuda': {world_size} ranks need {world_size} GPUs, {torch.cuda.device_count()} "
            "visible here; use device cpu, or a machine (or Slurm) with the GPUs"
        )
    for attempt in range(3):
        try:
            return _launch_once(fn, world_size, args, kwargs, device, timeout, free_port())
        except RankError as exc:  # another process took the port between our probe and rank 0's bind
            if attempt == 2 or "address already in use" not in exc.message.lower():
                raise
    raise AssertionError("unreachable")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_once(
    fn: Callable[..., Any], world_size: int, args: tuple, kwargs: dict, device: str, timeout: float, port: int
) -> list[Any]:
    ctx = _context()
    procs, conns, lifelines = [], [], []
    try:  # an interrupt while ranks start (Ctrl-C, SIGTERM) kills those already started too
        for rank in range(world_size):
            recv, send = ctx.Pipe(duplex=False)
            held, lifeline = ctx.Pipe(duplex=False)  # the rank reads, this process holds the other end
            conns.append(recv)
            lifelines.append(lifeline)
            p = ctx.Process(
                target=_rank_main,
                daemon=True,
                args=(rank, world_size, port, device, send, held, fn, args, kwargs, timeout),
            )
            procs.append(p)
            p.start()
            send.close()
            held.close()
        return _collect(procs, conns, timeout)
    finally:
        started = [p for p in procs if p.pid is not None]  # an interrupted start may leave none
        for p in started:
            if p.is_alive():
                p.kill()
        for p in started:
            p.join(timeout=5)
        for c in conns + lifelines:
            c.close()


def _receive(rank: int, proc: Any, conn: Connection) -> tuple[str, Any]:
    """A rank's message; a rank that died without one (segfault, os._exit, OOM killer) as an error."""
    try:
        return pickle.loads(conn.recv_bytes())
    except EOFError:
        proc.join(timeout=1)
        reason = f"exited with code {proc.exitcode} before returning"
        return "error", ("ProcessDied", reason, "", time.time())


def _collect(procs: list, conns: list[Connection], timeout: float) -> list[Any]:
    results: list[Any] = [None] * len(procs)
    pending = set(range(len(procs)))
    deadline = time.monotonic() + timeout
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LaunchTimeout(timeout, sorted(pending))
        waitables = [conns[r] for r in pending] + [procs[r].sentinel for r in pending]
        ready = wait(waitables, timeout=min(remaining, 1.0))
        errors = {}
        for rank in sorted(pending):
            if conns[rank] in ready or procs[rank].sentinel in ready:
                status, payload = _receive(rank, procs[rank], conns[rank])
                if status == "error":
                    errors[rank] = payload
                else:
                    results[rank] = payload
                pending.discard(rank)
        if errors:
            raise _root_cause(errors, procs, conns, pending)
    return results


def _root_cause(errors: dict, procs: list, conns: list[Connection], pending: set[int]) -> RankError:
    """The earliest error: when one rank fails, its peers' collectives fail right after it."""
    grace = time.monotonic() + 0.5
    while pending and time.monotonic() < grace:
        for rank in sorted(pending):
            if conns[rank].poll(0.01):
                status, payload = _receive(rank, procs[rank], conns[rank])
                pending.discard(rank)
                if status == "error":
                    errors[rank] = payload
    rank = min(errors, key=lambda r: errors[r][3])
    exc_type, message, tb, _ = errors[rank]
    return RankError(rank, exc_type, message, tb)
