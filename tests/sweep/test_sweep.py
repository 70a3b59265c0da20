"""Local sweeps end to end through the real CLI (``python -m tspbench run``) as a subprocess.

Faults come from ``fault_plugin`` (a strategy plugin installed for the test, seen by the CLI and
its ranks through PYTHONPATH): a rank that raises is recorded ``failed`` with its traceback, a
point over the simulated capacity ``oom``, and the sweep goes on. A sweep killed with SIGKILL
after its first point resumes without redoing what was completed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fault_plugin
import pytest
import yaml

from tspbench.measure import schedstat
from tspbench.sweep import cluster, slurm, slurm_job
from tspbench.sweep.experiment import load_experiment
from tspbench.sweep.points import expand
from tspbench.sweep.store import Store, load, read_json

pytestmark = pytest.mark.slow  # multi-rank runs, sweeps or Slurm: make test, not make check

TIMEOUT_S = 180


def experiment(tmp_path: Path, name: str, layouts: list[dict], **zipped: list) -> Path:
    data = {
        "name": name,
        "model": {"preset": "tiny"},
        "settings": {"seq_len": 256, "dtype": "float32"},
        "sweep": {"zip": [{"layout": layouts, **zipped}]},
        "run": {"warmup": 0, "steps": 1, "timeout": 120},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tspbench(env: dict, *args: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tspbench", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def env(tmp_path: Path) -> dict:
    return fault_plugin.install(tmp_path / "plugin")


def statuses(root: Path) -> list[str]:
    return list(load(root)["status"])


def test_sweep_records_completed_failed_and_oom(tmp_path: Path, env: dict) -> None:
    layouts = [
        {"strategy": "dp", "dp": 2},
        {"strategy": "tsp", "tsp": 2},
        {"strategy": "fault_raise", "dp": 2},
        {"strategy": "dp", "dp": 2},
    ]
    path = experiment(tmp_path, "faults", layouts, capacity=[None, None, None, "1MiB"])
    results = tmp_path / "results"
    done = tspbench(env, "run", str(path), "--results", str(results))
    assert done.returncode == 1, done.stdout + done.stderr  # a failed point: exit 1, after all points
    root = results / "faults"
    frame = load(root)
    assert list(frame["status"]) == ["completed", "completed", "failed", "oom"], done.stdout
    failed, oom = frame.iloc[2], frame.iloc[3]
    assert "rank 1 raised RuntimeError: injected fault on rank 1" in failed["error"]
    assert "Traceback" in failed["error"] and failed["failed_rank"] == 1
    assert "OutOfMemoryError" in oom["error"] and "simulated device capacity" in oom["error"]
    assert (frame.loc[:1, "peak_memory_bytes"] > 0).all() and frame.loc[:1, "step_time_s"].notna().all()
    if schedstat.sample() is not None:  # where each rank's step went: it adds up to the step's wall time
        done_rows = frame.loc[:1]
        split = done_rows["cpu_busy_s"] + done_rows["cpu_blocked_s"]
        assert ((split - done_rows["step_time_s"]).abs() < 0.25 * done_rows["step_time_s"]).all()
        assert (done_rows["cpu_runqueue_s"] <= done_rows["cpu_busy_s"]).all()
        assert (done_rows["cpu_comm_threads_s"] > 0).all()  # gloo's threads moved the gradients
    for name in ("records.csv", "records.parquet"):
        assert (root / name).is_file()
    run = root / frame.loc[0, "run_id"]
    assert {"point.json", "status.json", "result.json", "env.json", "logs"} <= {p.name for p in run.iterdir()}
    assert "[4/4]" in done.stdout and "1 failed" in done.stdout

    shown = tspbench(env, "status", str(root))
    assert shown.returncode == 0 and "injected fault on rank 1" in shown.stdout
    assert "4 points: 2 completed, 1 failed, 1 oom" in shown.stdout

    mtimes = {p: p.stat().st_mtime_ns for p in root.glob("*/result.json")}
    again = tspbench(env, "run", str(path), "--results", str(results))
    assert "4 points, 4 already done, 0 to run" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in root.glob("*/result.json")} == mtimes

    retry = tspbench(env, "run", str(path), "--results", str(results), "--retry-failed")
    assert "4 points, 2 already done, 2 to run" in retry.stdout, retry.stdout + retry.stderr
    frame = load(root)
    assert list(frame["attempt"]) == [1, 1, 2, 2] and list(frame["status"])[:2] == ["completed"] * 2
    for rid in frame["run_id"][:2]:
        result = root / rid / "result.json"
        assert result.stat().st_mtime_ns == mtimes[result]


def test_killed_sweep_resumes_without_redoing_completed_points(tmp_path: Path, env: dict) -> None:
    layouts = [{"strategy": "dp", "dp": 2}, {"strategy": "tp", "tp": 2}, {"strategy": "tsp", "tsp": 2}]
    path = experiment(tmp_path, "killed", layouts, seq_len=[1024, 1024, 1024])
    results, root = tmp_path / "results", tmp_path / "results" / "killed"
    cmd = [sys.executable, "-m", "tspbench", "run", str(path), "--results", str(results)]
    # its own session, so SIGKILL reaches the sweep, its forkserver and its ranks together
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + TIMEOUT_S
    try:
        # kill while the second point runs: after one completed and another started
        while not {"completed", "running"} <= {
            (read_json(s) or {}).get("status") for s in root.glob("*/status.json")
        }:
            assert proc.poll() is None, "the sweep ended before it could be killed"
            assert time.monotonic() < deadline, "no point completed in time"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    before = load(root)
    completed = before[before["status"] == "completed"]
    assert 1 <= len(completed) < 3, list(before["status"])
    # all a killed sweep leaves is a point stored as running; its owner is gone: interrupted
    assert list(before["status"]).count("interrupted") == 1, list(before["status"])
    assert "running" not in set(before["status"])
    shown = tspbench(env, "status", str(root))
    assert shown.returncode == 0 and "1 interrupted" in shown.stdout, shown.stdout + shown.stderr
    assert f"pid {proc.pid} on" in shown.stdout, shown.stdout  # the killed sweep owned it
    kept = {rid: (root / rid / "result.json").read_bytes() for rid in completed["run_id"]}

    done = tspbench(env, "run", str(path), "--results", str(results))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(kept)} already done" in done.stdout
    assert f"interrupted (pid {proc.pid} on" in done.stderr and "it runs again" in done.stderr, done.stderr
    after = load(root).set_index("run_id")
    assert list(after["status"]) == ["completed"] * 3
    for rid, data in kept.items():
        assert (root / rid / "result.json").read_bytes() == data  # not redone, not rewritten
        assert after.loc[rid, "attempt"] == 1
    assert (after["attempt"] == 2).sum() == 1  # the point that was running when killed ran again


# ----------------------------------------------------------------------------- Slurm bookkeeping
# The real cluster runs in tests/sweep/test_slurm.py; these pin the state handling without one.

SACCT = "100_0|COMPLETED\n100_[1-2%2]|PENDING\n101|CANCELLED by 0\n102|OUT_OF_MEMORY\n103|TIMEOUT\n"
SQUEUE = "100_1 RUNNING None\n100_2 PENDING Resources\n104 PENDING PartitionNodeLimit\n"


def test_a_rendezvous_name_that_does_not_resolve_fails_naming_it() -> None:
    """No loopback fallback: on a real cluster it would leave each node's ranks waiting for
    the others at their own host until the timeout."""
    with pytest.raises(
        slurm_job.RendezvousError, match=r"MASTER_ADDR 'no-such-node\.invalid' .* does not resolve"
    ):
        slurm_job.master_address("no-such-node.invalid")  # .invalid never resolves (RFC 6761)
    assert slurm_job.master_address("localhost").startswith("127.")


def test_the_rendezvous_port_is_outside_the_ephemeral_range_and_the_same_on_every_task() -> None:
    """In the ephemeral range an outgoing connection on the node may already hold the port:
    CI saw job 1's rank 0 fail with EADDRINUSE on submitit's port 51342 while the others waited."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low, high = (int(v) for v in ephemeral.read_text().split()) if ephemeral.exists() else (32768, 60999)
    jobs = [str(j) for j in range(1, 2001)] + [f"500_{t}" for t in range(64)]
    ports = [slurm_job.rendezvous_port(j) for j in jobs]
    assert all(1024 <= p < low or p > high for p in ports)
    assert ports == [slurm_job.rendezvous_port(j) for j in jobs]  # every task derives the same
    assert len(set(ports[-64:])) > 60  # an array's tasks on one node rarely share a port


