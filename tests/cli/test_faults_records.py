"""Stored records with wrong types or non-finite values (#45): a result.json whose field holds
text where a number is due, or Infinity, is a damaged file named by ``status`` (corrupt), left out
and named by ``report`` (exit 2, the rest drawn), and moved aside and run again by ``run``; a
damaged or non-UTF-8 file under results/<gpu>/ is named while the page and root index are written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_exit import exit_code
from study_files import predict_study

REPO = Path(__file__).resolve().parents[2]


def study_with(tmp_path: Path, key: str, value: object, capsys) -> tuple[Path, Path]:
    """A predicted two-point study whose first record has ``key: value``; (study yaml, results)."""
    study = tmp_path / "tiny.yaml"
    study.write_text(predict_study())
    argv = ["run", str(study), "--executor", "predict", "--results", str(tmp_path / "results")]
    assert exit_code(argv) == 0
    capsys.readouterr()
    record = sorted((tmp_path / "results" / "tiny").glob("*/result.json"))[0]
    text = record.read_text()
    data = json.loads(text)
    data[key] = value
    record.write_text(json.dumps(data))  # json writes float("inf") as Infinity
    return study, record


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("step_time_s", "abc", "a finite number"),
        ("peak_memory_bytes", float("inf"), "a finite number"),
        ("world_size", "two", "a finite number"),
        ("peak_memory_bytes", -5, "a finite number >= 0"),  # no size or time is negative
        ("world_size", 0.5, "a whole number"),  # a count of ranks is an integer
        ("strategy", 7, "text"),  # a name is text (parquet's string column refused the int)
        ("status", "exploded", "one of pending, running, completed"),
    ],
)
def test_a_record_of_wrong_type_is_named_by_status_report_and_run(
    key: str, value: object, expected: str, tmp_path, capsys
) -> None:
    study, record = study_with(tmp_path, key, value, capsys)
    results = tmp_path / "results" / "tiny"
    assert exit_code(["status", str(results)]) in (0, 1, 2)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and f"{record}: {key}: expected {expected}" in out + err
    assert exit_code(["report", str(results), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"skipped (damaged): {record}: {key}" in err and "Traceback" not in err, err
    assert (tmp_path / "out" / "report.md").is_file()
    argv = ["run", str(study), "--executor", "predict", "--results", str(tmp_path / "results")]
    assert exit_code(argv) == 0, capsys.readouterr()
    assert json.loads(record.read_text())[key] != value  # moved aside and predicted again
    assert (results / "records.parquet").is_file()


def test_a_damaged_gpu_run_file_is_named_and_the_root_index_written(tmp_path: Path, capsys) -> None:
    root = tmp_path / "results"
    shutil.copytree(REPO / "results" / "h200", root / "h200")
    shutil.copytree(REPO / "results" / "cpu_out_of_sample", root / "cpu_out_of_sample")
    run = sorted(p for p in (root / "h200").iterdir() if (p / "bench").is_dir())[0]
    bench = sorted((run / "bench").glob("*.json"))
    bench[0].write_bytes(b"\xff\xfe not utf-8")
    data = json.loads(bench[1].read_text())
    bench[1].write_text(json.dumps({**data, "step_time_s": "abc"}))
    summary = next(iter(sorted(root.glob("h200/*/gpu_check/summary*.md"))), None)
    if summary is not None:
        summary.write_bytes(b"\xff\xfe")
    assert exit_code(["report", str(root), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(bench[0]) in err and f"{bench[1]}: " in err, err
    assert (tmp_path / "out" / "report.md").is_file() and (tmp_path / "out" / "gpu_runs.md").is_file()


def test_a_record_nested_past_the_parsers_stack_is_damaged_not_a_traceback(tmp_path: Path, capsys) -> None:
    _, record = study_with(tmp_path, "step_time_s", 1.0, capsys)
    record.write_text("[" * 100_000 + "]" * 100_000)
    results = tmp_path / "results" / "tiny"
    for argv in (["status", str(results)], ["check", "reprice", str(results)]):
        exit_code(argv)
        out, err = capsys.readouterr()
        assert f"{record}: not valid JSON (nested deeper" in out + err and "Traceback" not in out + err
