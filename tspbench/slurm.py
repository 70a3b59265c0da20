"""The Slurm executor: each point one submitit job, one task per rank, no torchrun.

Per point: nodes = ceil(world / gpus_per_node), tasks per node = min(world, gpus_per_node).
Points of the same shape go out as one job array (``executor.batch()``, at most
``array_parallelism`` running at once). Inside each task (``run_task``): submitit's
``TorchDistributedEnvironment`` gives rank, world and rendezvous (loopback when the master's
host name does not resolve, as on the one-host test cluster), ``init_process_group`` (NCCL on
GPUs, gloo otherwise) with the point's timeout, then the same per-rank body as ``bench``.
Rank 0 gathers every rank's measurement and writes the record.

A job must never hang the sweep: a rank that raises records its error (OOM -> ``oom``) and
leaves with ``os._exit(1)``, and ``srun --kill-on-bad-exit`` takes the other ranks down; a
watchdog in every rank records ``timeout`` and exits when the point overruns; the job's own
time limit sits above that. The sweep watches its jobs through ``squeue``/``sacct`` (each call
with a timeout), and maps a job that ended without recording anything to a status
(``SLURM_OUTCOMES``); without accounting Slurm forgets finished jobs and submitit sees UNKNOWN,
so a job that has left the queue without a word is recorded ``failed`` after a grace period.
Preemption: ``PointTask`` is a submitit Checkpointable, so a preempted job is requeued and
the point reruns from its start (a benchmark step has no state worth saving).
"""

from __future__ import annotations

import contextlib
import getpass
import math
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import submitit

from tspbench.cli import UsageError
from tspbench.experiment import DEVICES, Point
from tspbench.results import FINAL, Store, excerpt
from tspbench.schema import INT, NUM, STR, Field, SchemaError, check_mapping
from tspbench.sweep import base_record, point_label

PROFILE = {
    "description": Field(STR, ""),
    "partition": Field(STR, None, nullable=True),
    "account": Field(STR, None, nullable=True),
    "gpus_per_node": Field(INT, None, minimum=1, required=True),  # ranks per node (GPUs on cuda)
    "cpus_per_task": Field(INT, 1, minimum=1),
    "mem": Field(STR, None, nullable=True),  # sbatch --mem per node, e.g. "0" (all) or "500G"
    "time": Field(INT, 60, minimum=1),  # the most minutes one job may ask for
    "constraint": Field(STR, None, nullable=True),
    "device": Field(STR, "cuda", DEVICES),
    "array_parallelism": Field(INT, 64, minimum=1),
    "extra": Field((dict,), None, nullable=True),  # more sbatch options: {qos: high, exclusive: true}
    "setup": Field((list,), None, nullable=True),  # shell lines before srun (module load, venv)
    "wait_timeout": Field(NUM, 86400, minimum=1),  # seconds the sweep watches before detaching
    "poll": Field(NUM, 5, minimum=0.2),  # seconds between queue polls
}
START_MARGIN_MIN = 3  # job time limit = point timeout + this (imports, rendezvous, writing)
QUERY_TIMEOUT_S = 30.0
VANISHED_GRACE_S = 15.0
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
          "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD"}  # fmt: skip
SLURM_OUTCOMES = {
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "CANCELLED": "cancelled",
    "PREEMPTED": "cancelled",
    "OUT_OF_MEMORY": "oom",
    "FAILED": "failed",
    "NODE_FAIL": "failed",
    "BOOT_FAIL": "failed",
    "COMPLETED": "failed",  # completed without a record: the task died before writing
}
PROFILE_DIRS = (Path.cwd() / "slurm", Path(__file__).resolve().parents[1] / "slurm")


