"""The Slurm executor: each point one submitit job, one task per rank, no torchrun.

Per point: nodes = ceil(world / gpus_per_node), tasks per node = min(world, gpus_per_node).
Points of the same shape go out as one job array (``executor.batch()``, at most
``array_parallelism`` running at once): ``submissions`` groups them, and ``--dry-run`` prints
each one's sbatch options from it. What runs inside a job, and how a failing rank ends it,
is tspbench.sweep.slurm_job. The sweep watches its jobs through ``squeue``/``sacct`` (each call
with a timeout), and maps a job that ended without recording anything to a status
(``SLURM_OUTCOMES``); without accounting Slurm forgets finished jobs and submitit sees UNKNOWN,
so a job that has left the queue without a word is recorded ``failed`` after a grace period.
A job pending for a reason that waiting never clears (``never_starts``: it asks for more
nodes or time than its partition has, or breaks a per-job limit) is cancelled and recorded
``failed`` at once. Before anything is submitted (and in ``--dry-run``), ``check_cluster_size``
refuses a world larger than the cluster: the profile's ``nodes`` x ``gpus_per_node``, and the
partition's node count from ``sinfo`` when it answers.
"""

from __future__ import annotations

import contextlib
import getpass
import math
import shlex
import shutil
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit

from tspbench.core.errors import UsageError
from tspbench.core.names import FINAL_STATUSES
from tspbench.core.progress import Progress
from tspbench.sweep.cluster import Profile
from tspbench.sweep.points import Point
from tspbench.sweep.slurm_job import PointTask
from tspbench.sweep.store import Store

START_MARGIN_MIN = 3  # job time limit = point timeout + this (imports, rendezvous, writing)
QUERY_TIMEOUT_S = 30.0
SBATCH_TIMEOUT_S = 120  # an sbatch that has not answered by then never will (#45): its points fail
SINFO_TIMEOUT_S = 10.0  # before anything is submitted: a controller that does not answer is skipped
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
# Pending reasons (squeue %r, slurm.schedmd.com/job_reason_codes.html) that waiting never clears:
# the job asks for more than its partition, account or QOS allows any one job.
NEVER_STARTS = {"PartitionNodeLimit", "PartitionTimeLimit", "PartitionConfig", "BadConstraints",
                "DependencyNeverSatisfied", "InvalidAccount", "InvalidQOS", "AccountNotAllowed",
                "QOSNotAllowed"}  # fmt: skip


def never_starts(reason: str) -> bool:
    """True for a pending reason no amount of waiting clears (also any per-job limit, e.g.
    QOSMaxNodePerJobLimit, AssocMaxWallDurationPerJobLimit)."""
    name = reason.strip("()").split(",")[0].strip()
    return name in NEVER_STARTS or (name.startswith(("AssocMax", "QOSMax")) and "PerJob" in name)


# ----------------------------------------------------------------------------- submitting


def partition_nodes(partition: str | None) -> int | None:
    """Nodes in ``partition`` (None: the default one) as sinfo counts them, or None when sinfo is
    missing or does not answer within SINFO_TIMEOUT_S."""
    if shutil.which("sinfo") is None:
        return None
    try:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %P"], capture_output=True, text=True, timeout=SINFO_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    nodes = set()
    for line in done.stdout.splitlines():
        node, _, part = line.strip().partition(" ")
        if part.rstrip("*") == partition or (partition is None and part.endswith("*")):
            nodes.add(node)
    return len(nodes) or None


def cluster_limit(profile: Profile) -> tuple[int, str] | None:
    """The most nodes a job may span and what says so: the profile's ``nodes`` or the partition's
    size from sinfo when it answers, the smaller; None when neither knows."""
    limits = [(profile.nodes, f"cluster profile {profile.path} (nodes: {profile.nodes})")]
    counted = partition_nodes(profile.partition)
    where = f"partition {profile.partition}" if profile.partition else "the default partition"
    limits.append((counted, f"{where} (sinfo: {counted} nodes)"))
    known = [(n, source) for n, source in limits if n is not None]
    return min(known) if known else None


def check_cluster_size(points: list[Point], profile: Profile, experiment: Path) -> int | None:
    """Refuse (UsageError, one line) a point whose world needs more nodes than the cluster has
    (``cluster_limit``); returns that limit (None: unknown) for the dry run to quote."""
    found = cluster_limit(profile)
    if found is None:
        return None
    limit, source = found
    gpn = profile.gpus_per_node
    for p in points:
        if p.nodes(gpn) > limit:
            raise UsageError(
                f"{experiment}: point {p.label} needs {p.world_size} ranks = {p.nodes(gpn)} nodes of "
                f"{gpn}, but {source} allows {limit} nodes ({limit * gpn} ranks); use a smaller layout"
            )
    return limit


