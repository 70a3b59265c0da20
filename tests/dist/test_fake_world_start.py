"""A fake-world worker that never starts is a recorded failure naming the cause, not a hang (#45).

The stand-ins are a ``sitecustomize`` on the worker's PYTHONPATH, which Python runs before the
worker's first line: one that blocks (a hung import, an LD_PRELOAD that waits) and one that
exits (a missing library). Neither needs torch to start, so each case takes about its timeout.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tspbench.analytic.profile_choice import choose_profile
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.dist.fake_world import FakeWorld, WorkerStartTimeout
from tspbench.dist.launch import RankError
from tspbench.measure.fake import fake_bench


def start_up(tmp_path: Path, body: str) -> dict[str, str]:
    """An env whose Python runs ``body`` before anything else."""
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(body)
    return {"PYTHONPATH": str(folder)}


HANGS = (
    "import sys, time\nprint('waiting for a licence server', file=sys.stderr, flush=True)\ntime.sleep(600)\n"
)
EXITS = "import sys\nprint('libfake.so: cannot open shared object file', file=sys.stderr)\nsys.exit(3)\n"


def children() -> set[int]:
    """This process's child processes (a killed worker is reaped, so it is gone from here)."""
    return {
        int(p)
        for task in Path(f"/proc/{os.getpid()}/task").iterdir()
        for p in (task / "children").read_text().split()
    }


def test_a_worker_that_never_starts_times_out_naming_what_it_printed(tmp_path: Path) -> None:
    start = time.monotonic()
    with FakeWorld(2, start_up(tmp_path, HANGS), start_timeout=1.0) as world:
        with pytest.raises(WorkerStartTimeout) as caught:
            world.run(os.getpid, [0, 1, 2], 4)
        assert world.pool == []  # both killed, not kept for the next call
    assert time.monotonic() - start < 10
    message = str(caught.value)
    assert "did not start within 1 s" in message and "ranks [0, 1, 2] never ran" in message
    assert message.endswith("waiting for a licence server")


def test_a_worker_that_exits_at_start_up_names_its_code_and_output(tmp_path: Path) -> None:
    with (
        FakeWorld(1, start_up(tmp_path, EXITS), start_timeout=30.0) as world,
        pytest.raises(RankError) as caught,
    ):
        world.run(os.getpid, [0], 1)
    assert caught.value.exc_type == "ProcessDied" and "before it started" in caught.value.message
    assert "libfake.so: cannot open shared object file" in caught.value.traceback


def test_fake_bench_records_a_worker_that_never_starts_as_a_timeout(tmp_path: Path) -> None:
    workload = Workload(ModelConfig.preset("tiny"), 1, 64, "infer", device="cpu")
    cpu = choose_profile(None, device="cpu", measured=False)
    before = children()
    with FakeWorld(1, start_up(tmp_path, HANGS), start_timeout=1.0) as world:
        record = fake_bench(Layout("tp", tp=2), workload, cpu, ranks=[0], world=world)
    assert record["status"] == "timeout" and "did not start within 1 s" in record["error"]
    assert children() <= before  # the hung worker was killed
