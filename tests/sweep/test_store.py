"""The results store: atomic files, resume without redoing work, retry, load(), concurrent writers.

The sweep here runs a counting fake in place of bench (``run_local(..., measure=fake)``), so
these tests take milliseconds and can count exactly which points were executed.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tspbench.core.names import FINAL_STATUSES
from tspbench.core.progress import Progress
from tspbench.sweep.damage import DamagedResults
from tspbench.sweep.experiment import load_experiment
from tspbench.sweep.local import run_local
from tspbench.sweep.points import Point, expand
from tspbench.sweep.run import select
from tspbench.sweep.status import status_table
from tspbench.sweep.store import Store, load, locked, read_json, write_atomic, write_tables

EXPERIMENT = {
    "name": "store",
    "model": {"preset": "tiny"},
    "sweep": {
        "grid": {"seq_len": [256, 512]},
        "zip": [{"layout": [{"strategy": "dp", "dp": 2}, {"strategy": "tp", "tp": 2}]}],
    },
}


@pytest.fixture
def points(tmp_path: Path) -> list[Point]:
    path = tmp_path / "store.yaml"
    path.write_text(yaml.safe_dump(EXPERIMENT))
    return expand(load_experiment(path))[0]


class Fake:
    """A measure function that counts calls and ends each point with the status it is told."""

    def __init__(self, outcomes: dict[int, str] | None = None) -> None:
        self.calls: list[str] = []
        self.outcomes = outcomes or {}

    def __call__(self, point: Point) -> dict:
        self.calls.append(point.run_id)
        status = self.outcomes.get(point.index, "completed")
        if status == "raise":
            raise RuntimeError("the measure function itself crashed")
        if status != "completed":
            return {**point.base_record(), "status": status, "error": f"{status}: injected"}
        return {**point.base_record(), "status": status, "error": None, "step_time_s": 0.5 + point.index}


def sweep(points: list[Point], store: Store, fake: Fake, retry_failed: bool = False) -> None:
    todo = select(points, store, retry_failed)
    run_local(todo, store, fake, "fake", Progress())


def test_write_atomic_never_leaves_a_torn_file(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "f.json"
    write_atomic(path, '{"v": 1}')
    assert json.loads(path.read_text()) == {"v": 1}

    def crash(src: str, dst: str) -> None:
        raise OSError("killed mid-write")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="killed"):
        write_atomic(path, '{"v": 2, "padding": "' + "x" * 100_000 + '"}')
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temporary left behind


def test_store_layout_and_status_moves(points: list[Point], tmp_path: Path) -> None:
    store = Store(tmp_path / "results" / "store")
    p = points[0]
    store.prepare(p.to_json())
    run = store.run_dir(p.run_id)
    assert sorted(x.name for x in run.iterdir()) == [".lock", "logs", "point.json", "status.json"]
    assert read_json(run / "point.json")["config"] == p.config
    assert store.status(p.run_id)["status"] == "pending" and store.status(p.run_id)["attempt"] == 0
    assert store.start(p.run_id) == 1 and store.state(p.run_id) == "running"
    assert store.start(p.run_id) is None  # only a pending point starts
    assert store.finish(p.run_id, "completed", {**p.base_record(), "status": "completed", "loss": 1.0})
    assert not store.finish(p.run_id, "failed", error="late writer")  # the first final word sticks
    assert not store.queue(p.run_id)  # a completed point is never reopened
    status = store.status(p.run_id)
    assert status["status"] == "completed" and status["attempt"] == 1 and status["error"] is None
    assert {"created", "started", "finished", "updated"} <= set(status)
    assert read_json(run / "result.json")["loss"] == 1.0
    with pytest.raises(ValueError, match="final status"):
        store.finish(p.run_id, "running")


def test_resume_skips_completed_and_finished_points(points: list[Point], tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    first = Fake({1: "failed", 2: "oom", 3: "raise"})
    sweep(points, store, first)
    assert len(first.calls) == 4
    states = [store.state(p.run_id) for p in points]
    assert states == ["completed", "failed", "oom", "failed"]
    crash = store.status(points[3].run_id)["error"]
    assert "RuntimeError: the measure function itself crashed" in crash and "Traceback" in crash
    assert (store.run_dir(points[3].run_id) / "logs" / "attempt-1.log").is_file()
    before = (store.run_dir(points[0].run_id) / "result.json").stat().st_mtime_ns

    again = Fake()
    sweep(points, store, again)
    assert again.calls == []  # finished points are results; nothing reruns without --retry-failed

    retry = Fake()
    sweep(points, store, retry, retry_failed=True)
    assert retry.calls == [p.run_id for p in points[1:]]  # everything but the completed point
    assert [store.state(p.run_id) for p in points] == ["completed"] * 4
    assert [store.status(p.run_id)["attempt"] for p in points] == [1, 2, 2, 2]
    assert (store.run_dir(points[0].run_id) / "result.json").stat().st_mtime_ns == before


def test_a_point_left_running_by_a_killed_sweep_reruns(points: list[Point], tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    select(points, store, False)
    store.start(points[0].run_id)  # as a SIGKILLed sweep leaves it
    store.queue(points[1].run_id)
    fake = Fake()
    sweep(points, store, fake)
    assert fake.calls == [p.run_id for p in points]
    assert store.status(points[0].run_id)["attempt"] == 2


def _start_and_exit(root: str, run_id: str) -> None:
    Store(root).start(run_id)  # then gone without a final word, as a SIGKILLed sweep
    os._exit(0)


def test_a_point_whose_owner_is_gone_reads_interrupted(points: list[Point], tmp_path: Path) -> None:
    """The owner recorded at start (pid, host, process start time) decides: a dead process, or
    a pid now naming a later process, is interrupted; another host's point is left running."""
    store = Store(tmp_path / "store")
    select(points, store, False)
    child = mp.get_context("fork").Process(target=_start_and_exit, args=(str(store.root), points[0].run_id))
    child.start()
    child.join(timeout=30)
    store.start(points[1].run_id)  # this process: alive
    store.start(points[2].run_id)
    store.update(points[2].run_id, lambda s: {**s, "pid_start": s["pid_start"] + 1})  # a recycled pid
    store.start(points[3].run_id)
    store.update(points[3].run_id, lambda s: {**s, "host": "elsewhere-node"})
    assert read_json(store.run_dir(points[0].run_id) / "status.json")["status"] == "running"  # on disk
    table = status_table(store.root)
    assert list(table["status"]) == ["interrupted", "running", "interrupted", "running"]
    assert f"pid {child.pid} on" in table.loc[0, "error"] and "is gone" in table.loc[0, "error"]
    assert table.loc[1, "error"] == "" and "running on elsewhere-node" in table.loc[3, "error"]
    notes: list[str] = []
    todo = select(points, store, False, notes)  # run: says so, and runs them again
    assert {p.run_id for p in todo} >= {points[0].run_id, points[2].run_id}
    assert len(notes) == 2 and all("interrupted (pid" in n and "it runs again" in n for n in notes), notes


