"""A sweep through the ``slurm`` executor on a real one-host Slurm cluster (two fake nodes).

The cluster (``tools.slurm_local``, with accounting) is started for this module and torn
down after it; without Slurm (no apt, not root, not Linux) the module is skipped with the
reason. One sweep, run by the real CLI as a subprocess with the ``local`` cluster profile
(2 ranks per node), covers: a 1-node x 2-task point and a 2-node x 2-task point (world 4)
completing, points of one shape going out as one job array, a rank that raises (``failed``, the
job ends at once through srun's kill-on-bad-exit), a point over the simulated capacity
(``oom``), a hanging point that the test cancels with scancel (``cancelled``), and a second
sweep on the same results folder refused while the first runs. Then: a world larger than the
cluster refused by ``--dry-run`` from sinfo's node count, and a job that can never start
(pending for PartitionNodeLimit) cancelled and recorded ``failed`` at once.
Run: ``pytest -m slurm tests/sweep/test_slurm.py -v -s`` (``-s`` shows the measured times).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import fault_plugin
import pytest
import yaml
from slurm_cluster import running_cluster

from tools.slurm_local import LocalSlurmCluster
from tspbench.core.progress import Progress
from tspbench.sweep import slurm
from tspbench.sweep.cluster import load_profile
from tspbench.sweep.experiment import load_experiment
from tspbench.sweep.points import expand
from tspbench.sweep.run import select
from tspbench.sweep.store import Store, load, read_json

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SWEEP_TIMEOUT_S = 300.0
LAYOUTS = [
    {"strategy": "dp", "dp": 2},  # 1 node x 2 tasks
    {"strategy": "tp", "tp": 4},  # 2 nodes x 2 tasks
    {"strategy": "fault_raise", "dp": 2},  # rank 1 raises -> failed
    {"strategy": "dp", "dp": 2},  # capacity 1 MiB -> oom
    {"strategy": "fault_hang", "dp": 2},  # hangs until the test cancels it
]
EXPECTED = ["completed", "completed", "failed", "oom", "cancelled"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurmCluster]:
    with running_cluster(tmp_path_factory, "slurm sweep") as cluster:
        yield cluster


def _experiment(tmp_path: Path) -> Path:
    data = {
        "name": "slurm_sweep",
        "model": {"preset": "tiny"},
        "settings": {"seq_len": 256, "dtype": "float32", "device": "cpu"},
        "sweep": {"zip": [{"layout": LAYOUTS, "capacity": [None, None, None, "1MiB", None]}]},
        "run": {"warmup": 0, "steps": 1, "timeout": 240},
        "executor": "slurm",
        "cluster": "local",
    }
    path = tmp_path / "slurm_sweep.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _when_hanging(root: Path, proc: subprocess.Popen) -> str:
    """Wait for the hanging point's job to start; returns the job id."""
    deadline = time.monotonic() + SWEEP_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        for status_file in root.glob("*/status.json"):
            point = read_json(status_file.parent / "point.json") or {}
            status = read_json(status_file) or {}
            hangs = point.get("config", {}).get("layout", {}).get("strategy") == "fault_hang"
            if hangs and status.get("status") == "running" and status.get("slurm_job_id"):
                return status["slurm_job_id"]
        time.sleep(0.5)
    pytest.fail("the hanging point's job never started")


