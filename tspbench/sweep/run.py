"""Running an experiment's points into the results store (``tspbench run``).

Everything is validated first (experiment, cluster profile, executor); only then is anything
written. Completed points are skipped, so a killed sweep resumes where it stopped; finished
points that did not complete (oom, failed, timeout, cancelled) are results too and rerun only
with ``retry_failed``. Executors: ``local`` measures points one after another on this machine
(tspbench.sweep.local); ``slurm`` submits them as submitit job arrays (tspbench.sweep.slurm);
``predict`` asks the analytic model (tspbench.analytic); ``fake`` executes each point's step
in the fake world (tspbench.measure.fake): exact memory, comm and FLOPs at any scale, no time.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from tspbench.analytic import host_memory
from tspbench.analytic.profile_choice import HardwareChoice, choose_profile
from tspbench.core.bounds import max_cpu_ranks
from tspbench.core.errors import LayoutError, UsageError
from tspbench.core.names import INTERRUPTED
from tspbench.core.progress import Progress
from tspbench.measure.fake_cuda import preload_env
from tspbench.strategy import check_fake_world
from tspbench.sweep import fake, local, slurm
from tspbench.sweep.cluster import Profile, load_profile
from tspbench.sweep.experiment import Experiment, load_experiment
from tspbench.sweep.points import Point, Skipped, expand
from tspbench.sweep.store import Store, shown_status, write_json


@dataclass
class Sweep:
    """A validated sweep: the experiment, its executor and cluster, its points and the skipped ones."""

    experiment: Experiment
    executor: str
    points: list[Point]
    skipped: list[Skipped]
    profile: Profile | None = None  # when a cluster is named
    hardware: HardwareChoice | None = None  # the predict executor's profile (the experiment's)
    node_limit: int | None = None  # the most nodes a Slurm job may span, where known

    @property
    def gpus_per_node(self) -> int | None:
        return self.profile.gpus_per_node if self.profile is not None else None


def prepare_sweep(path: str, overrides: list[str], executor: str | None, cluster: str | None) -> Sweep:
    """Load and validate everything a run needs; raises UsageError (exit 2) on bad input."""
    exp = load_experiment(path, overrides)
    if cluster is not None and executor not in (None, "slurm"):
        raise UsageError(
            f"--cluster {cluster}: a cluster profile is for the slurm executor, not --executor {executor}"
        )
    executor = executor or ("slurm" if cluster is not None else exp.executor)  # --cluster implies slurm
    cluster = cluster or exp.cluster
    if executor == "slurm" and cluster is None:
        raise UsageError(
            f"{exp.path}: the slurm executor needs a cluster profile: --cluster NAME or cluster:"
        )
    profile = load_profile(cluster) if cluster is not None and executor not in ("predict", "fake") else None
    if executor == "predict" and exp.hardware is None:
        raise UsageError(f"{exp.path}: the predict executor needs a hardware profile: set hardware:")
    method = {"predict": "predict", "fake": "fake"}.get(executor, "measure")
    points, skipped = expand(exp, method, exp.hardware)
    node_limit = None
    if executor == "slurm":
        profile.check_points(points, exp.path)
        node_limit = slurm.check_cluster_size(points, profile, exp.path)
    hardware = _check_predictor(exp, points) if executor == "predict" else None
    if executor == "local":
        _check_local_devices(exp, points)
    if executor == "fake":
        _check_fake_devices(exp, points)
    return Sweep(exp, executor, points, skipped, profile, hardware, node_limit)


def _check_predictor(exp: Experiment, points: list[Point]) -> HardwareChoice:
    """The experiment's profile, every point's; the first point predicted now (it is instant),
    so a bad hardware name fails before the run."""
    try:
        choice = choose_profile(
            None, device=points[0].workload.device, experiment=exp.hardware, measured=False
        )
        local.predictor(choice)(points[0])
    except Exception as exc:
        raise UsageError(f"{exp.path}: hardware {exp.hardware!r}: {str(exc).splitlines()[0]}") from None
    return choice


def _check_local_devices(exp: Experiment, points: list[Point]) -> None:
    """CUDA points need one visible GPU per rank on this machine; CPU points are processes on
    it, as many as a single bench may start (tspbench.core.bounds.max_cpu_ranks)."""
    cpu = [p for p in points if p.config["workload"]["device"] == "cpu"]
    widest = max(cpu, key=lambda p: p.world_size, default=None)
    if widest is not None and widest.world_size > max_cpu_ranks():
        raise UsageError(
            f"{exp.path}: {', '.join(widest.origin) or 'a point'}: {widest.world_size} CPU ranks are as many "
            f"processes; this host ({os.cpu_count()} cores) starts at most {max_cpu_ranks()}"
        )
    _check_host_memory(exp, cpu)
    cuda = [p for p in points if p.config["workload"]["device"] == "cuda"]
    if not cuda:
        return
    need, have = max(p.world_size for p in cuda), torch.cuda.device_count()
    if have < need:
        raise UsageError(
            f"{exp.path}: device cuda needs {need} GPUs on this machine for the local executor, "
            f"{have} visible; use --executor slurm or predict, or --set settings.device=cpu"
        )


def _check_host_memory(exp: Experiment, cpu: list[Point]) -> None:
    """A CPU point's tensors are real: one this host cannot hold is refused before the sweep
    starts, by the bound ``bench`` applies (tspbench.analytic.host_memory), naming the key."""
    have = host_memory.available_bytes()
    for point in cpu:
        problem = host_memory.memory_problem(point.layout, point.workload, have)
        if problem:
            key, why = problem
            swept = [o for o in point.origin if f".{key}[" in o]
            where = swept[0] if swept else f"settings.{key}"
            value = point.config["workload"][key]
            raise UsageError(f"{exp.path}: {where}: {key} {value:,}: {point.layout.describe()}: {why}")


def _check_fake_devices(exp: Experiment, points: list[Point]) -> None:
    """Fake CUDA on a CPU-only torch needs its shim built: now, so a missing compiler stops the run."""
    for device in sorted({p.config["workload"]["device"] for p in points}):
        try:
            preload_env(device)
        except UsageError as exc:
            raise UsageError(f"{exp.path}: device {device} with the fake executor: {exc}") from None
    for point in points:
        try:
            check_fake_world(point.layout, point.workload)
        except LayoutError as exc:
            where = ", ".join(point.origin) or "the point"
            raise UsageError(f"{exp.path}: {where}: {exc}") from None


def select(
    points: list[Point], store: Store, retry_failed: bool, notes: list[str] | None = None
) -> list[Point]:
    """Write every point's folder (point.json, pending) and return those that need a run.

    A damaged folder (a file that does not parse, or parses to the wrong shape) is not done:
    its files are moved aside, never overwritten, the point runs again, and ``notes`` says so;
    so it does for a point left running by a process that is gone (interrupted).
    """
    notes = [] if notes is None else notes
    for point in points:
        problems = store.problems(point.run_id)
        if problems:
            aside = store.quarantine(point.run_id)
            notes += [
                f"{problem}; moved to {aside.name}/ beside it, the point runs again" for problem in problems
            ]
        status = store.status(point.run_id)
        if status and shown_status(status)[0] == INTERRUPTED:
            owner = f"pid {status.get('pid')} on {status.get('host')}"
            notes.append(f"{point.label}: interrupted ({owner} is gone, no final status); it runs again")
        store.prepare(point.to_json())
    return [p for p in points if store.needs_run(p.run_id, retry_failed)]


@contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM (a killed job, a closed terminal) unwinds like Ctrl-C, so ranks are killed too."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_sweep(
    sweep: Sweep, store: Store, retry_failed: bool, progress: Progress | None = None
) -> list[Point]:
    """Run the points that need it (one sweep per results folder at a time, whatever the
    executor: a second would run every point again); returns them. KeyboardInterrupt (Ctrl-C,
    SIGTERM) leaves the current point pending and propagates."""
    with interrupt_on_sigterm(), local.sweep_lock(store):
        notes: list[str] = []
        todo = select(sweep.points, store, retry_failed, notes)
        write_json(store.root / "experiment.json", experiment_json(sweep))
        progress = progress or Progress()
        progress.start(len(todo), sweep.experiment.name)
        for note in notes:
            progress.warn(note)
        progress.note(
            f"{sweep.experiment.name}: {len(sweep.points)} points, {len(sweep.points) - len(todo)} already "
            f"done, {len(todo)} to run with the {sweep.executor} executor -> {store.root}"
        )
        execute(sweep, todo, store, progress)
    return todo


def execute(sweep: Sweep, todo: list[Point], store: Store, progress: Progress) -> None:
    """Hand the points to the sweep's executor."""
    if sweep.executor == "slurm":
        slurm.run_slurm(todo, store, sweep.profile, progress, sweep.experiment.hardware)
        return
    if sweep.executor == "fake":
        fake.run_fake(todo, store, progress)
        return
    if sweep.executor == "local":
        measure = local.measurer(sweep.experiment.hardware, store)
    else:
        measure = local.predictor(sweep.hardware)
    local.run_local(todo, store, measure, sweep.executor, progress, sweep.hardware)


def experiment_json(sweep: Sweep) -> dict[str, Any]:
    exp = sweep.experiment
    return {
        "name": exp.name,
        "file": str(exp.path),
        "overrides": list(exp.overrides),
        "executor": sweep.executor,
    }