def test_load_gives_one_row_per_point_with_status_rows(points: list[Point], tmp_path: Path) -> None:
    store = Store(tmp_path / "results" / "store")
    sweep(points[:3], store, Fake({1: "failed"}))
    select(points[3:], store, False)  # one point never ran: pending
    frame = write_tables(store.root)
    assert len(frame) == 4
    assert list(frame["status"]) == ["completed", "failed", "completed", "pending"]
    assert list(frame["strategy"]) == ["dp", "tp", "dp", "tp"]
    assert list(frame["seq_len"]) == [256, 256, 512, 512]
    assert (frame["model"] == "tiny").all() and (frame["model_hidden"] == 64).all()
    assert frame.loc[0, "step_time_s"] == 0.5 and pd.isna(frame.loc[1, "step_time_s"])
    assert frame.loc[1, "error"] == "failed: injected"
    for name in ("records.csv", "records.parquet"):
        assert (store.root / name).is_file()
    back = pd.read_parquet(store.root / "records.parquet")
    assert list(back["run_id"]) == list(frame["run_id"])
    assert list(pd.read_csv(store.root / "records.csv")["status"]) == list(frame["status"])
    assert len(load(tmp_path / "results")) == 4  # a results root of several experiments works too
    table = status_table(store.root)
    assert list(table["status"]) == list(frame["status"]) and "step_ms" in table


def _count(root: str, run_id: str, n: int) -> None:
    store = Store(root)
    for _ in range(n):
        store.update(run_id, lambda s: {**s, "count": s.get("count", 0) + 1})


def _finish(root: str, run_id: str, writer: int, queue: mp.Queue) -> None:
    won = Store(root).finish(run_id, "completed", {"status": "completed", "writer": writer})
    queue.put((writer, won))