@dataclass(frozen=True)
class Profile:
    """A cluster profile, ``slurm/NAME.yaml`` (see PROFILE for the keys)."""

    name: str
    path: Path
    values: dict[str, Any] = field(repr=False)

    def __getattr__(self, key: str) -> Any:
        try:
            return self.values[key]
        except KeyError:
            raise AttributeError(key) from None

    def check_points(self, points: list[Point], experiment: Path) -> None:
        """Every point's device must be the cluster's: a CPU profile cannot run CUDA points."""
        for p in points:
            device = p.config["workload"]["device"]
            if device != self.device:
                raise UsageError(
                    f"{experiment}: settings.device {device!r} does not match cluster profile "
                    f"{self.path} (device {self.device!r}); change one of them"
                )

    def parameters(self, nodes: int, tasks_per_node: int, minutes: int, name: str) -> dict[str, Any]:
        """sbatch parameters for submitit's SlurmExecutor (None values left out)."""
        params = {
            "job_name": name,
            "partition": self.partition,
            "account": self.account,
            "nodes": nodes,
            "ntasks_per_node": tasks_per_node,
            "cpus_per_task": self.cpus_per_task,
            "gpus_per_node": tasks_per_node if self.device == "cuda" else None,
            "time": minutes,
            "mem": self.mem,
            "constraint": self.constraint,
            "setup": list(self.setup or []),
            "additional_parameters": dict(self.extra or {}),
            "srun_args": ["--kill-on-bad-exit=1"],
            "array_parallelism": self.array_parallelism,
        }
        return {k: v for k, v in params.items() if v is not None}


def profile_names() -> list[str]:
    return sorted({p.stem for d in PROFILE_DIRS if d.is_dir() for p in d.glob("*.yaml")})


def load_profile(name: str) -> Profile:
    """``NAME`` -> slurm/NAME.yaml (here, then in the repository); a path is used as it is."""
    import yaml

    if name.endswith((".yaml", ".yml")) or os.sep in name:
        path = Path(name)
    else:
        path = next((d / f"{name}.yaml" for d in PROFILE_DIRS if (d / f"{name}.yaml").is_file()), Path(name))
    if not path.is_file():
        raise UsageError(f"cluster profile {name!r} not found; known: {', '.join(profile_names()) or 'none'}")
    try:
        values = check_mapping(yaml.safe_load(path.read_text()), PROFILE, "")
        for key, value in (values["extra"] or {}).items():
            if not isinstance(value, (str, int, float, bool)):
                raise SchemaError(f"extra.{key}", f"sbatch option values are scalars, got {value!r}")
        if not all(isinstance(line, str) for line in values["setup"] or []):
            raise SchemaError("setup", "expected a list of shell lines (strings)")
    except SchemaError as exc:
        raise UsageError(f"{path}: {exc}") from None
    except Exception as exc:  # YAML syntax
        raise UsageError(f"{path}: not a valid cluster profile: {str(exc).splitlines()[0]}") from None
    return Profile(path.stem, path, values)


# ----------------------------------------------------------------------------- inside a job


class PointTask(submitit.helpers.Checkpointable):
    """The submitted callable: one point, run by every task of its job."""

    def __init__(self, experiment_dir: str, point: dict[str, Any]) -> None:
        self.experiment_dir, self.point = experiment_dir, point
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
    from tspbench.bench import _rank_bench

    point, store = Point.from_json(task.point), Store(task.experiment_dir)
    rid = point.run_id
    denv = submitit.helpers.TorchDistributedEnvironment()
    denv.export(set_cuda_visible_devices=False, overwrite=True)
    rank = denv.rank
    if store.state(rid) == "completed":
        return "completed"
    if rank == 0:
        store.start(rid, host=socket.gethostname(), slurm_job_id=_job_id(), executor="slurm")
    watchdog = _watchdog(task, point, rank)
    try:
        _init_process_group(denv, point.workload.device, point.timeout)
        m = point.config["measure"]
        mine = _rank_bench(
            point.layout, point.workload, m["steps"], m["warmup"], m["repeats"], m["capacity_bytes"]
        )
        ranks = _gather(mine, rank, denv.world_size)
        if rank == 0:
            _record_completed(store, point, ranks)
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


def _init_process_group(denv: Any, device: str, timeout: float) -> None:
    import torch
    import torch.distributed as dist

    try:
        socket.gethostbyname(os.environ["MASTER_ADDR"])
    except OSError:
        os.environ["MASTER_ADDR"] = "127.0.0.1"  # fake nodes of one host (n1, n2) do not resolve
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
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
    import torch.distributed as dist

    out: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(mine, out, dst=0)
    return out or []


