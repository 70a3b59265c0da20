"""The command line: help, the environment record, and bad input that exits 2 naming the problem.

``--help`` and ``env --json`` run the real ``python -m tspbench``; the rest call
``tspbench.cli.main`` in-process (the same parser, without another ~2 s of imports), whose return
value ``__main__`` passes to SystemExit. Every bad input here is rejected before anything is
launched.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tspbench.cli.main import main

ENV_KEYS = {
    "tspbench_version",
    "torch_version",
    "git_sha",
    "git_dirty",
    "python_version",
    "device",
    "device_name",
    "backend",
    "host",
}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tspbench", *args], capture_output=True, text=True, timeout=120
    )


def test_help_exits_0_and_lists_the_commands() -> None:
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("env", "validate", "bench"):
        assert command in proc.stdout


def test_env_json_has_the_documented_keys() -> None:
    proc = _run("env", "--json")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert set(record) >= ENV_KEYS, ENV_KEYS - set(record)
    import torch

    import tspbench

    assert record["tspbench_version"] == tspbench.__version__
    assert record["torch_version"] == torch.__version__
    assert record["device"] in ("cpu", "cuda")
    assert record["backend"] == {"cpu": "gloo", "cuda": "nccl"}[record["device"]]
    assert record["git_dirty"] in (True, False, None)
    assert record["git_sha"] is None or len(record["git_sha"]) == 40


def _exit_code(argv: list[str]) -> int:
    """main()'s exit status, whether it returns it or argparse raises SystemExit."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_unknown_command_exits_2(capsys) -> None:
    assert _exit_code(["no-such-command"]) == 2
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["validate", "--strategy", "tp", "--tp", "0"], "must be >= 1, got 0"),
        (["validate", "--strategy", "tp", "--tp", "two"], "not an integer: 'two'"),
        (["validate", "--strategy", "tp", "--tp", "3"], "n_heads 4 is not divisible by tp = 3"),  # tiny
        (["validate", "--strategy", "tp", "--model", "no-such-model"], "invalid choice: 'no-such-model'"),
        (["validate", "--strategy", "no-such-strategy"], "unknown strategy 'no-such-strategy'"),
        (["validate", "--strategy", "dp", "--tp", "2"], "tp=2 must be 1"),
        (["bench", "--strategy", "dp", "--capacity", "lots"], "not a size: 'lots'"),
        (["bench", "--strategy", "dp", "--capacity", "0"], "--capacity: must be at least 1 byte, got '0'"),
        (["bench", "--strategy", "dp", "--recompute", "most"], "invalid choice: 'most'"),
        (["bench", "--strategy", "dp", "--warmup", "-3"], "--warmup: must be >= 0, got -3"),
        (
            ["bench", "--strategy", "dp", "--timeout", "-5"],
            "--timeout: must be a finite number of seconds > 0",
        ),
        (
            ["validate", "--strategy", "dp", "--timeout", "nan"],
            "--timeout: must be a finite number of seconds",
        ),
        (
            ["validate", "--strategy", "dp", "--timeout", "inf"],
            "--timeout: must be a finite number of seconds",
        ),
        (["bench", "--strategy", "dp", "--hardware", "nosuch"], "unknown hardware 'nosuch'"),
        pytest.param(
            ["bench", "--strategy", "dp", "--dp", "2", "--device", "cuda"],
            "device 'cuda': 2 ranks need 2 GPUs, 0 visible here",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this host has GPUs"),
        ),
    ],
)
def test_bad_value_exits_2_naming_the_problem(argv: list[str], problem: str, capsys) -> None:
    """One line on stderr, exit 2, at once: before any rank starts (a launch costs seconds)."""
    start = time.perf_counter()
    assert _exit_code(argv) == 2
    assert time.perf_counter() - start < 2.0
    out, err = capsys.readouterr()
    assert problem in err and len(err.strip().splitlines()) == 1 and out == "", err


def test_results_or_output_path_that_is_a_file_exits_2(tmp_path, capsys) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    experiment = str(Path(__file__).resolve().parents[1] / "experiments" / "quickstart.yaml")
    for argv, problem in (
        (["run", experiment, "--results", str(a_file)], f"--results {a_file}: is a file, expected a folder"),
        (["run", experiment, "--results", str(a_file / "sub")], f"{a_file} is a file, not a folder"),
        (["calibrate", "--out", str(tmp_path)], f"--out {tmp_path}: is a folder, expected a file"),
    ):
        assert _exit_code(argv) == 2
        err = capsys.readouterr().err
        assert problem in err and len(err.strip().splitlines()) == 1, err
