"""Faults at the command line (#33): Ctrl-C is one line and exit 130, sizes nothing can serve
are refused within a second, and a value that would change nothing is refused, not ignored.

The SIGINT cases start the real ``python -m tspbench`` in its own session and send SIGINT to
the whole group, as a terminal's Ctrl-C does (the ranks and the forkserver get it too).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cli_exit import exit_code

from tspbench.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def interrupted(argv: list[str], started: str, cwd: Path, after_s: float = 0.0) -> tuple[int, str]:
    """Run ``tspbench argv``; once its output shows ``started`` (and ``after_s`` more), Ctrl-C."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tspbench", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)},
        start_new_session=True,
    )
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if started in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(120), "".join(lines)
        time.sleep(after_s)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(timeout=10)
    return proc.returncode, "".join(lines)


def assert_one_interrupted_line(rc: int, output: str, command: str) -> None:
    assert rc == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert [line for line in output.splitlines() if "interrupted" in line] == [
        f"tspbench {command}: interrupted"
    ], output


@pytest.mark.slow
def test_ctrl_c_in_calibrate_is_one_line_and_exit_130(tmp_path: Path) -> None:
    argv = ["calibrate", "--quick", "--model", "tiny", "--ranks", "2", "--seq-len", "64"]
    rc, output = interrupted(argv, "[1/", tmp_path, after_s=0.5)
    assert_one_interrupted_line(rc, output, "calibrate")


@pytest.mark.slow
def test_ctrl_c_in_bench_fake_is_one_line_and_exit_130(tmp_path: Path) -> None:
    argv = ["bench", "--fake", "--strategy", "tp", "--tp", "4", "--model", "small", "--seq-len", "2048"]
    rc, output = interrupted(argv, "[1/4]", tmp_path)  # 4 ranks on at most 2 workers: more to come
    assert_one_interrupted_line(rc, output, "bench")


@pytest.mark.slow
def test_ctrl_c_in_backtest_execute_is_one_line_and_exit_130(tmp_path: Path) -> None:
    (tmp_path / "published.yaml").write_text((REPO / "results" / "published" / "published.yaml").read_text())
    argv = ["backtest", "--file", str(tmp_path / "published.yaml"), "--execute"]
    rc, output = interrupted(argv, "in the fake world", tmp_path, after_s=1.0)
    assert_one_interrupted_line(rc, output, "backtest")


def _forbid(monkeypatch, checked: str, *work: tuple[object, str]) -> None:
    """Each (module, name) in ``work`` raises if called: the command must stop at its check of the
    ``checked`` values before any of it starts."""

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the work started before the {checked} were checked")

    for module, name in work:
        monkeypatch.setattr(module, name, must_not_run)


def _refused_quickly(argv: list[str], says: str, capsys) -> None:
    start = time.process_time()  # this process's CPU: a loaded host does not move it
    assert exit_code(argv) == 2
    seconds = time.process_time() - start
    out, err = capsys.readouterr()
    assert says in err and len(err.strip().splitlines()) == 1 and out == "", err
    assert seconds < 1.0, f"{argv}: refused after {seconds:.2f} s"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["plan", "--gpus", "1000000000", "--seq-len", "4096"], "must be at most 131,072 GPUs"),
        (["plan-decode", "--gpus", "1000000000", "--seq-len", "1024"], "must be at most 131,072 GPUs"),
        (["plan", "--gpus", "8", "--seq-len", "100000000000"], "--seq-len: must be at most 2,147,483,647"),
        (
            ["plan-decode", "--gpus", "8", "--seq-len", "1024", "--decode-tokens", "1000000"],
            "positions 7b serves",
        ),
        (["calibrate", "--quick", "--model", "tiny", "--max-seq-len", "1048576"], "16,384"),
        (["calibrate", "--quick", "--model", "tiny", "--ranks", "2", "--seq-len", "8"], "--seq-len 8"),
    ],
)
def test_impossible_sizes_are_refused_within_a_second(
    argv: list[str], says: str, capsys, monkeypatch
) -> None:
    import tspbench.cli.analytic

    _forbid(monkeypatch, "sizes", (tspbench.cli.analytic, "calibrate"))
    _refused_quickly(argv, says, capsys)


