"""The results store: one folder per point, written so that nothing is ever lost or half-written.

    results/<experiment>/
        records.csv, records.parquet      every point, one row each (``write_tables``)
        experiment.json                   the file, --set overrides and executor of the last run
        .slurm/<job id>/                  submitit's pickles and task logs (slurm executor)
        <run_id>/
            point.json    the resolved point (what ran; its hash is the run id)
            env.json      the environment record of the attempt that ran it
            status.json   pending|running|completed|oom|failed|timeout|cancelled, timestamps,
                          attempt count, error excerpt, executor details (Slurm job id), and
                          the running attempt's owner: pid, host, process start time
            result.json   the flat record (bench's schema), once the point has finished
            logs/         full error text per attempt and rank, copies of Slurm task logs
            .lock         the empty file every status change flocks (``locked``)

Every file is written to a temporary name, fsynced and renamed over the old one, so a kill
leaves the old file or the new one, never a torn one; files get the mode a plain open() would
give them (0644 under the usual umask). A folder whose files do not parse is damaged
(tspbench.sweep.damage): reported by path, never silently skipped or overwritten. Several
processes may write one run folder (the ranks of a Slurm job, the sweep that watches it): each
status change is a read-modify-write under an exclusive ``flock`` (``locked``), and the rules below make
the first final word stick. Status moves: pending -> running -> a final status; ``queue`` moves
any non-completed status back to pending (a rerun). A completed point is never touched again.
A point stored as running whose owner on this host is gone (a SIGKILLed sweep) reads
``interrupted`` in status and the tables (``shown_status``); that is never stored.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from tspbench.core.errors import UsageError
from tspbench.core.files import FILE_MODE, read_input_text, write_atomic
from tspbench.core.names import FINAL_STATUSES, INTERRUPTED
from tspbench.core.units import excerpt
from tspbench.sweep.damage import DamagedResults, RunFiles, quarantine, read_run
from tspbench.sweep.owner import ELSEWHERE, GONE, owner_state, this_process

LOCK_TIMEOUT_S = 30.0
TABLES = ("records.csv", "records.parquet")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=1, default=str) + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(read_input_text(path))  # a regular file of bounded size (#45)
    except (OSError, ValueError, UsageError):
        return None


def exclusive(path: Path, content: Any, abandoned: Callable[[], bool]) -> bool:
    """Create ``path`` holding ``content`` (JSON) if no one holds it: O_EXCL, so exactly one
    process across the machine (or a shared file system) wins. A holder that ``abandoned()``
    says is gone is removed and the claim retried once. True if this call holds it now."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if abandoned():
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            return False
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(content) + "\n")
        return True
    return False


