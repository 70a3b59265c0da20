"""The ``check`` commands on bad input (#45): outside a git checkout, an unknown revision, a
truncated record, a file given for a folder, a world of one, flags that would be ignored, a
sequence the check's model does not serve: each one line, exit 2, before any work."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest
from cli_exit import exit_code

REPO = Path(__file__).resolve().parents[2]


def one_line(argv: list[str], says: str, capsys) -> None:
    start = time.perf_counter()
    assert exit_code(argv) == 2
    out, err = capsys.readouterr()
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (out, err)
    assert time.perf_counter() - start < 30


def test_host_drift_outside_a_checkout_or_on_an_unknown_revision(tmp_path: Path, monkeypatch, capsys) -> None:
    def drift(previous: str, measured: Path = REPO / "results" / "cpu_reference") -> list[str]:
        return ["check", "host-drift", "--strategies", "dp", "--as-measured", str(measured),
                "--out", str(tmp_path / "drift.json"), "--previous", previous]  # fmt: skip

    one_line(drift("no-such-revision"), "--previous no-such-revision: git ls-tree failed", capsys)
    one_line(drift("HEAD", tmp_path / "none"), "not an experiment folder", capsys)
    monkeypatch.chdir(tmp_path)
    one_line(drift("HEAD"), "not a git repository", capsys)


def test_reprice_names_a_truncated_record_as_status_does(tmp_path: Path, capsys) -> None:
    study = tmp_path / "cpu_out_of_sample"
    shutil.copytree(REPO / "results" / "cpu_out_of_sample", study)
    record = sorted(study.glob("*/result.json"))[0]
    truncated = record.read_text()[:50]
    record.write_text(truncated)
    one_line(["check", "reprice", str(study)], f"{record}: not valid JSON", capsys)
    assert record.read_text() == truncated  # nothing re-priced or rewritten


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["check", "reprice", "FILE"], "not an experiment folder"),
        (["check", "tsp-prefetch", "FILE"], "not a folder (it holds before/ and after/)"),
        (["check", "gpu-points", "FILE"], "not a folder of GPU runs"),
        (["check", "overlap", "--worlds", "1"], "--worlds: must be >= 2, got 1"),
        (["check", "overlap", "--worlds", "2", "3"], "--worlds 3: each world must be a power of two"),
        (["check", "reprice", "EMPTY"], "not an experiment folder (no <run>/point.json under it)"),
        (["check", "gpu-points", "EMPTY"], "holds no GPU runs"),
        (
            ["check", "timeline-ops", "--calibrate", "EMPTY"],
            "--calibrate EMPTY: is a folder, expected a file",
        ),
        (
            ["check", "timeline-ops", "--calibrate", "PIPE"],
            "--calibrate PIPE: is a FIFO, expected a regular file",
        ),
        (["check", "overlap", "--out", "PIPE"], "--out PIPE: is a FIFO, expected a regular file"),
        (["check", "timeline-ops", "--calibrate", "ZERO"], "--calibrate ZERO: not a regular file"),
        (["check", "timeline-ops", "--seq-len", "100000000"], "--seq-len: must be at most 16,384 tokens"),
        (["check", "torch-estimator", "--seq-len", "100000000"], "--seq-len: must be at most 139,264 tokens"),
        (["check", "backtest", "--write"], "--write is for --fit"),
        (
            ["check", "backtest", "--fit", "--execute", "--rerun", "--out", "/proc/nowhere"],
            "would do nothing",
        ),
    ],
)
def test_nonsense_to_a_check_is_one_line(argv: list[str], says: str, tmp_path: Path, capsys) -> None:
    file, empty, fifo = tmp_path / "a-file", tmp_path / "empty", tmp_path / "fifo.yaml"
    file.write_text("not a folder")
    empty.mkdir()
    os.mkfifo(fifo)  # a write into it would wait for a reader
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")  # takes the write, reads back without end
    names = {"FILE": str(file), "EMPTY": str(empty), "PIPE": str(fifo), "ZERO": str(tmp_path / "zero.yaml")}
    one_line(
        [names.get(a, a) for a in argv], re.sub("FILE|EMPTY|PIPE|ZERO", lambda m: names[m[0]], says), capsys
    )
    assert list(empty.iterdir()) == []  # nothing written into it


def test_backtest_fit_write_to_a_read_only_place_is_one_line(monkeypatch, capsys) -> None:
    """The fitted profile goes through write_atomic: a location that takes no files is one
    line naming it (/proc stands in for a read-only mount), no traceback, no half-written file."""
    import tspbench.cli.backtest as cli_backtest
    from tspbench.core.files import write_atomic

    nowhere = Path("/proc/tspbench-nowhere.yaml")  # in place of the shipped profile's path
    monkeypatch.setattr(cli_backtest, "write_atomic", lambda path, data: write_atomic(nowhere, data))
    assert exit_code(["check", "backtest", "--fit", "--write"]) == 2
    err = capsys.readouterr().err
    assert "cannot write /proc/tspbench-nowhere.yaml" in err and len(err.strip().splitlines()) == 1, err
