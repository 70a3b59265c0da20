"""Whether this host can run the local cluster, and installing what it needs (apt-get) if not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

APT_PACKAGES = ("slurm-wlm", "munge", "slurmdbd", "mariadb-server")
# Binaries the cluster runs; a missing one means the packages above are not (fully) installed.
REQUIRED_BINARIES = (
    "slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "mariadb-install-db",
    "sinfo", "squeue", "sbatch", "srun", "scancel", "sacct", "scontrol",
)  # fmt: skip
# /usr/sbin is often not on a non-root PATH, but the daemons live there.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin"])


def which(name: str) -> str | None:
    """Find a binary, also in the sbin folders a non-root PATH leaves out."""
    return shutil.which(name, path=SEARCH_PATH)


def missing_binaries() -> list[str]:
    """Names of required Slurm/munge/MariaDB binaries that are not installed."""
    return [name for name in REQUIRED_BINARIES if which(name) is None]


def ensure_installed() -> str | None:
    """Install Slurm, munge, slurmdbd and MariaDB with apt if needed.

    Returns None when a cluster can be started, else a one-line reason, so a test can
    ``pytest.skip(reason)`` instead of failing on machines that cannot run Slurm.
    """
    if not sys.platform.startswith("linux"):
        return f"a local Slurm cluster needs Linux, not {sys.platform}"
    if missing_binaries():
        reason = _apt_install(APT_PACKAGES)
        if reason is not None:
            return reason
        still = missing_binaries()
        if still:
            return f"Slurm binaries still missing after apt-get install: {', '.join(still)}"
    if os.geteuid() != 0:
        return "a local Slurm cluster runs slurmd/slurmstepd as root; run the tests as root"
    return None


def _apt_install(packages: Sequence[str]) -> str | None:
    """apt-get install; only on failure refresh the package lists and retry (saves ~10 s)."""
    apt = which("apt-get")
    if apt is None:
        return "Slurm is not installed and there is no apt-get to install it"
    prefix: list[str] = []
    if os.geteuid() != 0:
        sudo = which("sudo")
        if sudo is None:
            return "Slurm is not installed and installing it needs root (no sudo)"
        prefix = [sudo, "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*prefix, apt, "install", "-y", "-q", "--no-install-recommends", *packages]
    if _quiet_run(install, env) == 0:
        return None
    if _quiet_run([*prefix, apt, "update", "-q"], env) != 0:
        return "apt-get update failed; cannot install Slurm"
    if _quiet_run(install, env) != 0:
        return f"apt-get install {' '.join(packages)} failed"
    return None


def _quiet_run(cmd: list[str], env: dict[str, str]) -> int:
    """Run a command without output; a hang (e.g. apt lock) counts as failure."""
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 1
    return done.returncode