def test_concurrent_writers_never_clobber(points: list[Point], tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    rid = points[0].run_id
    store.prepare(points[0].to_json())
    ctx = mp.get_context("fork")  # children only touch files, never torch
    procs = [ctx.Process(target=_count, args=(str(store.root), rid, 25)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0] * 6
    assert store.status(rid)["count"] == 150  # no read-modify-write was lost

    queue = ctx.Queue()
    procs = [ctx.Process(target=_finish, args=(str(store.root), rid, i, queue)) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    results = dict(queue.get(timeout=10) for _ in procs)
    winners = [w for w, won in results.items() if won]
    assert len(winners) == 1  # exactly one writer recorded the outcome ...
    assert read_json(store.run_dir(rid) / "result.json")["writer"] == winners[0]  # ... and it stayed
    assert store.state(rid) in FINAL_STATUSES
    assert not list(store.run_dir(rid).glob(".*tmp"))  # no torn write left behind


def _hold_lock_and_die(folder: str, held: mp.Event) -> None:
    with locked(Path(folder)):
        held.set()
        os.kill(os.getpid(), signal.SIGKILL)  # killed inside the read-modify-write


def test_a_writer_killed_holding_the_lock_never_blocks_the_next(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    held = ctx.Event()
    child = ctx.Process(target=_hold_lock_and_die, args=(str(tmp_path), held))
    child.start()
    child.join(timeout=30)
    assert held.is_set() and child.exitcode == -signal.SIGKILL
    start = time.monotonic()
    with locked(tmp_path, timeout=5.0):
        waited = time.monotonic() - start
    assert waited < 1.0  # taken at once: no stale-lock timeout to sit out


def test_damaged_files_are_named_listed_and_moved_aside_before_a_rerun(
    points: list[Point], tmp_path: Path
) -> None:
    store = Store(tmp_path / "results" / "store")
    sweep(points, store, Fake())
    runs = [store.run_dir(p.run_id) for p in points]
    damage = {
        runs[0] / "point.json": "{not json",
        runs[1] / "point.json": "[1, 2, 3]",  # valid JSON, wrong shape
        runs[2] / "status.json": '{"status": "done"}',
        runs[3] / "result.json": "",
    }
    for path, text in damage.items():
        path.write_text(text)
    with pytest.raises(DamagedResults, match=r"\.json: not (valid JSON|a ).*\(and 3 more\)"):
        load(store.root)  # report: refuses, naming the first
    damaged: list = []
    table = status_table(store.root, damaged)  # status: lists them
    assert list(table["status"]) == ["corrupt"] * 4
    problems = {p.split(": ")[0]: p for d in damaged for p in d.problems}
    assert set(problems) == {str(path) for path in damage}
    paths = list(map(str, damage))
    assert "not valid JSON" in problems[paths[0]] and "not a point" in problems[paths[1]]
    assert "not a status" in problems[paths[2]] and "not valid JSON" in problems[paths[3]]

    notes: list[str] = []
    fake = Fake()
    todo = select(points, store, False, notes)  # run: not done, says so, keeps the old files
    assert [p.run_id for p in todo] == [p.run_id for p in points]
    assert len(notes) == 4 and all("moved to corrupt-" in n and "runs again" in n for n in notes)
    for path, text in damage.items():
        (kept,) = path.parent.glob(f"corrupt-*/{path.name}")
        assert kept.read_text() == text
    run_local(todo, store, fake, "fake", Progress())
    assert len(fake.calls) == 4 and list(load(store.root)["status"]) == ["completed"] * 4


def test_files_get_the_mode_open_gives_them(points: list[Point], tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    sweep(points[:1], store, Fake())
    write_tables(store.root)
    (tmp_path / "plain").write_text("")
    mode = (tmp_path / "plain").stat().st_mode & 0o777  # 0644 under the usual umask
    files = [*store.root.glob("*/*.json"), store.root / "records.csv", store.root / "records.parquet"]
    assert {f.stat().st_mode & 0o777 for f in files} == {mode}


def _tables(root: str, n: int) -> None:
    for _ in range(n):
        write_tables(root)


def test_tables_can_be_rewritten_by_several_processes_at_once(points: list[Point], tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    sweep(points, store, Fake())
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_tables, args=(str(store.root), 10)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * 4  # no writer lost its temporary file to another
    assert len(pd.read_parquet(store.root / "records.parquet")) == 4 and not list(store.root.glob(".*tmp"))


def test_status_and_report_name_a_damaged_file_and_exit_2(
    points: list[Point], tmp_path: Path, capsys
) -> None:
    from tspbench.cli.main import main

    store = Store(tmp_path / "store")
    sweep(points, store, Fake())
    bad = store.run_dir(points[1].run_id) / "point.json"
    bad.write_text("[1, 2, 3]")  # once a TypeError traceback in status
    assert main(["status", str(store.root)]) == 2
    out, err = capsys.readouterr()
    assert f"corrupt: {bad}: not a point" in err and len(err.strip().splitlines()) == 1, err
    assert "4 points: 3 completed, 1 corrupt" in out
    assert main(["report", str(store.root), "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: not a point" in err and len(err.strip().splitlines()) == 1, err


def test_damage_notices_go_to_stderr_and_degrees_stay_whole_numbers(tmp_path: Path, capsys) -> None:
    """A resumed sweep says on stderr (not in the table a pipe reads) what it moved aside; the
    status table of a store with a corrupt row prints degrees as 2, not 2.0."""
    from tspbench.cli.main import main

    path = tmp_path / "store.yaml"
    path.write_text(yaml.safe_dump({**EXPERIMENT, "executor": "predict", "hardware": "mi300x"}))
    assert main(["run", str(path), "--results", str(tmp_path / "results")]) == 0
    root = tmp_path / "results" / "store"
    bad = root / load(root)["run_id"][1] / "status.json"
    bad.write_text("{torn")
    capsys.readouterr()
    assert main(["status", str(root)]) == 2
    out = capsys.readouterr().out
    header, *rows = out.splitlines()[:5]
    dp, tp = header.split().index("dp"), header.split().index("tp")
    assert [(r.split()[dp], r.split()[tp]) for r in rows] == [
        ("2", "1"),
        ("2", "1"),
        ("1", "2"),
        ("<NA>", "<NA>"),
    ]
    assert main(["run", str(path), "--results", str(tmp_path / "results")]) == 0
    out, err = capsys.readouterr()
    assert f"{bad}: not valid JSON" in err and "moved to corrupt-" in err, err
    assert "moved to corrupt-" not in out, out


# ----------------------------------------------------------------------------- one kind of record a folder


def _one_error_line(argv: list[str], capsys) -> str:
    from cli_exit import exit_code

    capsys.readouterr()
    assert exit_code(argv) == 2
    out, err = capsys.readouterr()
    assert not out and len(err.strip().splitlines()) == 1, (out, err)
    return err.strip()


def test_run_refuses_to_mix_measured_and_projected_or_fake_records(tmp_path: Path, capsys) -> None:
    """A measured sweep into a folder of projected records, and a projected or fake-world one into
    a folder of measured records, is refused before anything runs: one line naming the folder,
    what it holds and how to keep them apart. The same kind adds to the folder as before."""
    from tspbench.cli.main import main

    path = tmp_path / "store.yaml"
    path.write_text(yaml.safe_dump({**EXPERIMENT, "hardware": "cpu"}))
    results = tmp_path / "results"
    assert main(["run", str(path), "--executor", "predict", "--results", str(results)]) == 0
    root = results / "store"
    before = sorted(p.name for p in root.iterdir())
    err = _one_error_line(["run", str(path), "--executor", "local", "--results", str(results)], capsys)
    assert f"{root} holds 4 projected records; a measured sweep would mix with them" in err, err
    assert "--results" in err and "--set name=" in err
    assert sorted(p.name for p in root.iterdir()) == before  # nothing launched, nothing written
    assert set(load(root)["status"]) == {"completed"}
    assert main(["run", str(path), "--executor", "predict", "--results", str(results)]) == 0  # same kind

    measured = tmp_path / "measured"  # a measured store: the counting fake's, method "measure"
    points = expand(load_experiment(path))[0]
    sweep(points, Store(measured / "store"), Fake())
    tp_only = tmp_path / "tp_only.yaml"  # the fake world runs no DDP step: the same study, TP alone
    tp_sweep = {"zip": [{"layout": [{"strategy": "tp", "tp": 2}]}]}
    tp_only.write_text(yaml.safe_dump({**EXPERIMENT, "sweep": tp_sweep}))
    for study, executor, kind in ((path, "predict", "projected"), (tp_only, "fake", "fake-world")):
        err = _one_error_line(["run", str(study), "--executor", executor, "--results", str(measured)], capsys)
        assert f"{measured / 'store'} holds 4 measured records; a {kind} sweep would mix" in err, err


def test_a_committed_paper_study_run_without_results_is_refused(monkeypatch, capsys) -> None:
    """experiments/paper_memory.yaml on its own cluster profile, --results left out: the records
    would go into the repository's results/paper_memory, projected ones: refused, as a dry run
    says too."""
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    held = sum(
        json.loads(p.read_text())["config"]["method"] == "predict"
        for p in (root / "results" / "paper_memory").glob("*/point.json")
    )
    assert held
    err = _one_error_line(["run", "experiments/paper_memory.yaml"], capsys)
    assert err.endswith(
        f"results/paper_memory holds {held} projected records; a measured sweep would mix with them: "
        "give --results ANOTHER_ROOT or --set name=ANOTHER_NAME"
    ), err
    from tspbench.cli.main import main

    assert main(["run", "experiments/paper_memory.yaml", "--dry-run"]) == 0
    assert "run would refuse: results/paper_memory holds" in capsys.readouterr().out
