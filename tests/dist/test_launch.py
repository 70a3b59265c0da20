"""The local launcher: results in rank order, a failing or hung world surfaces fast and leaves no
process behind, and an out-of-memory rank is recognisable as such.

Ranks are forked by multiprocessing's forkserver, so they are the forkserver's children, not
ours: to check that none is left we look in /proc for the pids the ranks reported, and for any
live child of the forkserver (its pid is each rank's parent pid).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import tspbench.dist.launch as launch_module
from tspbench.dist.launch import LaunchTimeout, RankError, launch
from tspbench.measure.tracker import MemoryTracker

pytestmark = pytest.mark.slow  # multi-rank runs, sweeps or Slurm: make test, not make check

# ----------------------------------------------------------------------------- on the ranks


def _identify() -> tuple[int, int, int]:
    rank = dist.get_rank()
    dist.barrier()
    if rank == 0:
        time.sleep(0.2)  # rank 0 answers last: the order must come from the launcher
    return rank, os.getpid(), os.getppid()


def _identify_without_collective() -> int:
    return dist.get_rank()


def _fail_on(bad: int, pid_dir: str, exc: str) -> None:
    """Rank ``bad`` fails; the others are stuck for good: the last sleeps, the rest wait for it
    in an all_reduce (on a group without ``bad``, so its exit cannot break their collective)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    Path(pid_dir, f"{rank}.pid").write_text(f"{os.getpid()} {time.time()}")
    others = [r for r in range(world) if r != bad]
    bystanders = dist.new_group(others)
    dist.barrier()  # every rank is inside the function (and has recorded its pid) before one fails
    if rank == bad:
        if exc == "oom":
            with MemoryTracker(capacity_bytes=1 << 20):
                torch.empty(1 << 20, dtype=torch.float32)  # 4 MiB > 1 MiB simulated capacity
        if exc == "die":
            os._exit(3)
        raise ValueError(f"bad input on rank {rank}")
    if rank == others[-1]:
        time.sleep(600)
    dist.all_reduce(torch.zeros(1), group=bystanders)


def _fail_in_world_collective(bad: int) -> None:
    """Rank ``bad`` raises; the others then fail too, in an all_reduce that lost a member."""
    dist.barrier()
    if dist.get_rank() == bad:
        raise ValueError(f"bad input on rank {bad}")
    dist.all_reduce(torch.zeros(1))


def _hang_on(slow: int, pid_dir: str) -> int:
    rank = dist.get_rank()
    Path(pid_dir, f"{rank}.pid").write_text(f"{os.getpid()} {time.time()}")
    dist.barrier()
    if rank == slow:
        time.sleep(600)
    return rank


# ----------------------------------------------------------------------------- helpers


def _alive(pid: int) -> bool:
    """True while /proc/<pid> exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _children_of(parent: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[1]) == parent and fields[0] != "Z":
                kids.append(int(entry.name))
    return kids


def _recorded(pid_dir: Path) -> dict[int, tuple[int, float]]:
    out = {}
    for f in pid_dir.glob("*.pid"):
        pid, stamp = f.read_text().split()
        out[int(f.stem)] = (int(pid), float(stamp))
    return out


def _assert_nothing_left(pids: list[int], forkserver: int) -> None:
    deadline = time.monotonic() + 5.0  # the forkserver reaps killed ranks asynchronously
    while time.monotonic() < deadline and (any(map(_alive, pids)) or _children_of(forkserver)):
        time.sleep(0.05)
    assert [p for p in pids if _alive(p)] == []
    assert _children_of(forkserver) == []
    assert multiprocessing.active_children() == []


@pytest.fixture(scope="module")
def forkserver() -> int:
    """The forkserver's pid (started here if not yet running): the parent of every rank."""
    return launch(_identify, 2, timeout=60)[0][2]


# ----------------------------------------------------------------------------- tests


