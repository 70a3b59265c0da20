"""The fake executor: each point's step executed in the fake world (tspbench.measure.fake).

Points run ``workers`` at a time (default: one per core), each lane with a worker process of
its own that lives for the whole sweep, so torch is imported once per lane, not per point.
Every point goes through the local executor's bookkeeping (tspbench.sweep.local.run_local):
queued, running, its record or its failure, and Ctrl-C puts the points in flight back to
pending (their workers are stopped at once).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import Any

from tspbench.analytic.profile_choice import choose_profile
from tspbench.core.progress import Progress
from tspbench.dist.fake_world import FakeWorld
from tspbench.measure.fake import fake_bench
from tspbench.measure.fake_cuda import preload_env
from tspbench.sweep.local import run_local
from tspbench.sweep.points import Point
from tspbench.sweep.store import Store


def measure_fake(point: Point, world: FakeWorld | None = None, store: Store | None = None) -> dict[str, Any]:
    """One point in the fake world: its first model-parallel group's ranks (or rank 0 alone,
    ``run.fake_ranks: first``) under fake tensors; with ``run.trace`` its traces kept beside it."""
    m, ranks = point.config["measure"], [0] if point.config.get("fake_ranks") == "first" else None
    hardware = choose_profile(
        None, device=point.workload.device, experiment=point.config.get("hardware"), measured=False
    )
    trace = point.trace_path(store.run_dir(point.run_id)) if store is not None else None
    record = fake_bench(
        point.layout, point.workload, hardware, m["capacity_bytes"], point.timeout, ranks, world, trace
    )
    return {**point.base_record(), **record}


class SharedProgress(Progress):
    """A Progress that several lanes report to: one lock, the points in flight counted over all
    lanes (each lane's run_local says only its own), ``close`` left to the sweep."""

    def __init__(self, inner: Progress) -> None:
        super().__init__()
        self.inner, self.lock = inner, threading.Lock()
        self.lanes: dict[int, str] = {}  # thread id -> the point it runs

    def update(self, running: int, current: str = "") -> None:
        with self.lock:
            if running:
                self.lanes[threading.get_ident()] = current
            else:
                self.lanes.pop(threading.get_ident(), None)
            self.inner.update(len(self.lanes), ", ".join(self.lanes.values()))

    def finished(self, status: str, line: str) -> None:
        with self.lock:
            self.inner.finished(status, line)

    def note(self, line: str) -> None:
        with self.lock:
            self.inner.note(line)

    def warn(self, line: str) -> None:
        with self.lock:
            self.inner.warn(line)

    def close(self) -> None:  # the sweep closes the inner one
        pass


def lanes(points: list[Point]) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(len(points), cores))


def run_fake(points: list[Point], store: Store, progress: Progress, workers: int | None = None) -> None:
    """Execute ``points`` in the fake world, ``workers`` at a time."""
    todo, lock, stop = deque(points), threading.Lock(), threading.Event()
    env = preload_env("cuda") if any(p.config["workload"]["device"] == "cuda" for p in points) else {}
    worlds = [FakeWorld(1, env) for _ in range(workers or lanes(points))]
    shared, errors = SharedProgress(progress), []

    def lane(world: FakeWorld) -> None:
        def measure(point: Point) -> dict[str, Any]:
            record = measure_fake(point, world, store)
            if stop.is_set():  # the sweep was interrupted under this point: it goes back to pending
                raise KeyboardInterrupt
            return record

        try:
            while not stop.is_set():
                with lock:
                    point = todo.popleft() if todo else None
                if point is None:
                    return
                run_local([point], store, measure, "fake", shared)
        except BaseException as exc:  # re-raised by the sweep's thread
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=lane, args=(w,), daemon=True) for w in worlds]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except KeyboardInterrupt:
        stop.set()
        raise
    finally:
        for world in worlds:  # stops a worker mid-point too
            world.close()
        for thread in threads:
            thread.join(timeout=30)
    progress.close()
    interrupted = [e for e in errors if isinstance(e, KeyboardInterrupt)]
    if errors:
        raise interrupted[0] if interrupted else errors[0]