def test_sweep_through_slurm(cluster: LocalSlurmCluster, tmp_path: Path) -> None:
    env = {**fault_plugin.install(tmp_path / "plugin"), **cluster.env}
    results = tmp_path / "results"
    root = results / "slurm_sweep"
    cmd = [sys.executable, "-m", "tspbench", "run", str(_experiment(tmp_path)), "--results", str(results)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        cancelled_job = _when_hanging(root, proc)
        # a second sweep on the same results folder would run every point again: refused
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        cluster.run(["scancel", cancelled_job])
        out, _ = proc.communicate(timeout=SWEEP_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    print(f"[slurm sweep] sweep of {len(LAYOUTS)} points {time.monotonic() - t0:.1f} s\n{out}")
    assert second.returncode == 2 and "another sweep is running it" in second.stderr, second.stderr
    assert proc.returncode == 1, out  # failed and cancelled points: exit 1
    frame = load(root)
    errors = "\n".join(f"{r}: {e}" for r, e in zip(frame["run_id"], frame["error"], strict=True) if e)
    assert list(frame["status"]) == EXPECTED, f"{out}\n{errors}"

    jobs = list(frame["slurm_job_id"])
    assert jobs[4] == cancelled_job
    array = {j.split("_")[0] for j, n in zip(jobs, LAYOUTS, strict=True) if n.get("dp") == 2}
    assert len(array) == 1 and all("_" in jobs[i] for i in (0, 2, 3, 4))  # one array of 4
    assert frame.loc[0, "world_size"] == 2 and frame.loc[1, "world_size"] == 4
    assert frame.loc[1, "env_slurm_nnodes"] == "2" and frame.loc[1, "env_slurm_ntasks"] == "4"
    assert (frame.loc[:1, "peak_memory_bytes"] > 0).all() and frame.loc[:1, "loss"].notna().all()
    assert "rank 1 raised RuntimeError: injected fault on rank 1" in frame.loc[2, "error"]
    assert "OutOfMemoryError" in frame.loc[3, "error"]
    assert "CANCELLED" in frame.loc[4, "error"]
    nodes = cluster.run(["sacct", "-X", "-n", "-P", "-o", "NodeList", "-j", jobs[1]]).stdout.split()
    assert nodes == ["n[1-2]"], nodes
    run = root / frame.loc[1, "run_id"]
    assert (run / "env.json").is_file() and any((run / "logs").glob("slurm-*"))
    assert (root / "records.csv").is_file() and (root / "records.parquet").is_file()
    deadline = time.monotonic() + 60
    while cluster.job_ids() and time.monotonic() < deadline:  # nothing left running
        time.sleep(0.5)
    assert cluster.job_ids() == []
    assert os.path.isdir(root / ".slurm")


def test_a_world_larger_than_the_cluster_is_refused_by_sinfo(
    cluster: LocalSlurmCluster, tmp_path: Path
) -> None:
    """A profile that does not say how many nodes: sinfo's count of the partition decides."""
    profile = yaml.safe_load((Path(__file__).resolve().parents[2] / "slurm" / "local.yaml").read_text())
    profile.pop("nodes")
    (tmp_path / "unsized.yaml").write_text(yaml.safe_dump(profile))
    data = {"name": "big", "model": {"preset": "tiny"}, "settings": {"seq_len": 256, "device": "cpu"},
            "layout": {"strategy": "dp", "dp": 6}}  # fmt: skip
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(data))
    cmd = [sys.executable, "-m", "tspbench", "run", str(tmp_path / "big.yaml"), "--dry-run", "--cluster"]
    env = {**os.environ, **cluster.env}
    done = subprocess.run(
        [*cmd, str(tmp_path / "unsized.yaml")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "needs 6 ranks = 3 nodes of 2, but partition local (sinfo: 2 nodes) allows 2 nodes" in done.stderr


def test_a_job_that_can_never_start_fails_at_once(
    cluster: LocalSlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submitted past the size check (as a cluster shrunk after submitting would be): the job
    pends (PartitionNodeLimit or PartitionConfig), and the watcher cancels it and records
    failed within a poll."""
    for key, value in cluster.env.items():
        monkeypatch.setenv(key, value)
    data = {"name": "never", "model": {"preset": "tiny"}, "settings": {"seq_len": 256, "device": "cpu"},
            "layout": {"strategy": "dp", "dp": 6}, "run": {"timeout": 120}}  # fmt: skip
    (tmp_path / "never.yaml").write_text(yaml.safe_dump(data))
    points, _ = expand(load_experiment(tmp_path / "never.yaml"))
    store = Store(tmp_path / "results" / "never")
    select(points, store, False)
    t0 = time.monotonic()
    slurm.run_slurm(points, store, load_profile("local"), Progress())
    elapsed = time.monotonic() - t0
    status = store.status(points[0].run_id)
    print(f"[slurm sweep] a job that can never start: failed after {elapsed:.1f} s")
    assert (
        status["status"] == "failed" and "can never start: pending (Partition" in status["error"]
    )  # NodeLimit, Config
    assert elapsed < 60  # not the profile's wait_timeout (900 s)
    deadline = time.monotonic() + 30
    while cluster.job_ids() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cluster.job_ids() == []  # cancelled, not left pending