FAKE = ["bench", "--fake", "--strategy", "tp", "--tp", "2", "--model", "tiny", "--seq-len", "64"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([*FAKE, "--fake-ranks", "0,0"], "named more than once"),
        ([*FAKE, "--steps", "3"], "--steps: the fake world"),
        ([*FAKE, "--warmup", "0", "--repeats", "2"], "--warmup, --repeats: the fake world"),
        ([*FAKE, "--trace", "out.txt"], "must end in .npz or .json or .json.gz"),
        ([*FAKE, "--trace", "/dev/full"], "must end in .npz or .json or .json.gz"),
        (["calibrate", "--quick", "--out", "x.txt"], "--out x.txt: the name must end in .yaml or .yml"),
    ],
)
def test_values_that_would_change_nothing_are_refused(
    argv: list[str], says: str, capsys, monkeypatch
) -> None:
    import tspbench.cli.analytic
    import tspbench.cli.measure

    _forbid(monkeypatch, "flags", (tspbench.cli.analytic, "calibrate"), (tspbench.cli.measure, "bench_fake"))
    _refused_quickly(argv, says, capsys)


def test_calibrate_repeats_count_with_quick(monkeypatch, capsys) -> None:
    import tspbench.cli.analytic
    from tspbench.calibrate.profile import Calibration

    seen = {}

    def fake_calibrate(ranks, model, seq_len, repeats, quick, max_seq_len, progress) -> Calibration:
        seen.update(repeats=repeats, quick=quick)
        return Calibration({"name": "x"}, [])

    monkeypatch.setattr(tspbench.cli.analytic, "calibrate", fake_calibrate)
    assert main(["calibrate", "--quick", "--model", "tiny", "--seq-len", "64", "--repeats", "50"]) == 0
    assert seen == {"repeats": 50, "quick": True}
    capsys.readouterr()


def test_a_failed_point_prints_one_line_and_the_record_keeps_the_traceback(capsys) -> None:
    from tspbench.cli.measure import print_record

    error = "rank 1 raised OutOfMemoryError: capacity exceeded\nTraceback (most recent call last):\n  ...\n"
    print_record({"strategy": "dp", "model": "tiny", "seq_len": 8, "batch": 1, "mode": "train",
                  "dtype": "float32", "status": "oom", "error": error,
                  **{a: 1 for a in ("dp", "tp", "sp", "tsp", "fsdp")}})  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[1:] == ["rank 1 raised OutOfMemoryError: capacity exceeded"], lines


def test_a_published_entry_of_impossible_numbers_is_refused(tmp_path: Path, capsys) -> None:
    import re

    text = (REPO / "results" / "published" / "published.yaml").read_text()
    bad = tmp_path / "published.yaml"
    bad.write_text(re.sub(r"(?m)^(\s*seq_len:\s*)\d+", r"\g<1>100000000000", text, count=1))
    _refused_quickly(["backtest", "--file", str(bad), "--fit"], f"{bad}: entries[0].seq_len", capsys)
    profile = re.search(r"(?m)^\s*assumed:\s*(\S+)", text).group(1)
    bad.write_text(text.replace(f"assumed: {profile}", "assumed: no-such-profile", 1))
    _refused_quickly(["backtest", "--file", str(bad), "--fit"], "unknown hardware 'no-such-profile'", capsys)


def test_status_on_a_folder_no_sweep_wrote_is_one_line(tmp_path: Path, capsys) -> None:
    assert exit_code(["status", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no study stored here" in err


def test_predict_refuses_a_sequence_the_model_does_not_serve_at_once(capsys) -> None:
    start = time.process_time()  # this process's CPU: a loaded host does not move it
    argv = ["predict", "--model", "7b", "--strategy", "tsp", "--tsp", "8", "--seq-len", "999999984"]
    assert exit_code(argv) == 2
    assert time.process_time() - start < 1.0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "139,264 positions" in err
