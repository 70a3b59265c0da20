"""Faults and bad input, a fourth trial (#45): every probe of the trial that did not hold is one
line with exit 2 (or a recorded failure naming its cause), within seconds, and nothing is lost.

Kinds: a report into a folder holding a user's files; reads that block or never end (a FIFO,
/dev/zero, a never-answering sbatch); profiles accepted by shape, not meaning; numeric flags
past what the machine or the model allows; cluster profiles reaching sbatch unchecked.
"""

from __future__ import annotations

import time
from pathlib import Path

from cli_exit import exit_code

PREDICT_STUDY = """
name: tiny
hardware: cpu
model: {preset: small}
settings: {batch: 1, mode: train, recompute: none, dtype: float32, device: cpu}
sweep:
  grid: {seq_len: [256, 512]}
  zip:
    - layout: [{strategy: tsp, tsp: 2}]
"""


def one_line(argv: list[str], says: str, capsys, within_s: float = 5.0) -> str:
    """``argv`` exits 2 with one line on stderr holding ``says``, nothing on stdout, in time."""
    start = time.perf_counter()
    rc = exit_code(argv)
    seconds = time.perf_counter() - start
    out, err = capsys.readouterr()
    assert rc == 2, (rc, out, err)
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert seconds < within_s, f"{argv}: refused after {seconds:.2f} s"
    return err


def predicted_study(tmp_path: Path, capsys) -> Path:
    study = tmp_path / "tiny.yaml"
    study.write_text(PREDICT_STUDY)
    argv = ["run", str(study), "--executor", "predict", "--results", str(tmp_path / "results")]
    assert exit_code(argv) == 0
    capsys.readouterr()
    return tmp_path / "results" / "tiny"


# ------------------------------------------------------------------ 1. report --out


def test_report_refuses_a_folder_holding_a_users_files_and_keeps_them(tmp_path: Path, capsys) -> None:
    study = predicted_study(tmp_path, capsys)
    mine = tmp_path / "mypics"
    mine.mkdir()
    files = {"scaling.png": b"png of mine", "microbatch.svg": b"<svg/>", "report.md": b"# my notes\n"}
    for name, data in files.items():
        (mine / name).write_bytes(data)
    one_line(["report", str(study), "--out", str(mine)], "holds files a report did not write", capsys)
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == files


def test_report_regenerates_its_own_folder_and_deletes_only_what_it_wrote(tmp_path: Path, capsys) -> None:
    study = predicted_study(tmp_path, capsys)
    out = tmp_path / "out"
    assert exit_code(["report", str(study), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    (out / "decode.tpot_vs_batch.png").write_text("mine too")
    (out / "tpot_tails.png").write_text("a figure name, but not written by the report")
    assert exit_code(["report", str(study), "--out", str(out)]) == 0
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "tpot_tails.png").is_file()
    assert (out / "report.md").read_text().startswith("# tiny")
