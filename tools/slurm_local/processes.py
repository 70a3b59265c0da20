"""The host's Slurm, munge and MariaDB processes: which live, which belong to a cluster, and
stopping one (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

# Process names that belong to a Slurm cluster; used by tests to check that nothing is left.
PROCESS_NAMES = (
    "slurmctld", "slurmscriptd", "slurmd", "slurmdbd", "slurmstepd", "munged", "mariadbd",
)  # fmt: skip


def pid_alive(pid: int) -> bool:
    """True if the process runs; a zombie counts as gone (some container inits never reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def live_slurm_processes() -> list[tuple[int, str]]:
    """(pid, name) of every live Slurm/munge/MariaDB process on the host, zombies excluded."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            name = (proc / "comm").read_text().strip()
        except OSError:
            continue
        if name in PROCESS_NAMES and pid_alive(int(proc.name)):
            found.append((int(proc.name), name))
    return found


def read_pid(pid_file: Path) -> int:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return -1


def terminate(pid: int, timeout: float, proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM, wait up to ``timeout`` (reaping our own children), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        end = time.monotonic() + wait
        while time.monotonic() < end:
            if proc is not None and proc.poll() is not None:
                return
            if not pid_alive(pid):
                return
            time.sleep(0.05)


def cluster_processes(conf: str) -> Iterator[tuple[int, str]]:
    """Live (pid, name), not ours, of daemons/steps/tasks whose environment names ``conf``."""
    marker = f"SLURM_CONF={conf}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            name = (proc / "comm").read_text().strip()
        except OSError:
            continue
        if marker not in environ or not pid_alive(int(proc.name)):
            continue
        is_job = any(v.startswith(b"SLURM_JOB_ID=") for v in environ)
        if name in PROCESS_NAMES or is_job:
            yield int(proc.name), name
