"""End-to-end tests on a real one-host Slurm cluster (two fake nodes, with accounting).

The cluster is started once for the module by ``LocalSlurmCluster`` in a temporary folder; the
tests are skipped with the reason from ``ensure_installed()`` where Slurm cannot run (no apt,
not root, not Linux). Every wait has a timeout, so a broken cluster fails instead of hanging.
Run: ``pytest -m slurm tests/project/test_slurm_local.py -v -s`` (``-s`` shows the measured times).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster import running_cluster

import tools.slurm_local
from tools.slurm_local import LocalSlurmCluster
from tools.slurm_local.host import add_host_names, remove_host_names
from tools.slurm_local.processes import PROCESS_NAMES
from tools.slurm_local.smoke import smoke_allreduce

submitit = pytest.importorskip("submitit")

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(tools.slurm_local.__file__).resolve().parents[2]
JOB_TIMEOUT_S = 120.0
STATE_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurmCluster]:
    """One cluster for the module; clients reach it through os.environ like a user's code."""
    with running_cluster(tmp_path_factory, "slurm") as cluster:
        saved = {k: os.environ.get(k) for k in cluster.env}
        os.environ.update(cluster.env)
        try:
            yield cluster
        finally:
            _restore(saved)


def _restore(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _executor(folder: Path, cluster: LocalSlurmCluster, **params: object) -> submitit.AutoExecutor:
    """AutoExecutor on the local cluster; PYTHONPATH makes ``tspbench`` importable in the job
    even when the package is not installed and the job starts in another folder."""
    executor = submitit.AutoExecutor(folder=folder / "%j", cluster="slurm")
    setup = [f"export PYTHONPATH={REPO}${{PYTHONPATH:+:$PYTHONPATH}}"]
    executor.update_parameters(
        slurm_partition=cluster.partition,
        slurm_setup=setup,
        timeout_min=5,
        **params,
    )
    return executor


def _wait_done(job: submitit.Job, timeout: float) -> None:
    """job.wait() has no timeout: poll done() and cancel + fail with the job's logs on expiry."""
    deadline = time.monotonic() + timeout
    while not job.done():
        if time.monotonic() > deadline:
            job.cancel(check=False)
            logs = "\n".join(str(t.stderr()) for t in job._sub_jobs or [job])
            pytest.fail(f"job {job.job_id} not done after {timeout} s:\n{logs}")
        time.sleep(0.5)


def _wait_state(job: submitit.Job, prefix: str, timeout: float) -> str:
    """Poll sacct (through submitit's watcher, forced) until the state starts with ``prefix``."""
    deadline = time.monotonic() + timeout
    state = "UNKNOWN"
    while time.monotonic() < deadline:
        state = job.get_info(mode="force").get("State") or "UNKNOWN"
        if state.startswith(prefix):
            return state
        time.sleep(0.5)
    pytest.fail(f"job {job.job_id} state {state!r}, expected {prefix}* within {timeout} s")


def test_node_names_go_into_the_hosts_file_once_and_leave_it_unchanged(tmp_path: Path) -> None:
    """No cluster needed: the lines start() and stop() add and remove, on a copy of a hosts file."""
    hosts = tmp_path / "hosts"
    original = "127.0.0.1 localhost\n::1 localhost ip6-localhost\n"
    hosts.write_text(original)
    add_host_names(["n1", "n2"], Path("/tmp/other"), hosts)  # another cluster's
    with_other = hosts.read_text()
    for _ in range(2):  # a restart replaces its line, never adds a second
        add_host_names(["n1", "n2"], Path("/tmp/ours"), hosts)
    lines = hosts.read_text().splitlines()
    assert lines[:2] == original.splitlines()
    assert sum(ln.startswith("127.0.0.1 n1 n2 ") for ln in lines) == 2  # ours and the other one
    remove_host_names(Path("/tmp/ours"), hosts)
    assert hosts.read_text() == with_other
    remove_host_names(Path("/tmp/other"), hosts)
    assert hosts.read_text() == original


def test_nodes_idle_and_clients_use_env(cluster: LocalSlurmCluster) -> None:
    assert cluster.node_states() == {"n1": "idle", "n2": "idle"}
    # a job's ranks meet at its first node by name (MASTER_ADDR): the fake names resolve
    assert [socket.gethostbyname(n) for n in cluster.node_names] == ["127.0.0.1", "127.0.0.1"]
    # A plain client with only os.environ (as updated by the fixture) reaches the cluster.
    out = subprocess.run(
        ["sinfo", "-h", "-o", "%P %D %c"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.split()
    assert out == [f"{cluster.partition}*", "2", "8"]


def test_submitit_2_nodes_4_tasks_allreduce(cluster: LocalSlurmCluster, tmp_path: Path) -> None:
    executor = _executor(tmp_path, cluster, nodes=2, tasks_per_node=2, cpus_per_task=1)
    t0 = time.monotonic()
    job = executor.submit(smoke_allreduce)
    _wait_done(job, JOB_TIMEOUT_S)
    results = sorted(job.results())
    print(f"\n[slurm] 2x2-task submitit job round trip {time.monotonic() - t0:.1f} s")
    assert results == [(rank, 4, 10.0) for rank in range(4)]
    state = _wait_state(job, "COMPLETED", STATE_TIMEOUT_S)
    assert state == "COMPLETED"
    nodelist = job.get_info(mode="cache").get("NodeList")
    assert nodelist == "n[1-2]"


def test_cancelled_job_reports_cancelled(cluster: LocalSlurmCluster, tmp_path: Path) -> None:
    executor = _executor(tmp_path, cluster, nodes=1, tasks_per_node=1)
    job = executor.submit(time.sleep, 600)
    _wait_state(job, "RUNNING", STATE_TIMEOUT_S)
    t0 = time.monotonic()
    job.cancel()
    state = _wait_state(job, "CANCELLED", STATE_TIMEOUT_S)
    print(f"\n[slurm] cancel -> CANCELLED in sacct {time.monotonic() - t0:.1f} s")
    assert job.state.startswith("CANCELLED")
    assert job.done()  # with accounting, submitit knows a cancelled job is finished
    sacct = cluster.run(["sacct", "-X", "-n", "-P", "-o", "State", "-j", job.job_id]).stdout
    assert sacct.startswith("CANCELLED"), (state, sacct)
    # The job really ends. It stays COMPLETING for ~7 s: submitit ignores SIGTERM, so
    # slurmstepd waits KillWait (2 s) for SIGKILL, then retries telling the dead srun (~5 s).
    deadline = time.monotonic() + STATE_TIMEOUT_S
    while cluster.job_ids() and time.monotonic() < deadline:
        time.sleep(0.3)
    print(f"[slurm] cancel -> queue empty {time.monotonic() - t0:.1f} s")
    assert cluster.job_ids() == []


def _pgrep_cluster(cluster: LocalSlurmCluster) -> list[str]:
    """pgrep every Slurm/munge/MariaDB name; keep live processes that belong to this cluster
    (other clusters on the host, e.g. one a developer brought up by hand, are not ours)."""
    ours = {pid for pid, _ in cluster.processes()}
    found = []
    for name in PROCESS_NAMES:
        out = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True, timeout=10)
        found += [f"{pid} {name}" for pid in map(int, out.stdout.split()) if pid in ours]
    return found


def test_stop_with_running_job_leaves_nothing(cluster: LocalSlurmCluster) -> None:
    """Runs last: stops the module's cluster while a 2-node job runs (fixture stop is a no-op)."""
    cluster.run(["sbatch", "-N2", "-n4", "-o", "/dev/null", "--wrap", "srun sleep 600"])
    deadline = time.monotonic() + STATE_TIMEOUT_S
    while "slurmstepd" not in [name for _, name in cluster.processes()]:
        assert time.monotonic() < deadline, "job never started"
        time.sleep(0.3)
    before = _pgrep_cluster(cluster)
    assert {line.split()[1] for line in before} >= {"slurmctld", "slurmd", "slurmstepd"}
    t0 = time.monotonic()
    cluster.stop()
    print(f"\n[slurm] stop with a running job {time.monotonic() - t0:.1f} s")
    assert _pgrep_cluster(cluster) == []
    assert cluster.processes() == []
    assert list(cluster.root.glob("run/*.pid")) == []
    assert str(cluster.root) not in cluster.hosts_file.read_text()  # its node names are gone too
