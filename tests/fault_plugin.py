"""A strategy plugin that misbehaves on purpose, installed for one test into a temporary folder.

Faults must happen inside the ranks, which are other processes (forkserver children, Slurm
tasks), so a strategy registered in the test process would not reach them. This writes a tiny
*installed* distribution (a module plus a ``.dist-info`` with a ``tspbench.strategies`` entry
point, the same path third-party strategies take) and returns the environment that puts it on
``PYTHONPATH``; every process started with that environment (the CLI, its ranks, Slurm jobs)
sees two extra strategies, both data parallel otherwise:

    fault_raise   rank 1 raises RuntimeError("injected fault on rank 1") while building
    fault_hang    every rank sleeps for an hour while building (for cancel and timeout tests)
"""

from __future__ import annotations

import os
from pathlib import Path

MODULE = """
import time

from tspbench.strategies.dp import DataParallel


class RaisingDP(DataParallel):
    name = "fault_raise"

    def build(self):
        if self.mesh.rank == 1:
            raise RuntimeError("injected fault on rank 1")
        return super().build()


class HangingDP(DataParallel):
    name = "fault_hang"

    def build(self):
        time.sleep(3600)
        return super().build()
"""

ENTRY_POINTS = """[tspbench.strategies]
fault_raise = tspbench_fault_plugin:RaisingDP
fault_hang = tspbench_fault_plugin:HangingDP
"""


def install(folder: Path) -> dict[str, str]:
    """Write the plugin under ``folder``; returns os.environ plus PYTHONPATH pointing at it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tspbench_fault_plugin.py").write_text(MODULE)
    info = folder / "tspbench_fault_plugin-0.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tspbench-fault-plugin\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}
