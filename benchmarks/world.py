"""A persistent world of ranks that serves calls one at a time.

pytest-benchmark times a callable in the calling process; the work of a distributed benchmark
runs on several ranks. A World keeps N ranks alive (started by the local launcher) and runs
``fn(*args)`` on all of them per ``call``, returning when every rank has finished, so the
benchmark's round trip is the slowest rank's time plus a pipe hop (~0.1 ms). Functions must be
module-level (ranks receive them by reference); they may cache state per process.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from tspbench.dist.launch import launch


def _serve(commands: list, replies: Any) -> None:
    rank = dist.get_rank()
    while True:
        item = commands[rank].get()
        if item is None:
            return
        fn, args = item
        try:
            replies.put((rank, "ok", fn(*args)))
        except Exception as exc:  # handed to the caller
            replies.put((rank, "error", f"{type(exc).__name__}: {exc}"))


class World:
    """N ranks kept alive between calls. Use as a context manager."""

    def __init__(self, size: int, timeout: float = 3600.0) -> None:
        ctx = mp.get_context("forkserver")
        self.size = size
        self.commands = [ctx.Queue() for _ in range(size)]
        self.replies = ctx.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(timeout,), daemon=True)
        self._thread.start()

    def _run(self, timeout: float) -> None:
        try:
            launch(_serve, self.size, self.commands, self.replies, timeout=timeout)
        except BaseException as exc:  # re-raised by call()
            self._error = exc
            self.replies.put((-1, "error", str(exc)))

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float = 600.0) -> list[Any]:
        """Run fn(*args) on every rank; the results in rank order."""
        for queue in self.commands:
            queue.put((fn, args))
        results: list[Any] = [None] * self.size
        for _ in range(self.size):
            rank, status, value = self.replies.get(timeout=timeout)
            if status == "error":
                raise RuntimeError(f"rank {rank}: {value}")
            results[rank] = value
        return results

    def close(self) -> None:
        for queue in self.commands:
            queue.put(None)
        self._thread.join(timeout=30)

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