@contextlib.contextmanager
def locked(folder: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold ``folder/.lock`` for a read-modify-write: an exclusive ``flock`` on a file that is
    never removed. The kernel drops the lock when its holder's file closes or the holder dies,
    so a killed writer cannot leave the folder locked and no one ever judges a lock stale (a
    stale-lock takeover races: two waiters can both judge one holder gone and both enter).
    Linux carries flock over NFS as a POSIX lock, so writers on several hosts exclude too."""
    fd = os.open(folder / ".lock", os.O_CREAT | os.O_RDWR, FILE_MODE)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{folder / '.lock'} held for more than {timeout:.0f} s") from None
                time.sleep(0.002)
        yield
    finally:
        os.close(fd)  # closing the file releases the lock


class Store:
    """The run folders of one experiment under ``root`` (``results/<experiment>``)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def run_dir(self, run_id: str) -> Path:
        return self.root / run_id

    def status(self, run_id: str) -> dict[str, Any] | None:
        return read_json(self.run_dir(run_id) / "status.json")

    def state(self, run_id: str) -> str | None:
        status = self.status(run_id)
        return status["status"] if status else None

    def needs_run(self, run_id: str, retry_failed: bool = False) -> bool:
        """Not completed, and not finished at all unless ``retry_failed``; damaged: always."""
        if self.problems(run_id):
            return True
        state = self.state(run_id)
        return state != "completed" and (retry_failed or state not in FINAL_STATUSES)

    def problems(self, run_id: str) -> list[str]:
        """What is wrong with the run folder's files, one "PATH: problem" each (empty: nothing)."""
        return read_run(self.run_dir(run_id)).problems

    def quarantine(self, run_id: str) -> Path:
        """Move a damaged folder's point, status and result files aside; returns where to."""
        return quarantine(self.run_dir(run_id))

    def prepare(self, point: dict[str, Any]) -> None:
        """Create the run folder with point.json and a pending status (kept if already there)."""
        run = self.run_dir(point["run_id"])
        (run / "logs").mkdir(parents=True, exist_ok=True)
        if not (run / "point.json").exists():
            write_json(run / "point.json", point)
        self.update(point["run_id"], lambda s: None if s else {"status": "pending", "attempt": 0})

    def update(self, run_id: str, change: Callable[[dict[str, Any] | None], dict[str, Any] | None]) -> bool:
        """Read-modify-write status.json under the lock; ``change`` returns None to leave it."""
        run = self.run_dir(run_id)
        with locked(run):
            old = read_json(run / "status.json")
            new = change(dict(old) if old else None)
            if new is None:
                return False
            new.setdefault("created", (old or {}).get("created", now()))
            write_json(run / "status.json", {"run_id": run_id, **new, "updated": now()})
            return True

    def queue(self, run_id: str, **info: Any) -> bool:
        """Back to pending for a (re)run: anything but a completed point."""

        def change(s: dict[str, Any] | None) -> dict[str, Any] | None:
            if s and s["status"] == "completed":
                return None
            s = s or {"attempt": 0}
            return {**s, **info, "status": "pending", "error": None, "queued": now()}

        return self.update(run_id, change)

    def start(self, run_id: str, **info: Any) -> int | None:
        """pending -> running, attempt + 1; the new attempt, or None if not pending. The calling
        process is recorded as the point's owner (tspbench.sweep.owner), so a point whose
        owner died without a final word reads as interrupted, not as running forever."""
        attempt: list[int] = []

        def change(s: dict[str, Any] | None) -> dict[str, Any] | None:
            if s is None or s["status"] != "pending":
                return None
            attempt.append(s.get("attempt", 0) + 1)
            return {
                **s,
                **this_process(),
                **info,
                "status": "running",
                "attempt": attempt[0],
                "started": now(),
                "finished": None,
            }

        self.update(run_id, change)
        return attempt[0] if attempt else None

    def annotate(self, run_id: str, **info: Any) -> None:
        """Add fields (a Slurm job id) without changing the status."""
        self.update(run_id, lambda s: {**(s or {"status": "pending", "attempt": 0}), **info})

    def finish(self, run_id: str, status: str, record: dict[str, Any] | None = None, **info: Any) -> bool:
        """The final word on a pending or running point; False if another writer had it first.

        ``record`` (bench's flat record) goes to result.json before status.json names the
        outcome, so a completed status always has its result.
        """
        if status not in FINAL_STATUSES:
            raise ValueError(f"final status must be one of {FINAL_STATUSES}, got {status!r}")
        run = self.run_dir(run_id)
        with locked(run):
            old = read_json(run / "status.json") or {"status": "pending", "attempt": 0}
            if old["status"] not in ("pending", "running"):
                return False
            if record is not None:
                write_json(run / "result.json", {**record, "status": status})
            error = info.pop("error", None) or (record or {}).get("error")
            new = {**old, **info, "status": status, "error": excerpt(error) if error else None}
            write_json(run / "status.json", {"run_id": run_id, **new, "finished": now(), "updated": now()})
            return True

    def write_env(self, run_id: str, env: dict[str, Any]) -> None:
        write_json(self.run_dir(run_id) / "env.json", env)

    def write_log(self, run_id: str, name: str, text: str) -> Path:
        """A log file of its own per writer (attempt, rank), so writers never share one."""
        path = self.run_dir(run_id) / "logs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
        return path


# ----------------------------------------------------------------------------- reading back


# What each kind of sweep writes, as a folder's records are called (point.json's config.method)
KINDS = {"measure": "measured", "fake": "fake-world", "predict": "projected"}


def mixing_problem(root: Path, method: str) -> str | None:
    """Why a sweep of ``method`` must not write into the study folder ``root``: it holds records
    of another kind (measured beside projected or fake-world ones, which its tables and figures
    would draw as one study), or None. Unreadable run folders are the sweep's to report."""
    held: dict[str, int] = {}
    for path in sorted(root.glob("*/point.json")) if root.is_dir() else []:
        try:
            kind = json.loads(path.read_text())["config"].get("method", "measure")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        held[kind] = held.get(kind, 0) + 1
    other = {k: n for k, n in held.items() if k != method}
    if not other:
        return None
    what = " and ".join(f"{n} {KINDS.get(k, k)}" for k, n in sorted(other.items()))
    return (
        f"{root} holds {what} records; a {KINDS[method]} sweep would mix with them: give --results "
        f"ANOTHER_ROOT or --set name=ANOTHER_NAME"
    )


def _experiment_dirs(path: Path) -> list[Path]:
    """``path`` itself if it holds run folders, else its sub-folders that do."""

    def holds_runs(folder: Path) -> bool:
        return any(any(folder.glob(f"*/{name}")) for name in ("point.json", "status.json"))

    if holds_runs(path):
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and holds_runs(p))


