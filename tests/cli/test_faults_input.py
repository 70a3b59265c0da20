"""Faults and bad input, a fourth trial (#45): every probe of the trial that did not hold is one
line with exit 2 (or a recorded failure naming its cause), within seconds, and nothing is lost.

Kinds: a report into a folder holding a user's files; reads that block or never end (a FIFO,
/dev/zero, a never-answering sbatch); profiles accepted by shape, not meaning; numeric flags
past what the machine or the model allows; cluster profiles reaching sbatch unchecked.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_exit import exit_code
from study_files import predict_study

from tspbench.core.errors import DamagedFileError
from tspbench.core.files import read_input


def one_line(argv: list[str], says: str, capsys, within_s: float = 30.0) -> str:
    """``argv`` exits 2 with one line on stderr holding ``says``, nothing on stdout, in time (a
    first import of torch on a loaded 2-core host takes seconds: the bound catches a hang)."""
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
    study.write_text(predict_study())
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


def test_report_refuses_a_folder_whose_report_md_is_a_fifo_without_blocking(tmp_path: Path, capsys) -> None:
    study = predicted_study(tmp_path, capsys)
    mine = tmp_path / "mypics"
    mine.mkdir()
    os.mkfifo(mine / "report.md")
    os.mkfifo(mine / ".tspbench-report")
    one_line(["report", str(study), "--out", str(mine)], "holds files a report did not write", capsys)


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


# ------------------------------------------------------------------ 2. reads that would block


def special_files(folder: Path) -> dict[str, Path]:
    """A FIFO, a link to /dev/zero and a folder, each named like a profile."""
    folder.mkdir(exist_ok=True)
    fifo, zero, inside = folder / "fifo.yaml", folder / "zero.yaml", folder / "dir.yaml"
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")
    inside.mkdir()
    return {"fifo": fifo, "zero": zero, "folder": inside}


@pytest.mark.parametrize("kind", ["fifo", "zero", "folder"])
def test_a_fifo_or_device_given_for_a_file_is_one_line_at_once(kind: str, tmp_path: Path, capsys) -> None:
    path = special_files(tmp_path / "in")[kind]
    says = "is a folder" if kind == "folder" else "not a regular file"
    predict = ["predict", "--strategy", "tp", "--tp", "2", "--model", "tiny", "--hardware", str(path)]
    one_line(predict, says, capsys)
    if kind != "folder":  # a folder given for an experiment lists its YAML files instead
        one_line(["run", str(path), "--executor", "predict"], says, capsys)
        one_line(["replay", str(path)], says, capsys)


def test_an_input_past_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * 2048)
    with pytest.raises(DamagedFileError, match="larger than the 1,024 bytes"):
        read_input(big, limit=1024)
    assert read_input(big, limit=4096) == b"#" * 2048


# ------------------------------------------------------------------ 3. numeric flags


def numeric_flags() -> list[tuple[str, str, str]]:
    """(command, flag, type name) for every flag of every command whose value is a number (its
    type one of tspbench.cli.args's bounded parsers, or a plain float or int)."""
    from tspbench.cli.main import build_parser

    def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return subs[0].choices if subs else {}

    out = []
    for name, sub in commands(build_parser()).items():
        for words, parser in [(f"{name} {n}", p) for n, p in commands(sub).items()] or [(name, sub)]:
            for action in parser._actions:
                kind = getattr(action.type, "__name__", "")
                if action.option_strings and kind in NUMERIC_TYPES:
                    out.append((words, action.option_strings[-1], kind))
    return out


NUMERIC_TYPES = {"integer", "number", "byte_size", "seed", "float", "int"}


def test_every_numeric_flag_uses_a_bounded_parser() -> None:
    plain = [f"{c} {f}" for c, f, kind in numeric_flags() if kind in ("float", "int")]
    assert not plain, f"unbounded number flags: {plain}"


@pytest.mark.parametrize("value", ["1e400", "inf", "nan", "-inf"])
def test_every_numeric_flag_refuses_a_number_past_the_machine(value: str, capsys) -> None:
    flags = numeric_flags()
    assert len(flags) > 20
    for command, flag, _ in flags:
        # refused by the parser, which imports no torch (tests/cli/test_faults_host.py): well within 2 s
        err = one_line([*command.split(), f"{flag}={value}"], f"argument {flag}", capsys, within_s=2.0)
        assert "Traceback" not in err, (command, flag, err)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["bench", "--strategy", "dp", "--dp", "512"], "this host"),
        (["calibrate", "--ranks", "512", "--quick"], "--ranks: 512 CPU ranks"),
        (["bench", "--strategy", "dp", "--capacity", "1e400"], "not a size: '1e400'"),
        (["bench", "--strategy", "dp", "--capacity", "1.5"], "not a whole number of bytes: '1.5'"),
        (["bench", "--strategy", "dp", "--timeout", "1e15"], "--timeout: must be at most 2,592,000 seconds"),
        (["gpu-check", "--check-seconds", "inf"], "--check-seconds: must be a finite number"),
        (
            ["predict", "--strategy", "tp", "--tp", "8", "--model", "7b", "--vocab-size", "100000000"],
            "--vocab-size: must be at most 1,048,576 rows",
        ),
    ],
)
def test_sizes_that_reach_real_allocations_are_refused(argv: list[str], says: str, tmp_path, capsys) -> None:
    if argv[0] == "gpu-check":
        argv = [*argv, "--out", str(tmp_path / "gc")]
    one_line(argv, says, capsys)
    assert not (tmp_path / "gc").exists()  # nothing left behind


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("settings.capacity='1e400B'", "settings.capacity: not a size"),
        ("settings.capacity=1e400", "settings.capacity"),
        ("run.timeout=1.0e+15", "run.timeout: must be <= 2592000"),
        ("model.vocab_size=100000000", "model.vocab_size: must be <= 1048576"),
        ("model.rope_theta=0", "model.rope_theta: must be >= 1"),
        ("settings.seq_len=100000", "positions small serves"),
    ],
)
def test_a_sweep_takes_the_bounds_a_single_command_takes(change: str, says: str, tmp_path, capsys) -> None:
    study = tmp_path / "tiny.yaml"
    study.write_text(predict_study().replace("grid: {seq_len: [256, 512]}", "grid: {batch: [1]}"))
    argv = ["run", str(study), "--executor", "predict", "--set", change, "--results", str(tmp_path / "r")]
    one_line(argv, says, capsys)


