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
from cli_exit import exit_code

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


@pytest.mark.slow
def test_help_exits_0_and_lists_the_commands() -> None:
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("env", "validate", "bench"):
        assert command in proc.stdout


@pytest.mark.slow
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


def test_unknown_command_exits_2(capsys) -> None:
    assert exit_code(["no-such-command"]) == 2
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err


TP2_DECODE = ["--strategy", "tp", "--tp", "2", "--mode", "decode"]


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
        # a value that starts with '-' reaches the flag's own check, whichever way it is written
        (
            ["bench", "--strategy", "dp", "--capacity", "-1GiB"],
            "--capacity: must be at least 1 byte, got '-1GiB'",
        ),
        (
            ["bench", "--strategy", "dp", "--capacity=-1GiB"],
            "--capacity: must be at least 1 byte, got '-1GiB'",
        ),
        (["validate", "--strategy", "dp", "--seed", "100000000000000000000000"], "--seed: must be in [-9223"),
        (["bench", "--strategy", "dp", "--seed", "-9223372036854775809"], "--seed: must be in [-9223"),
        (
            ["bench", "--strategy", "tp", "--tp", "2", "--mode", "infer", "--recompute", "full"],
            "--recompute full with --mode infer: recomputation applies to training only",
        ),
        (
            ["bench", *TP2_DECODE, "--decode-tokens", "2", "--recompute", "selective"],
            "--recompute selective with --mode decode: recomputation applies to training only",
        ),
        (
            ["predict", "--strategy", "tp", "--tp", "2", "--mode", "infer", "--recompute", "full"],
            "--recompute full with --mode infer",
        ),
        (
            ["plan", "--gpus", "8", "--seq-len", "1024", "--mode", "infer", "--recompute", "full"],
            "--recompute full with --mode infer",
        ),
        (
            ["bench", "--strategy", "sp", "--sp", "2", "--megatron-sp"],
            "megatron_sp (--megatron-sp) shards the residual stream over a tensor-parallel axis: it "
            "applies to tp, tp_sp only, not 'sp'",
        ),
        (
            ["validate", "--strategy", "tp", "--tp", "2", "--no-overlap"],
            "overlap: false (--no-overlap) makes TSP's weight transfers blocking: it applies to tsp only, "
            "not 'tp'",
        ),
        (
            ["validate", "--strategy", "dp", "--mode", "both", "--decode-tokens", "2"],
            "--decode-tokens is for --mode decode only, not --mode both (it runs train and infer)",
        ),
        (
            ["plan", "--gpus", "8", "--seq-len", "1024", "--mode", "decode"],
            "--mode decode: plan ranks training and prefill steps; for decode use `tspbench plan-decode",
        ),
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
    assert exit_code(argv) == 2
    assert time.perf_counter() - start < 2.0
    out, err = capsys.readouterr()
    assert problem in err and len(err.strip().splitlines()) == 1 and out == "", err


def test_results_or_output_path_that_is_a_file_exits_2(tmp_path, capsys) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    experiment = str(Path(__file__).resolve().parents[2] / "experiments" / "quickstart.yaml")
    for argv, problem in (
        (["run", experiment, "--results", str(a_file)], f"--results {a_file}: is a file, expected a folder"),
        (["run", experiment, "--results", str(a_file / "sub")], f"{a_file} is a file, not a folder"),
        (["calibrate", "--out", str(tmp_path)], f"--out {tmp_path}: is a folder, expected a file"),
    ):
        assert exit_code(argv) == 2
        err = capsys.readouterr().err
        assert problem in err and len(err.strip().splitlines()) == 1, err