def test_results_come_back_in_rank_order(forkserver: int) -> None:
    results = launch(_identify, 4, timeout=60)
    assert [r[0] for r in results] == [0, 1, 2, 3]
    pids = [r[1] for r in results]
    assert len(set(pids)) == 4 and os.getpid() not in pids
    assert {r[2] for r in results} == {forkserver}
    _assert_nothing_left(pids, forkserver)


def test_ranks_without_collectives_all_succeed() -> None:
    for _ in range(3):  # a race: three tries make a miss unlikely
        assert launch(_identify_without_collective, 8, timeout=60) == list(range(8))


def test_rank_error_names_rank_and_message_and_kills_blocked_peers(forkserver: int, tmp_path: Path) -> None:
    with pytest.raises(RankError) as info:
        launch(_fail_on, 4, 2, str(tmp_path), "value", timeout=120)
    returned = time.time()
    err = info.value
    assert err.rank == 2
    assert err.exc_type == "ValueError"
    assert err.message == "bad input on rank 2"
    assert "ValueError" in err.traceback and "_fail_on" in err.traceback
    assert not err.is_oom
    recorded = _recorded(tmp_path)
    assert sorted(recorded) == [0, 1, 2, 3]
    # Ranks 0 and 1 sit in an all_reduce waiting for rank 3, which sleeps: nothing but the
    # launcher's kill ends them before the 120 s timeout.
    assert returned - recorded[2][1] < 10, "the launcher waited for the blocked ranks"
    _assert_nothing_left([pid for pid, _ in recorded.values()], forkserver)


def test_root_cause_is_reported_when_peers_fail_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real_wait = launch_module.wait

    def busy_caller_wait(waitables: list, timeout: float | None = None) -> list:
        """A caller that gets to its pipes late: only once every rank has reported and exited."""
        sentinels = [w for w in waitables if isinstance(w, int)]
        deadline = time.monotonic() + 30
        while sentinels and time.monotonic() < deadline:
            done = real_wait(sentinels, timeout=1.0)
            sentinels = [s for s in sentinels if s not in done]
        return real_wait(waitables, timeout)

    monkeypatch.setattr(launch_module, "wait", busy_caller_wait)
    with pytest.raises(RankError) as info:
        launch(_fail_in_world_collective, 4, 2, timeout=60)
    assert (info.value.rank, info.value.exc_type) == (2, "ValueError")


def test_rank_that_dies_without_raising_is_reported(forkserver: int, tmp_path: Path) -> None:
    with pytest.raises(RankError) as info:
        launch(_fail_on, 2, 1, str(tmp_path), "die", timeout=120)
    assert info.value.rank == 1
    assert info.value.exc_type == "ProcessDied"
    assert "code 3" in info.value.message
    _assert_nothing_left([pid for pid, _ in _recorded(tmp_path).values()], forkserver)


def test_out_of_memory_rank_is_oom(forkserver: int, tmp_path: Path) -> None:
    with pytest.raises(RankError) as info:
        launch(_fail_on, 2, 1, str(tmp_path), "oom", timeout=120)
    assert info.value.rank == 1
    assert info.value.exc_type == "OutOfMemoryError"
    assert info.value.is_oom
    _assert_nothing_left([pid for pid, _ in _recorded(tmp_path).values()], forkserver)


def test_hung_world_times_out_and_leaves_nothing(forkserver: int, tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        launch(_hang_on, 2, 1, str(tmp_path), timeout=3)
    assert time.monotonic() - start < 15
    recorded = _recorded(tmp_path)
    if len(recorded) == 2:  # both ranks reached the function: the sleeper is pending (rank 0 waits
        assert 1 in info.value.pending  # for it at the closing barrier)
    _assert_nothing_left([pid for pid, _ in recorded.values()], forkserver)


def test_rank_error_survives_pickling() -> None:
    err = RankError(3, "OutOfMemoryError", "simulated device capacity exceeded", "tb")
    back = pickle.loads(pickle.dumps(err))
    assert (back.rank, back.exc_type, back.message, back.traceback) == (
        3,
        "OutOfMemoryError",
        err.message,
        "tb",
    )
    assert back.is_oom
    assert not RankError(0, "ValueError", "bad", "").is_oom