# ------------------------------------------------------------------ 8. writes and their checks


def test_a_long_output_name_is_written_or_refused_before_the_work(tmp_path: Path, capsys) -> None:
    from tspbench.core.files import write_atomic

    assert write_atomic(tmp_path / ("t" * 250 + ".npz"), b"x").read_bytes() == b"x"  # the temp name fits
    too_long = tmp_path / ("t" * 300 + ".npz")
    fake = ["bench", "--fake", "--strategy", "tp", "--tp", "2", "--model", "tiny", "--seq-len", "64"]
    one_line([*fake, "--trace", str(too_long)], "at most 255 bytes a name", capsys)
    study = tmp_path / "long.yaml"
    study.write_text(predict_study().replace("name: tiny", "name: " + "e" * 300))
    one_line(["run", str(study), "--executor", "predict"], "name: 300 characters: at most 128", capsys)


@pytest.mark.parametrize("stdout", ["full", "closed"])
def test_stdout_on_a_full_device_or_closed_is_no_traceback(stdout: str, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "tspbench", "predict", "--strategy", "tp", "--tp", "2", "--model", "tiny"]
    if stdout == "full":
        with open("/dev/full", "w") as full:
            done = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.strip().splitlines() == [
            "tspbench predict: error: cannot write standard output: No space left on device"
        ], done.stderr
    else:
        line = " ".join(argv) + " >&-"
        done = subprocess.run(line, shell=True, stderr=subprocess.PIPE, text=True, timeout=120)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
