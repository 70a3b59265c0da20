"""Inside a Slurm job: one task per rank runs one point and records how it ended.

Inside each task (``run_task``): submitit's ``TorchDistributedEnvironment`` gives rank, world
and rendezvous (MASTER_ADDR: the job's first node, by name; a name that does not resolve fails
the job at once, naming it, instead of every rank waiting at a guessed address until the
timeout; MASTER_PORT: ``rendezvous_port``, below the kernel's ephemeral range),
``init_process_group`` (NCCL on GPUs, gloo otherwise) with the point's timeout, then the same
per-rank body as ``bench``. Rank 0 gathers every rank's measurement and writes the
record.

A job must never hang the sweep: a rank that raises records its error (OOM -> ``oom``) and
leaves with ``os._exit(1)``, and ``srun --kill-on-bad-exit`` takes the other ranks down; a
watchdog in every rank records ``timeout`` and exits when the point overruns; the job's own
time limit sits above that. Preemption: ``PointTask`` is a submitit Checkpointable, so a
preempted job is requeued and the point reruns from its start (a benchmark step has no state
worth saving).
"""

from __future__ import annotations

import os
import random
import socket
import sys
import threading
import traceback
from datetime import timedelta
from typing import Any

import submitit
import torch
import torch.distributed as dist

from tspbench.analytic.profile_choice import choose_profile
from tspbench.core.units import excerpt
from tspbench.dist.launch import RankError
from tspbench.measure.bench import completed_record, rank_bench
from tspbench.measure.env import environment
from tspbench.sweep.points import Point
from tspbench.sweep.store import Store


class RendezvousError(RuntimeError):
    """The job's rendezvous host cannot be reached by name (a DNS or /etc/hosts fault)."""


class PointTask(submitit.helpers.Checkpointable):
    """The submitted callable: one point, run by every task of its job."""

    def __init__(self, experiment_dir: str, point: dict[str, Any], hardware: str | None = None) -> None:
        self.experiment_dir, self.point = experiment_dir, point
        self.hardware = hardware  # the experiment's profile, if it names one (else the node's device's)
        self.preempted = False

    def __call__(self) -> str:
        return run_task(self)

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """Preempted (or at the time limit): back to pending; the requeued job reruns the point."""
        self.preempted = True
        store = Store(self.experiment_dir)
        store.update(
            self.point["run_id"],
            lambda s: (
                {**s, "status": "pending", "error": "preempted; requeued"}
                if s and s["status"] == "running"
                else None
            ),
        )
        return super().checkpoint(*args, **kwargs)


def run_task(task: PointTask) -> str:
    """One rank of one point (see the module docstring for how failures end the job)."""
    point, store = Point.from_json(task.point), Store(task.experiment_dir)
    rid = point.run_id
    denv = job_environment()
    rank = denv.rank
    if store.state(rid) == "completed":
        return "completed"
    if rank == 0:
        store.start(rid, slurm_job_id=_job_id(), executor="slurm")  # this task owns the point
    watchdog = _watchdog(task, point, rank)
    try:
        _init_process_group(denv, point.workload.device, point.timeout)
        m = point.config["measure"]
        mine = rank_bench(
            point.layout, point.workload, m["steps"], m["warmup"], m["repeats"], m["capacity_bytes"]
        )
        ranks = _gather(mine, rank, denv.world_size)
        if rank == 0:
            _record_completed(store, point, ranks, task.hardware)
        _shutdown()
        watchdog.cancel()
        return "completed"
    except BaseException as exc:
        if task.preempted and isinstance(exc, SystemExit):
            raise  # submitit requeues the job after checkpoint(); not a failure
        _fail(task, point, rank, exc, traceback.format_exc())
        raise  # unreachable: _fail exits


def _job_id() -> str | None:
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array:
        return f"{array}_{os.environ.get('SLURM_ARRAY_TASK_ID')}"
    return os.environ.get("SLURM_JOB_ID")


def job_environment() -> submitit.helpers.TorchDistributedEnvironment:
    """This task's rank, world and rendezvous from Slurm's variables (submitit), its port from
    ``rendezvous_port``, exported for torch's env:// initialisation."""
    denv = submitit.helpers.TorchDistributedEnvironment()
    denv.master_port = rendezvous_port(_job_id() or "")
    return denv.export(set_cuda_visible_devices=False, overwrite=True)


