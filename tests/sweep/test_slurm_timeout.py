"""A Slurm submission that never answers (#45): with stand-in Slurm commands on PATH (an sbatch
that sleeps for ever), the sweep fails its points in seconds, saying sbatch did not answer,
instead of waiting on submitit's sbatch call for ever. No real Slurm is needed."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from cli_exit import exit_code
from study_files import tiny_study

import tspbench.sweep.slurm as slurm

STUDY = tiny_study("stuck", "{strategy: dp, dp: 2}", "run: {warmup: 1, steps: 1, repeats: 1, timeout: 60}\n")
PROFILE = "partition: local\ngpus_per_node: 2\nnodes: 1\ndevice: cpu\nwait_timeout: 5\npoll: 0.2\n"


def stand_ins(folder: Path, sbatch: str) -> None:
    """Slurm commands that answer nothing (squeue, sacct: no jobs), and ``sbatch`` as given."""
    folder.mkdir()
    for name, body in {"sbatch": sbatch, "srun": "exit 0", "squeue": "exit 0", "sacct": "exit 0",
                       "scancel": "exit 0", "sinfo": "exit 0"}.items():  # fmt: skip
        path = folder / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize(
    ("sbatch", "says"),
    [
        ("sleep 1000", "sbatch did not answer within 2 s"),
        ("echo denied >&2; exit 1", "sbatch failed: denied"),
    ],
)
def test_an_sbatch_that_never_answers_fails_the_points_in_seconds(
    sbatch: str, says: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    stand_ins(tmp_path / "bin", sbatch)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm, "SBATCH_TIMEOUT_S", 2)
    (tmp_path / "stuck.yaml").write_text(STUDY)
    (tmp_path / "cluster.yaml").write_text(PROFILE)
    argv = ["run", str(tmp_path / "stuck.yaml"), "--cluster", str(tmp_path / "cluster.yaml"),
            "--results", str(tmp_path / "results")]  # fmt: skip
    start = time.monotonic()
    rc = exit_code(argv)
    assert time.monotonic() - start < 30
    out, err = capsys.readouterr()
    assert rc != 0 and "Traceback" not in out + err
    assert says in out + err, out + err


def test_sbatch_without_srun_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    stand_ins(tmp_path / "bin", "exit 0")
    (tmp_path / "bin" / "srun").unlink()
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None if name == "srun" else f"/bin/{name}")
    (tmp_path / "stuck.yaml").write_text(STUDY)
    (tmp_path / "cluster.yaml").write_text(PROFILE)
    argv = ["run", str(tmp_path / "stuck.yaml"), "--cluster", str(tmp_path / "cluster.yaml"),
            "--results", str(tmp_path / "results")]  # fmt: skip
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert "srun not found" in err and len(err.strip().splitlines()) == 1, err