def _shutdown() -> None:
    import torch.distributed as dist

    dist.barrier()  # rank 0 has written the record before anyone tears down
    dist.destroy_process_group()


def _record_completed(store: Store, point: Point, ranks: list[dict[str, Any]]) -> None:
    from tspbench.bench import completed_record
    from tspbench.env import environment

    env = environment(point.workload.device)
    store.write_env(point.run_id, env)
    record = {
        **base_record(point),
        **completed_record(point.layout, point.workload, ranks, point.config.get("hardware")),
        **{f"env_{k}": v for k, v in env.items()},
    }
    store.finish(point.run_id, "completed", record)


def _fail(task: PointTask, point: Point, rank: int, exc: BaseException, text: str, status: str = "") -> None:
    """Record this rank's error (first writer wins), then leave at once: peers may be stuck in
    a collective with us, and srun --kill-on-bad-exit ends them when we exit non-zero."""
    from tspbench.launch import RankError

    error = RankError(rank, type(exc).__name__, str(exc), text)
    if not status:
        timed_out = type(exc).__name__ == "UncompletedJobError"  # submitit: the job's time is up
        status = "timeout" if timed_out else "oom" if error.is_oom else "failed"
    store = Store(task.experiment_dir)
    try:
        store.write_log(point.run_id, f"rank{rank}-job{_job_id()}.log", text)
        record = {**base_record(point), "status": status, "error": excerpt(str(error)), "failed_rank": rank}
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


# ----------------------------------------------------------------------------- submitting


def _require_slurm() -> None:
    missing = [b for b in ("sbatch", "squeue", "scancel") if shutil.which(b) is None]
    if missing:
        raise UsageError(f"slurm executor: {', '.join(missing)} not found; run on a Slurm login node")


def submit(points: list[Point], store: Store, profile: Profile) -> list[tuple[Point, str]]:
    """Submit ``points`` as one job array per (nodes, tasks per node, time limit)."""
    groups: dict[tuple[int, int, int], list[Point]] = defaultdict(list)
    for p in points:
        gpn = profile.gpus_per_node
        minutes = min(profile.time, math.ceil(p.timeout / 60) + START_MARGIN_MIN)
        groups[(p.nodes(gpn), p.tasks_per_node(gpn), minutes)].append(p)
    submitted: list[tuple[Point, str]] = []
    for (nodes, tasks, minutes), group in groups.items():
        executor = submitit.SlurmExecutor(folder=store.root / ".slurm" / "%j", max_num_timeout=0)
        executor.update_parameters(
            **profile.parameters(nodes, tasks, minutes, f"tspbench-{group[0].experiment}")
        )
        for p in group:
            store.queue(p.run_id, executor="slurm", slurm_job_id=None)
        try:
            with executor.batch():
                jobs = [executor.submit(PointTask(str(store.root), p.to_json())) for p in group]
        except Exception as exc:  # sbatch rejected it: the points fail, the other groups go on
            message = f"sbatch failed: {str(exc).strip()[:2000]}"
            print(f"{nodes} node(s) x {tasks} task(s): {message}", file=sys.stderr)
            for p in group:
                store.finish(p.run_id, "failed", error=message)
            continue
        for p, job in zip(group, jobs, strict=True):
            store.annotate(p.run_id, slurm_job_id=job.job_id)
            submitted.append((p, job.job_id))
    return submitted


# ----------------------------------------------------------------------------- watching


