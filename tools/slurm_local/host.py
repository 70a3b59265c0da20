"""What the cluster takes from the host: free TCP ports, and its fake node names in /etc/hosts."""

from __future__ import annotations

import contextlib
import fcntl
import socket
from collections.abc import Callable, Sequence
from pathlib import Path

HOSTS_FILE = Path("/etc/hosts")
_HOSTS_TAG = "# tspbench slurm_local"


def free_ports(count: int) -> list[int]:
    """Ports the kernel reports free right now, so clusters under other roots do not collide.

    All sockets are held open together so the ports are distinct. There is a small race until
    the daemons bind them, which is acceptable for tests.
    """
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def add_host_names(names: Sequence[str], root: Path, hosts: Path = HOSTS_FILE) -> None:
    """Make ``names`` resolve to 127.0.0.1: one line in ``hosts`` tagged with the cluster's
    root (a restart replaces it, never adds a second; clusters under other roots keep theirs)."""
    tag = f"{_HOSTS_TAG} {root}"
    line = f"127.0.0.1 {' '.join(names)} {tag}"
    _edit_hosts(hosts, lambda lines: [*(ln for ln in lines if not ln.endswith(tag)), line])


def remove_host_names(root: Path, hosts: Path = HOSTS_FILE) -> None:
    """Remove the line ``add_host_names`` wrote for ``root`` (nothing else is touched)."""
    tag = f"{_HOSTS_TAG} {root}"
    _edit_hosts(hosts, lambda lines: [ln for ln in lines if not ln.endswith(tag)])


def _edit_hosts(hosts: Path, change: Callable[[list[str]], list[str]]) -> None:
    """Rewrite ``hosts`` in place under an exclusive flock (several clusters may start at once).
    In place, not renamed over: in containers /etc/hosts is often a bind mount."""
    with hosts.open("r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        lines = f.read().splitlines()
        new = change(lines)
        if new != lines:
            f.seek(0)
            f.write("".join(f"{ln}\n" for ln in new))
            f.truncate()


def port_open(port: int) -> bool:
    """True once a daemon accepts TCP connections on 127.0.0.1:port."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False