def _require_slurm() -> None:
    missing = [b for b in ("sbatch", "srun", "squeue", "scancel") if shutil.which(b) is None]
    if missing:
        raise UsageError(f"slurm executor: {', '.join(missing)} not found; run on a Slurm login node")


@dataclass(frozen=True)
class Submission:
    """One sbatch call: the points of one shape (nodes, tasks per node, time limit), a job array
    of them, or a plain job when there is one (submitit's ``executor.batch()`` does the same)."""

    nodes: int
    tasks_per_node: int
    minutes: int
    points: list[Point]

    def parameters(self, profile: Profile) -> dict[str, Any]:
        """What submitit's SlurmExecutor is given for this submission."""
        name = f"tspbench-{self.points[0].experiment}"
        return profile.parameters(self.nodes, self.tasks_per_node, self.minutes, name)

    def sbatch_options(self, profile: Profile) -> list[str]:
        """The sbatch options submitit writes for it ('--partition=gpu', '--exclusive',
        '--array=0-23%16'), less its own bookkeeping (log paths, signal, wckey)."""
        params = self.parameters(profile)
        options = {k: v for k, v in params.items() if k not in SUBMITIT_ONLY}
        options.update(params.get("additional_parameters", {}))
        if len(self.points) > 1:
            options["array"] = (
                f"0-{len(self.points) - 1}%{min(len(self.points), params['array_parallelism'])}"
            )
        return [
            f"--{k.replace('_', '-')}" if v is True else f"--{k.replace('_', '-')}={shlex.quote(str(v))}"
            for k, v in options.items()
        ]


class TimedExecutor(submitit.SlurmExecutor):
    """submitit's executor with its sbatch call under ``timeout`` (coreutils): submitit waits on
    sbatch with no limit, so a controller that never answers would hang the sweep forever. timeout
    kills sbatch's whole process group; submitit then raises, and the points fail, saying why."""

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        command = super()._make_submission_command(submission_file_path)
        if shutil.which("timeout") is None:
            return command
        return ["timeout", "--kill-after=5", str(SBATCH_TIMEOUT_S), *command]


def sbatch_failure(exc: Exception) -> str:
    """One line saying why an sbatch call failed: its own error, or that it never answered."""
    code = getattr(exc.__cause__, "returncode", None)
    if code in (124, 137):
        return f"sbatch did not answer within {SBATCH_TIMEOUT_S} s (is the Slurm controller up?)"
    text = " ".join(str(exc).split())[:2000]
    return f"sbatch failed: {text or f'exit status {code}'}"


# SlurmExecutor parameters that are not sbatch options (submitit's _make_sbatch_string leaves them out)
SUBMITIT_ONLY = {"setup", "srun_args", "additional_parameters", "array_parallelism"}


def submissions(points: list[Point], profile: Profile) -> list[Submission]:
    """The sbatch calls that submit ``points``: one per (nodes, tasks per node, time limit), where
    the time limit is the point's timeout plus START_MARGIN_MIN, at most the profile's ``time``."""
    groups: dict[tuple[int, int, int], list[Point]] = defaultdict(list)
    gpn = profile.gpus_per_node
    for p in points:
        minutes = min(profile.time, math.ceil(p.timeout / 60) + START_MARGIN_MIN)
        groups[(p.nodes(gpn), p.tasks_per_node(gpn), minutes)].append(p)
    return [Submission(nodes, tasks, minutes, group) for (nodes, tasks, minutes), group in groups.items()]


def submit(
    points: list[Point], store: Store, profile: Profile, progress: Progress, hardware: str | None = None
) -> list[tuple[Point, str]]:
    """Submit ``points`` as one job array per (nodes, tasks per node, time limit); each record is
    priced on ``hardware`` (the experiment's profile), else on its node's device's, chosen there."""
    submitted: list[tuple[Point, str]] = []
    for job in submissions(points, profile):
        executor = TimedExecutor(folder=store.root / ".slurm" / "%j", max_num_timeout=0)
        executor.update_parameters(**job.parameters(profile))
        for p in job.points:
            store.queue(p.run_id, executor="slurm", slurm_job_id=None)
        try:
            with executor.batch():
                jobs = [
                    executor.submit(PointTask(str(store.root), p.to_json(), hardware)) for p in job.points
                ]
        except Exception as exc:  # sbatch rejected it: the points fail, the other groups go on
            message = sbatch_failure(exc)
            progress.note(f"{job.nodes} node(s) x {job.tasks_per_node} task(s): {message}")
            for p in job.points:
                store.finish(p.run_id, "failed", error=message)
            continue
        for p, submitted_job in zip(job.points, jobs, strict=True):
            store.annotate(p.run_id, slurm_job_id=submitted_job.job_id)
            submitted.append((p, submitted_job.job_id))
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


