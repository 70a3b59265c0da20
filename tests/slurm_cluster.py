"""The local Slurm cluster the Slurm test modules share (a plain module: both tests/ and
benchmarks/ have a conftest, so neither can be imported by name)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tools.slurm_local import LocalSlurmCluster, ensure_installed


@contextmanager
def running_cluster(tmp_path_factory: pytest.TempPathFactory, label: str) -> Iterator[LocalSlurmCluster]:
    """A real two-node local Slurm cluster for one test module (skipped where Slurm cannot run),
    stopped afterwards; start and teardown times are printed (seen with ``-s``)."""
    t0 = time.monotonic()
    reason = ensure_installed()
    if reason is not None:
        pytest.skip(reason)
    t1 = time.monotonic()
    cluster = LocalSlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=2, cpus_per_node=8)
    cluster.start()
    print(f"\n[{label}] ensure_installed {t1 - t0:.1f} s, start {time.monotonic() - t1:.1f} s")
    try:
        yield cluster
    finally:
        t2 = time.monotonic()
        cluster.stop()
        print(f"[{label}] teardown {time.monotonic() - t2:.1f} s")