def results_folder(path: str | Path) -> Path:
    """``path`` if it is a folder; else UsageError saying what it is instead."""
    path = Path(path)
    if path.is_file():
        raise UsageError(
            f"{path}: is a file, not a results folder (give results/<experiment> or a results root)"
        )
    if not path.is_dir():
        raise UsageError(f"{path}: no such results folder")
    if (path / "point.json").is_file():  # status/report of one point would find "no points"
        raise UsageError(
            f"{path}: is one point's run folder, not a results folder; give its study folder {path.parent}"
        )
    return path


def point_row(point: dict[str, Any]) -> dict[str, Any]:
    """A point's identifying fields, flat: run id, layout, workload, model name and shape."""
    config = point["config"]
    model = config["model"]
    return {
        "experiment": point["experiment"],
        "run_id": point["run_id"],
        "index": point.get("index"),
        "method": config.get("method", "measure"),
        "hardware": config.get("hardware"),
        **config["layout"],
        "world_size": point.get("world_size"),
        "model": model.get("name"),
        **{f"model_{k}": v for k, v in model.items() if k != "name"},
        **config["workload"],
        **config["measure"],
        "timeout": point.get("timeout"),
    }


def shown_status(status: dict[str, Any]) -> tuple[str, str | None]:
    """(status, error) as status and the tables show them: a running point whose owner on this
    host is gone is ``interrupted`` (it never got a final word; ``run`` runs it again), and one
    running on another host says where."""
    state, error = status["status"], status.get("error")
    if state != "running":
        return state, error
    owner, pid, host = owner_state(status), status.get("pid"), status.get("host")
    if owner == GONE:
        return (
            INTERRUPTED,
            f"interrupted: its process (pid {pid} on {host}) is gone; `tspbench run` runs it again",
        )
    if owner == ELSEWHERE and not error:
        return state, f"running on {host} (pid {pid}): not checked from {socket.gethostname()}"
    return state, error


def _row(files: RunFiles) -> dict[str, Any]:
    status = files.status or {"status": "pending", "attempt": 0}
    result = files.result or {}
    if result.get("status") != status["status"]:  # an older attempt's record, not this outcome
        result = {}
    state, error = shown_status(status)
    return {
        **point_row(files.point or {}),
        **result,
        "status": state,
        "attempt": status.get("attempt", 0),
        "error": error,
        "started": status.get("started"),
        "finished": status.get("finished"),
        "slurm_job_id": status.get("slurm_job_id"),
    }


def load(path: str | Path, damaged: list[RunFiles] | None = None) -> pd.DataFrame:
    """Every point under ``path`` (an experiment folder, or a results root of several) as one
    DataFrame, one row per point: completed points with their record, the others with their
    status and error (their measurement columns empty).

    A damaged run folder raises DamagedResults naming it, unless ``damaged`` is given: then it
    is appended there and left out of the frame.
    """
    path = results_folder(path)
    rows, bad = [], []
    for exp in _experiment_dirs(path):
        for run in sorted(p for p in exp.iterdir() if p.is_dir()):
            files = read_run(run)
            if files.problems:
                bad.append(files)
            elif files.point is not None:
                rows.append(_row(files))
    if bad and damaged is None:
        raise DamagedResults(bad)
    if damaged is not None:
        damaged.extend(bad)
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame = frame.sort_values(["experiment", "index", "run_id"], kind="stable").reset_index(drop=True)
    return frame


def write_tables(experiment_dir: str | Path, damaged: list[RunFiles] | None = None) -> pd.DataFrame:
    """load() and write records.csv and records.parquet next to the run folders, each atomically
    under a temporary name of its own (two writers at once never share one)."""
    root = Path(experiment_dir)
    frame = load(root, damaged)
    write_atomic(root / "records.csv", frame.to_csv(index=False))
    parquet = io.BytesIO()
    frame.to_parquet(parquet, index=False)
    write_atomic(root / "records.parquet", parquet.getvalue())
    return frame