def _run(cmd: list[str]) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _expand(job: str) -> list[str]:
    """``123_[1-3,5%2]`` -> 123_1, 123_2, 123_3, 123_5 (pending array elements)."""
    if "_[" not in job:
        return [job]
    main, ranges = job.split("_[", 1)
    out = []
    for part in ranges.rstrip("]").split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        out += [f"{main}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def job_states(job_ids: set[str]) -> tuple[dict[str, str], bool]:
    """Job id -> Slurm state (squeue first, it knows live jobs; then sacct); and whether squeue
    answered (if not, nothing may be concluded from a job's absence)."""
    if not job_ids:
        return {}, True
    mains = sorted({j.split("_")[0] for j in job_ids})
    states: dict[str, str] = {}
    acct = _run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(mains)])
    # all of the user's jobs, not -j: squeue fails on ids it has already forgotten
    queue = _run(["squeue", "-h", "-r", "-t", "all", "-o", "%i %T", "-u", getpass.getuser()])
    for text, sep in ((acct, "|"), (queue, " ")):
        for line in (text or "").splitlines():
            job, _, state = line.strip().partition(sep)
            for jid in _expand(job):
                states[jid] = state.split()[0] if state.split() else "UNKNOWN"
    return states, queue is not None


def watch(submitted: list[tuple[Point, str]], store: Store, profile: Profile, progress: Any) -> None:
    """Poll until every point has a final status (or ``wait_timeout``: the jobs keep going)."""
    open_points = {p.run_id: (p, job) for p, job in submitted}
    gone: dict[str, float] = {}
    deadline = time.monotonic() + profile.wait_timeout
    while open_points:
        states, answered = job_states({job for _, job in open_points.values()})
        for rid, (point, job) in list(open_points.items()):
            state = states.get(job, "UNKNOWN")
            status = store.state(rid)
            if status not in FINAL:
                status = _conclude(store, rid, job, state, answered, gone)
            if status in FINAL:
                del open_points[rid]
                _copy_logs(store, rid, job)
                progress.finished(status, f"{point_label(point)}  job {job}")
        running = sum(states.get(job) == "RUNNING" for _, job in open_points.values())
        queued = len(open_points) - running
        progress.update(running, f"{queued} queued" if open_points else "")
        if not open_points or time.monotonic() > deadline:
            break
        time.sleep(profile.poll)
    progress.close()
    if open_points:
        ids = " ".join(sorted({j.split("_")[0] for _, j in open_points.values()}))
        print(f"stopped watching after {profile.wait_timeout:.0f} s; jobs {ids} go on and record their "
              f"own status (`tspbench status {store.root}`; `scancel {ids}` stops them)")  # fmt: skip


def _conclude(
    store: Store, rid: str, job: str, state: str, answered: bool, gone: dict[str, float]
) -> str | None:
    """A job that ended (or vanished) without recording a status gets one from its Slurm state."""
    if state in ACTIVE:
        gone.pop(rid, None)
        return None
    if state == "UNKNOWN":
        if not answered:
            return None
        first_missed = gone.setdefault(rid, time.monotonic())
        if time.monotonic() - first_missed < VANISHED_GRACE_S:
            return None
        error = f"Slurm job {job} left the queue without recording a status (state unknown: no accounting?)"
        store.finish(rid, "failed", error=error)
    else:
        outcome = SLURM_OUTCOMES.get(state, "failed")
        store.finish(rid, outcome, error=f"Slurm job {job} ended {state}", slurm_state=state)
    return store.state(rid)


def _copy_logs(store: Store, rid: str, job: str) -> None:
    """The Slurm tasks' stdout/stderr into the run folder's logs/ (best effort)."""
    folder = store.root / ".slurm" / job
    for path in sorted(folder.glob("*_log.*")) if folder.is_dir() else []:
        with contextlib.suppress(OSError):
            store.write_log(rid, f"slurm-{path.name}", path.read_text(errors="replace")[-200_000:])


def run_slurm(points: list[Point], store: Store, profile: Profile, progress: Any) -> None:
    """Submit the points that are not already queued or running in Slurm, then watch them all."""
    _require_slurm()
    listed = {p.run_id: (store.status(p.run_id) or {}).get("slurm_job_id") for p in points}
    states, _ = job_states({j for j in listed.values() if j})
    live = [(p, listed[p.run_id]) for p in points if states.get(listed[p.run_id] or "", "") in ACTIVE]
    fresh = [p for p in points if p.run_id not in {q.run_id for q, _ in live}]
    for p, job in live:
        progress.note(f"still in Slurm as job {job}: {p.run_id} (not resubmitted)")
    watch(live + submit(fresh, store, profile), store, profile, progress)