def job_states(job_ids: set[str]) -> tuple[dict[str, str], dict[str, str], bool]:
    """Job id -> Slurm state (squeue first, it knows live jobs; then sacct); job id -> squeue's
    reason; and whether squeue answered (if not, nothing may be concluded from a job's absence)."""
    if not job_ids:
        return {}, {}, True
    mains = sorted({j.split("_")[0] for j in job_ids})
    states: dict[str, str] = {}
    reasons: dict[str, str] = {}
    acct = _run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(mains)])
    # all of the user's jobs, not -j: squeue fails on ids it has already forgotten
    queue = _run(["squeue", "-h", "-r", "-t", "all", "-o", "%i %T %r", "-u", getpass.getuser()])
    for text, sep in ((acct, "|"), (queue, " ")):
        for line in (text or "").splitlines():
            job, _, rest = line.strip().partition(sep)
            state, _, reason = rest.strip().partition(" ")
            for jid in _expand(job):
                states[jid] = state.split()[0] if state else "UNKNOWN"
                if text is queue:
                    reasons[jid] = reason.strip()
    return states, reasons, queue is not None


def watch(submitted: list[tuple[Point, str]], store: Store, profile: Profile, progress: Progress) -> None:
    """Poll until every point has a final status (or ``wait_timeout``: the jobs keep going)."""
    open_points = {p.run_id: (p, job) for p, job in submitted}
    gone: dict[str, float] = {}
    deadline = time.monotonic() + profile.wait_timeout
    while open_points:
        states, reasons, answered = job_states({job for _, job in open_points.values()})
        for rid, (point, job) in list(open_points.items()):
            state = states.get(job, "UNKNOWN")
            status = store.state(rid)
            if status not in FINAL_STATUSES:
                status = _conclude(store, rid, job, state, answered, gone, reasons.get(job, ""))
            if status in FINAL_STATUSES:
                del open_points[rid]
                _copy_logs(store, rid, job)
                progress.finished(status, f"{point.label}  job {job}")
        running = sum(states.get(job) == "RUNNING" for _, job in open_points.values())
        queued = len(open_points) - running
        progress.update(running, f"{queued} queued" if open_points else "")
        if not open_points or time.monotonic() > deadline:
            break
        time.sleep(profile.poll)
    if open_points:
        ids = " ".join(sorted({j.split("_")[0] for _, j in open_points.values()}))
        progress.note(
            f"stopped watching after {profile.wait_timeout:.0f} s; jobs {ids} go on and record their "
            f"own status (`tspbench status {store.root}`; `scancel {ids}` stops them)"
        )
    progress.close()


def _conclude(
    store: Store, rid: str, job: str, state: str, answered: bool, gone: dict[str, float], reason: str = ""
) -> str | None:
    """A job that ended (or vanished) without recording a status gets one from its Slurm state;
    one pending for a reason that never clears is cancelled and ``failed`` now."""
    if state == "PENDING" and never_starts(reason):
        _run(["scancel", job])
        error = f"Slurm job {job} can never start: pending ({reason}); cancelled"
        store.finish(rid, "failed", error=error, slurm_state=state, slurm_reason=reason)
        return store.state(rid)
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
            store.write_log(rid, f"slurm-{path.name}", _tail(path))


def run_slurm(
    points: list[Point], store: Store, profile: Profile, progress: Progress, hardware: str | None = None
) -> None:
    """Submit the points that are not already queued or running in Slurm, then watch them all."""
    _require_slurm()
    listed = {p.run_id: (store.status(p.run_id) or {}).get("slurm_job_id") for p in points}
    states, _, _ = job_states({j for j in listed.values() if j})
    live = [(p, listed[p.run_id]) for p in points if states.get(listed[p.run_id] or "", "") in ACTIVE]
    fresh = [p for p in points if p.run_id not in {q.run_id for q, _ in live}]
    for p, job in live:
        progress.note(f"still in Slurm as job {job}: {p.run_id} (not resubmitted)")
    watch(live + submit(fresh, store, profile, progress, hardware), store, profile, progress)


def _tail(path: Path, limit: int = 200_000) -> str:
    """The last ``limit`` bytes of a task log, read from there (a log may be gigabytes)."""
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, 2) - limit))
        return f.read(limit).decode(errors="replace")