def _one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line of a refused command (exit 2, nothing on stdout)."""
    assert exit_code(argv) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and out == "", err
    return err.strip()


def test_predict_decode_gives_the_decode_model(capsys) -> None:
    """predict --mode decode is the model plan-decode ranks by (it used to raise KeyError)."""
    from tspbench.analytic.decode import predict_decode
    from tspbench.analytic.hardware import load_hardware
    from tspbench.core.spec import Layout, ModelConfig

    argv = ["predict", *TP2_DECODE, "--decode-tokens", "4", "--batch", "2"]
    assert main([*argv, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    mi300x = load_hardware("mi300x")
    model = predict_decode(Layout("tp", tp=2), ModelConfig.preset("7b"), 2, 512, 4, "bfloat16", mi300x)
    assert record["mode"] == "decode" and record["decode_tokens"] == 4 and record["source"] == "predicted"
    assert record["tpot_p50_s"] == model.tpot_s() and record["ttft_s"] == model.ttft_s
    assert record["kv_cache_bytes"] == model.kv_cache_bytes
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "TTFT" in text and "TPOT p50" in text and "KV cache" in text


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, where nothing can be created")
def test_unwritable_output_is_refused_before_any_work(tmp_path: Path, capsys, monkeypatch) -> None:
    """/proc takes no new files, even from root: refused up front in one clean line, not an
    [Errno 2] after the work (calibrate measured for minutes before finding it out)."""
    import tspbench.checks.gpu_check
    import tspbench.cli.analytic

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the work started before the output path was checked")

    monkeypatch.setattr(tspbench.cli.analytic, "calibrate", must_not_run)
    monkeypatch.setattr(tspbench.checks.gpu_check, "run", must_not_run)
    experiment = str(Path(__file__).resolve().parents[2] / "experiments" / "quickstart.yaml")
    cases = [
        (["calibrate", "--quick", "--out", "/proc/tspbench-x/cpu.yaml"], "--out /proc/tspbench-x/cpu.yaml"),
        (["run", experiment, "--results", "/proc/tspbench-x"], "--results /proc/tspbench-x"),
        (["report", str(tmp_path), "--out", "/proc/tspbench-x"], "--out /proc/tspbench-x"),
        (["gpu-check", "--device", "cpu", "--quick", "--out", "/proc/tspbench-x"], "--out /proc/tspbench-x"),
    ]
    for argv, flag in cases:
        err = _one_error_line(argv, capsys)
        assert err.startswith(f"tspbench {argv[0]}: error: {flag}: cannot be written"), err
        assert "Errno" not in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")
def test_gpu_check_without_a_gpu_is_a_usage_error(capsys) -> None:
    err = _one_error_line(["gpu-check"], capsys)
    assert err.startswith("tspbench gpu-check: error: --device cuda: no CUDA device here"), err


def test_status_of_a_file_says_it_is_a_file(tmp_path: Path, capsys) -> None:
    a_file = tmp_path / "records.csv"
    a_file.write_text("")
    for command in ("status", "report"):
        err = _one_error_line([command, str(a_file)], capsys)
        assert f"{a_file}: is a file, not a results folder" in err, err


def test_hardware_profile_with_a_duplicate_key_or_a_bad_byte(tmp_path: Path, capsys) -> None:
    from tspbench.analytic.hardware import find_profile

    shipped = find_profile("mi300x").read_text()
    duplicate = tmp_path / "dup.yaml"
    duplicate.write_text(f"name: mine\n{shipped}")  # the shipped file names itself again below
    err = _one_error_line(["predict", "--strategy", "tp", "--tp", "2", "--hardware", str(duplicate)], capsys)
    line = 1 + next(i for i, ln in enumerate(shipped.splitlines(), 1) if ln.startswith("name:"))
    assert f"{duplicate}: not valid YAML at line {line}" in err, err
    assert "duplicate key 'name' (first given at line 1)" in err, err
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(shipped.encode() + b"# caf\xe9\n")
    err = _one_error_line(["predict", "--strategy", "tp", "--tp", "2", "--hardware", str(latin)], capsys)
    assert f"{latin}: not UTF-8 text: byte 0xe9" in err, err


def test_a_checkout_is_dirty_for_its_code_not_for_the_records_a_sweep_writes(tmp_path: Path) -> None:
    """A sweep writes its records under results/ as it runs: that alone must not mark the code
    that ran as modified; a change to a tracked file outside results/ does."""
    from tspbench.measure.env import git_state

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "record.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    sha, dirty = git_state(tmp_path)
    assert len(sha) == 40 and dirty is False
    (tmp_path / "results" / "record.json").write_text('{"step_time_s": 1}')
    assert git_state(tmp_path) == (sha, False)
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_state(tmp_path) == (sha, True)
