"""The environment record stored with every result: what ran, where, on which code."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

import torch

import tspbench

SLURM_VARS = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_NNODES",
    "SLURM_NTASKS",
    "SLURM_JOB_PARTITION",
)


def git_state(root: Path | None = None) -> tuple[str | None, bool | None]:
    """(sha, dirty) of the checkout tspbench runs from; (None, None) outside git. Dirty: a tracked
    file differs from the commit outside results/ (the records a sweep writes as it runs)."""
    root = root or Path(tspbench.__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        return sha, bool(dirty)
    except (OSError, subprocess.SubprocessError):
        return None, None


def device_name(device: str) -> str:
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return platform.processor() or platform.machine()


def environment(device: str | None = None) -> dict[str, object]:
    """A flat record: versions (tspbench's names the commit: tspbench.version), git state, host,
    device, backend, Slurm job if any."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    sha, dirty = git_state()
    record: dict[str, object] = {
        "tspbench_version": tspbench.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "git_sha": sha,
        "git_dirty": dirty,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "device": device,
        "device_name": device_name(device),
        "device_count": torch.cuda.device_count() if device == "cuda" else 1,
        "backend": "nccl" if device == "cuda" else "gloo",
        "cuda_version": torch.version.cuda,
        "hip_version": getattr(torch.version, "hip", None),
        "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    record.update({var.lower(): os.environ.get(var) for var in SLURM_VARS})
    return record


def record_fields(env: Mapping[str, object]) -> dict[str, object]:
    """``env`` as a result record's flat ``env_<key>`` columns, as every executor stores them
    (measured, fake, projected); a nested value (a projection's hardware profile) stays in
    the run folder's env.json."""
    return {f"env_{k}": v for k, v in env.items() if not isinstance(v, (dict, list))}