def test_job_states_from_sacct_and_squeue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm, "_run", lambda cmd: SACCT if cmd[0] == "sacct" else SQUEUE)
    states, reasons, answered = slurm.job_states({"100_0", "100_1", "101"})
    assert answered
    assert states == {"100_0": "COMPLETED", "100_1": "RUNNING", "100_2": "PENDING", "101": "CANCELLED",
                      "102": "OUT_OF_MEMORY", "103": "TIMEOUT", "104": "PENDING"}  # fmt: skip
    assert reasons == {"100_1": "None", "100_2": "Resources", "104": "PartitionNodeLimit"}
    monkeypatch.setattr(slurm, "_run", lambda cmd: None)  # both timed out or failed
    assert slurm.job_states({"100_0"}) == ({}, {}, False)


def test_pending_reasons_that_never_clear() -> None:
    never = ["PartitionNodeLimit", "(PartitionTimeLimit)", "BadConstraints", "QOSMaxNodePerJobLimit",
             "AssocMaxWallDurationPerJobLimit", "DependencyNeverSatisfied"]  # fmt: skip
    waits = ["Resources", "Priority", "Dependency", "QOSMaxJobsPerUserLimit", "AssocGrpGRES", "BeginTime", ""]
    assert all(slurm.never_starts(r) for r in never)
    assert not any(slurm.never_starts(r) for r in waits)