RENDEZVOUS_PORTS = (20000, 32767)  # below Linux's default ephemeral range, 32768-60999


def rendezvous_port(job_id: str) -> int:
    """The port rank 0 listens on, the same in every task of the job: drawn from the job's id
    as submitit draws it, but from ``RENDEZVOUS_PORTS``. submitit's range (20000-60000) mostly
    lies in the kernel's ephemeral range, where any outgoing connection on the node (a slurmd's,
    another job's gloo pair) may already hold the port, and rank 0's bind then fails with
    EADDRINUSE while every other rank waits out its timeout."""
    return random.Random(job_id).randint(*RENDEZVOUS_PORTS)


def master_address(name: str) -> str:
    """The address of the rendezvous host ``name``. Falling back to loopback when the name does
    not resolve would put each node's ranks at their own host, waiting for the others until
    the timeout: a DNS fault must fail the job at once, and say which name."""
    try:
        return socket.gethostbyname(name)
    except OSError as exc:
        raise RendezvousError(
            f"MASTER_ADDR {name!r} (the job's first node) does not resolve: {exc.strerror or exc}; "
            "the nodes' names must resolve on every node (DNS or /etc/hosts)"
        ) from None


def _init_process_group(denv: Any, device: str, timeout: float) -> None:
    master_address(os.environ["MASTER_ADDR"])
    if device == "cuda":
        torch.cuda.set_device(denv.local_rank)
        backend = "nccl"
    else:
        torch.set_num_threads(int(os.environ.get("SLURM_CPUS_PER_TASK", "1")))
        backend = "gloo"
    dist.init_process_group(
        backend, rank=denv.rank, world_size=denv.world_size, timeout=timedelta(seconds=timeout)
    )
    dist.barrier()  # every rank connected before any can fail and exit (peers would see a reset)


def _gather(mine: dict[str, Any], rank: int, world: int) -> list[dict[str, Any]]:
    out: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(mine, out, dst=0)
    return out or []


def _shutdown() -> None:
    dist.barrier()  # rank 0 has written the record before anyone tears down
    dist.destroy_process_group()


def _record_completed(store: Store, point: Point, ranks: list[dict[str, Any]], hardware: str | None) -> None:
    """The point's record, priced on its profile, chosen here where its device is known: the
    experiment's ``hardware``, else the node's device's (tspbench.analytic.profile_choice)."""
    env = environment(point.workload.device)
    store.write_env(point.run_id, env)
    device, name = point.workload.device, str(env["device_name"])
    choice = choose_profile(None, device=device, device_name=name, experiment=hardware, measured=True)
    record = {
        **point.base_record(),
        **completed_record(
            point.layout, point.workload, ranks, choice, point.trace_path(store.run_dir(point.run_id))
        ),
        **{f"env_{k}": v for k, v in env.items()},
    }
    store.finish(point.run_id, "completed", record)


def _fail(task: PointTask, point: Point, rank: int, exc: BaseException, text: str, status: str = "") -> None:
    """Record this rank's error (first writer wins), then leave at once: peers may be stuck in
    a collective with us, and srun --kill-on-bad-exit ends them when we exit non-zero."""
    error = RankError(rank, type(exc).__name__, str(exc), text)
    if not status:
        timed_out = type(exc).__name__ == "UncompletedJobError"  # submitit: the job's time is up
        status = "timeout" if timed_out else "oom" if error.is_oom else "failed"
    store = Store(task.experiment_dir)
    try:
        store.write_log(point.run_id, f"rank{rank}-job{_job_id()}.log", text)
        record = {**point.base_record(), "status": status, "error": excerpt(str(error)), "failed_rank": rank}
        store.finish(point.run_id, status, record)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _watchdog(task: PointTask, point: Point, rank: int) -> threading.Timer:
    """Record ``timeout`` and exit if this rank is still busy after the point's timeout."""

    def fire() -> None:
        message = f"point exceeded its timeout of {point.timeout:.0f} s"
        _fail(task, point, rank, TimeoutError(message), message, status="timeout")

    timer = threading.Timer(point.timeout, fire)
    timer.daemon = True
    timer.start()
    return timer
