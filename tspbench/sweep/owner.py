"""Who runs a point, and whether it still does: the owner a status file records.

A sweep killed with SIGKILL (or a crashed host) never writes a final status, so its point stays
``running`` on disk. The process that starts a point records itself (``this_process``): its
pid, its host, and its start time (``/proc/<pid>/stat`` field 22, clock ticks after boot), so
that a pid the kernel has since given to another process is not taken for the owner.
``owner_state`` then tells, from this host, whether that process is still there. A process
on another host cannot be checked from here and is left as it is.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

ALIVE, GONE, ELSEWHERE, UNKNOWN = "alive", "gone", "elsewhere", "unknown"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, ValueError, OverflowError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3 on), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return text.rpartition(")")[2].split()


def process_start(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot (field 22); None without /proc."""
    fields = _stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def this_process() -> dict[str, Any]:
    """The owner fields a status file records for the calling process."""
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "pid_start": process_start(pid)}


def owner_state(record: dict[str, Any]) -> str:
    """ALIVE, GONE (this host, and the process has exited, is a zombie or its pid now names a
    later process), ELSEWHERE (another host), or UNKNOWN (no owner recorded)."""
    pid, host = record.get("pid"), record.get("host")
    if not isinstance(pid, int) or isinstance(pid, bool) or not host:
        return UNKNOWN
    if host != socket.gethostname():
        return ELSEWHERE
    if not pid_alive(pid):
        return GONE
    fields = _stat(pid)
    if fields is None:  # no /proc here: the pid is all there is to go on
        return ALIVE
    zombie = fields[0] in ("Z", "X")
    recycled = record.get("pid_start") is not None and process_start(pid) != record["pid_start"]
    return GONE if zombie or recycled else ALIVE