def test_a_job_that_can_never_start_is_cancelled_and_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    point = expand(load_experiment(experiment(tmp_path, "never", [{"strategy": "dp", "dp": 2}])))[0][0]
    store = Store(tmp_path / "store")
    store.prepare(point.to_json())
    calls: list[list[str]] = []
    monkeypatch.setattr(slurm, "_run", lambda cmd: calls.append(cmd) or "")
    assert slurm._conclude(store, point.run_id, "9_1", "PENDING", True, {}, "Resources") is None  # waits
    assert calls == []
    assert slurm._conclude(store, point.run_id, "9_1", "PENDING", True, {}, "PartitionNodeLimit") == "failed"
    assert calls == [["scancel", "9_1"]]
    assert "can never start: pending (PartitionNodeLimit)" in store.status(point.run_id)["error"]


def test_a_world_larger_than_the_cluster_is_refused_before_submitting(tmp_path: Path) -> None:
    """slurm/local.yaml: 2 nodes x 2 ranks; a world of 8 would pend forever. (No cluster runs
    here, so sinfo does not answer and the profile's nodes decide.)"""
    path = experiment(tmp_path, "big", [{"strategy": "dp", "dp": 2}, {"strategy": "dp", "dp": 8}])
    for extra in (["--dry-run"], []):
        t0 = time.monotonic()
        done = tspbench(dict(os.environ), "run", str(path), "--cluster", "local", *extra)
        assert done.returncode == 2 and time.monotonic() - t0 < 30, done.stdout + done.stderr
        assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert (
            "needs 8 ranks = 4 nodes of 2" in done.stderr
            and "(nodes: 2) allows 2 nodes (4 ranks)" in done.stderr
        )
    assert not (Path.cwd() / "results" / "big").exists()


def test_ended_jobs_without_a_record_get_a_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = experiment(tmp_path, "states", [{"strategy": "dp", "dp": 2}], seq_len=[256])
    lengths = "sweep.zip[0].seq_len=[256, 512, 768, 1024, 1280, 1536]"
    layouts = "sweep.zip[0].layout=" + json.dumps([{"strategy": "dp", "dp": 2}] * 6)
    points = expand(load_experiment(path, [lengths, layouts]))[0]
    store = Store(tmp_path / "store")
    for p in points:
        store.prepare(p.to_json())
        store.start(p.run_id)
    gone: dict[str, float] = {}
    cases = [
        ("CANCELLED", True, "cancelled"),
        ("TIMEOUT", True, "timeout"),
        ("OUT_OF_MEMORY", True, "oom"),
        ("NODE_FAIL", True, "failed"),
        ("RUNNING", True, "running"),  # still going
        ("UNKNOWN", False, "running"),  # squeue did not answer: conclude nothing
    ]
    for p, (state, answered, expected) in zip(points, cases, strict=True):
        slurm._conclude(store, p.run_id, "7", state, answered, gone)
        assert store.state(p.run_id) == expected, state
    assert "Slurm job 7 ended CANCELLED" in store.status(points[0].run_id)["error"]
    # no accounting: a job that left the queue unseen is failed after the grace period
    monkeypatch.setattr(slurm, "VANISHED_GRACE_S", 0.0)
    slurm._conclude(store, points[5].run_id, "7", "UNKNOWN", True, gone)
    assert store.state(points[5].run_id) == "failed"
    assert "left the queue without recording a status" in store.status(points[5].run_id)["error"]
    # a status the job recorded itself is never overwritten by the watcher
    assert store.finish(points[4].run_id, "completed", {"status": "completed"})
    slurm._conclude(store, points[4].run_id, "7", "FAILED", True, gone)
    assert store.state(points[4].run_id) == "completed"


