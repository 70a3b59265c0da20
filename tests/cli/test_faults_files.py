"""Faults in files (#33): a full disk is one line naming the path, after the result is shown;
a damaged stored file (empty, truncated, flipped bytes, a Chrome trace where the .npz belongs)
is one line naming it, and the commands that read many leave it out and finish the rest.

/dev/full stands in for a full disk everywhere; a 64 KiB tmpfs, where this host lets root mount
one, for a disk that fills up between the up-front check and the write.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest
from cli_exit import exit_code
from study_files import predict_study

from tspbench.calibrate.profile import Calibration
from tspbench.core.errors import DamagedFileError, OutputError
from tspbench.core.files import write_atomic
from tspbench.core.trace import EVENT, Group, RankTrace, load_traces, save_traces

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 64 KiB tmpfs with one free page left: the up-front check (one byte) passes, a real
    output does not fit. Skipped where mounting is not permitted."""
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        (mount / "fill").write_bytes(b"\0" * (64 - 4) * 1024)
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def two_rank_trace(path: Path) -> Path:
    """A small valid trace file (ranks 0 and 1 of a tp group), written without torch."""
    traces = [
        RankTrace(rank, np.zeros(3, dtype=EVENT), ["mm"], groups=[Group("tp", (0, 1))]) for rank in (0, 1)
    ]
    return save_traces(path, traces, {"world_size": 2})