def test_profile_gives_sbatch_parameters() -> None:
    local = cluster.load_profile("local").parameters(nodes=2, tasks_per_node=2, minutes=5, name="x")
    assert (local["nodes"], local["ntasks_per_node"], local["partition"]) == (2, 2, "local")
    assert "gpus_per_node" not in local and local["srun_args"] == ["--kill-on-bad-exit=1"]
    h100 = cluster.load_profile("h100").parameters(nodes=16, tasks_per_node=8, minutes=33, name="x")
    assert (h100["gpus_per_node"], h100["time"], h100["additional_parameters"]) == (
        8,
        33,
        {"exclusive": True},
    )


def test_preempted_task_goes_back_to_pending_and_resubmits_itself(tmp_path: Path) -> None:
    path = experiment(tmp_path, "preempt", [{"strategy": "dp", "dp": 2}], seq_len=[256])
    point = expand(load_experiment(path))[0][0]
    store = Store(tmp_path / "store")
    store.prepare(point.to_json())
    store.start(point.run_id)
    task = slurm_job.PointTask(str(store.root), point.to_json())
    again = task.checkpoint()
    assert again.function is task and task.preempted  # submitit requeues this same callable
    status = store.status(point.run_id)
    assert status["status"] == "pending" and status["error"] == "preempted; requeued"
    assert store.start(point.run_id) == 2  # the requeued job's attempt


# ----------------------------------------------------------------------------- killed, interrupted, piped


def _session(sid: int) -> list[int]:
    """Live processes of session ``sid`` (the sweep, its forkserver, resource tracker and ranks)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def _as_in_a_terminal() -> None:
    """Ctrl-C reaches a command run in a terminal; a test runner started in the background by a
    shell (`make test &`) has SIGINT ignored, and its children would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_hanging_sweep(tmp_path: Path, env: dict) -> tuple[subprocess.Popen, Path]:
    path = experiment(tmp_path, "hang", [{"strategy": "fault_hang", "dp": 2}])
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "tspbench", "run", str(path), "--results", str(results)]
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_as_in_a_terminal,
    )
    deadline = time.monotonic() + TIMEOUT_S
    while len(_session(proc.pid)) < 4:  # the sweep, the forkserver and both ranks (hanging)
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    return proc, results


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_ranks_die_with_a_sweep_killed_by_sigkill(tmp_path: Path, env: dict) -> None:
    proc, _ = _start_hanging_sweep(tmp_path, env)
    try:
        os.kill(proc.pid, signal.SIGKILL)  # the sweep alone, not its session
        proc.wait(timeout=10)
        deadline = time.monotonic() + 15
        while _session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _session(proc.pid) == []  # ranks, forkserver and resource tracker all gone
    finally:
        for pid in _session(proc.pid):
            os.kill(pid, signal.SIGKILL)


def test_ctrl_c_prints_the_whole_command_that_resumes(tmp_path: Path, env: dict) -> None:
    proc, results = _start_hanging_sweep(tmp_path, env)
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if _session(proc.pid) else None
    assert proc.returncode == 130
    assert f"hang.yaml --results {results}` resumes where it stopped" in err, err
    assert list(load(results / "hang")["status"]) == ["pending"]


def test_a_reader_that_goes_away_does_not_stop_the_sweep(tmp_path: Path, env: dict) -> None:
    path = experiment(tmp_path, "piped", [{"strategy": "dp", "dp": 2}, {"strategy": "tp", "tp": 2}])
    results = tmp_path / "results"
    line = f"{sys.executable} -m tspbench run {path} --results {results} | head -1; exit ${{PIPESTATUS[0]}}"
    done = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0 and "Error" not in done.stderr, done.stderr
    assert len(done.stdout.splitlines()) == 1
    assert list(load(results / "piped")["status"]) == ["completed", "completed"]