def damaged_copies(good: Path, folder: Path) -> dict[str, Path]:
    data = good.read_bytes()
    flipped = bytearray(data)
    for i in range(len(data) // 3, len(data) // 3 + 16):
        flipped[i] ^= 0xFF
    out = {
        "empty": b"",
        "truncated": data[: len(data) // 2],
        "flipped": bytes(flipped),
        "chrome": json.dumps({"traceEvents": [], "displayTimeUnit": "ms"}).encode(),
    }
    paths = {}
    for name, content in out.items():
        paths[name] = folder / f"{name}.npz"
        paths[name].write_bytes(content)
    return paths


def test_a_write_to_a_full_disk_is_one_line_naming_the_path() -> None:
    with pytest.raises(OutputError) as info:
        write_atomic(Path("/dev/full"), "x" * 100)
    assert str(info.value) == "cannot write /dev/full: No space left on device"
    assert isinstance(info.value, OSError) and info.value.errno == 28
    assert stat.S_ISCHR(Path("/dev/full").stat().st_mode), "the device node was replaced"


def test_a_full_disk_after_the_check_is_one_line_in_the_middle_of_writing(tiny_disk: Path) -> None:
    with pytest.raises(OutputError, match=f"cannot write {tiny_disk}/big: No space left on device"):
        write_atomic(tiny_disk / "big", b"x" * 32 * 1024)
    assert not [p for p in tiny_disk.iterdir() if p.name != "fill"], "a temporary file was left behind"


def test_calibrate_prints_its_profile_when_its_file_cannot_be_written(tiny_disk, monkeypatch, capsys) -> None:
    import tspbench.cli.analytic

    profile = {"name": "probe", "gemm_tflops": 1.0, "notes": ["x" * 100] * 200}  # ~20 KiB of YAML
    monkeypatch.setattr(tspbench.cli.analytic, "calibrate", lambda *a, **k: Calibration(profile, []))
    out_file = tiny_disk / "cpu.yaml"
    assert exit_code(["calibrate", "--quick", "--model", "tiny", "--out", str(out_file)]) == 2
    out, err = capsys.readouterr()
    assert "name: probe" in out and "gemm_tflops: 1.0" in out  # the measurement is not lost
    assert err.strip() == f"tspbench calibrate: error: cannot write {out_file}: No space left on device"


def test_a_full_disk_is_caught_before_the_work(tiny_disk: Path, capsys) -> None:
    (tiny_disk / "fill").write_bytes(b"\0" * 64 * 1024)  # nothing left, not even for one byte
    assert exit_code(["report", str(tiny_disk), "--out", str(tiny_disk / "report")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("No space left on device") and "cannot be written" in err, err


@pytest.mark.parametrize("damage", ["empty", "truncated", "flipped", "chrome"])
def test_a_damaged_trace_is_one_line_naming_it(damage: str, tmp_path: Path, capsys) -> None:
    path = damaged_copies(two_rank_trace(tmp_path / "good.npz"), tmp_path)[damage]
    with pytest.raises(DamagedFileError, match=str(path)):
        load_traces(path)
    assert exit_code(["replay", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"tspbench replay: error: {path}: "), err
    assert "pickle" not in err
    if damage == "chrome":
        assert "a Chrome trace" in err and "bench --trace X.npz" in err


def test_replay_refuses_a_world_smaller_than_the_trace(tmp_path: Path, capsys) -> None:
    path = two_rank_trace(tmp_path / "t.npz")
    for world, says in (("0", "must be >= 1"), ("-3", "must be >= 1"), ("1", "give at least 2")):
        assert exit_code(["replay", str(path), "--world-size", world]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err
    assert exit_code(["replay", str(path), "--trace", str(tmp_path / "out.txt")]) == 2
    assert "must end in .json or .json.gz" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["empty", "truncated", "flipped", "chrome"])
def test_backtest_predicts_around_a_damaged_stored_record_and_trace(
    damage: str, tmp_path: Path, capsys
) -> None:
    published = tmp_path / "published"
    shutil.copytree(REPO / "results" / "published", published)
    record = sorted((published / "fake").glob("*.json"))[0]
    trace = record.with_suffix(".npz")
    bad = damaged_copies(trace, tmp_path)[damage]
    shutil.copy(bad, trace)
    record.write_bytes(bad.read_bytes()[:10] if damage != "chrome" else b"[1, 2]")
    argv = ["backtest", "--file", str(published / "published.yaml"), "--out", str(tmp_path / "out")]
    assert exit_code(argv) == 2
    out, err = capsys.readouterr()
    assert "wrote" in out and (tmp_path / "out" / "backtest.csv").is_file()  # the rest is reported
    lines = err.strip().splitlines()
    assert {line.split(":")[1].strip() for line in lines} == {str(trace), str(record)}, err
    assert all(line.startswith("skipped (damaged): ") for line in lines), err


def test_status_on_a_point_folder_names_the_study_folder(tmp_path: Path, capsys) -> None:
    run = tmp_path / "study" / "abc123"
    run.mkdir(parents=True)
    (run / "point.json").write_text("{}")
    for command in ("status", "report"):
        assert exit_code([command, str(run)]) == 2
        err = capsys.readouterr().err
        assert "is one point's run folder" in err and f"study folder {run.parent}" in err, err


def test_report_leaves_out_a_damaged_step_trace_and_draws_the_rest(tmp_path: Path, capsys) -> None:
    """One point's trace.npz of a stored study truncated: report names it, exits 2, and still
    writes the study's report."""
    study = tmp_path / "cpu_out_of_sample"
    shutil.copytree(REPO / "results" / "cpu_out_of_sample", study)
    trace = sorted(study.glob("*/trace.npz"))[0]
    trace.write_bytes(trace.read_bytes()[:100])
    assert exit_code(["report", str(study), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"skipped (damaged): {trace}" in err and "Traceback" not in err, err
    assert (tmp_path / "out" / "report.md").is_file()


def test_run_on_a_full_disk_is_one_line_naming_the_path(tiny_disk: Path, tmp_path: Path, capsys) -> None:
    study = tmp_path / "tiny.yaml"
    study.write_text(predict_study("512"))
    argv = ["run", str(study), "--executor", "predict", "--results", str(tiny_disk / "results")]
    assert exit_code(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "No space left on device" in err and str(tiny_disk) in err, err
