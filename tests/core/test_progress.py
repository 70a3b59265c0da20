"""Live progress where a user waits: a bar with an ETA on a terminal, plain lines in logs.

A small sweep (tiny preset, the predict executor: seconds) runs through the real CLI twice: under
a pseudo-terminal, where rich draws a bar with elapsed time and ETA and the summary as a rich
table; and into a pipe (CI, a Slurm log), where each point is one plain line with its counts and
ETA and no escape code appears anywhere. calibrate and the fake world report their steps and
ranks to the Progress they are given.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
import yaml

from tspbench.calibrate.profile import calibrate, calibration_steps
from tspbench.core.progress import Progress
from tspbench.core.spec import ModelConfig
from tspbench.dist.fake_world import FakeWorld

pytestmark = pytest.mark.slow  # multi-rank runs, sweeps or Slurm: make test, not make check

ROOT = Path(__file__).resolve().parents[2]
LAYOUTS = [{"strategy": "dp", "dp": 2}, {"strategy": "tp", "tp": 2}, {"strategy": "sp", "sp": 2}]
ESC = "\x1b"


class Recorded(Progress):
    """A Progress that keeps what it was told."""

    def __init__(self) -> None:
        super().__init__()
        self.starts: list[tuple[int, str]] = []
        self.lines: list[str] = []

    def start(self, total: int, title: str) -> None:
        super().start(total, title)
        self.starts.append((total, title))

    def finished(self, status: str, line: str) -> None:
        super().finished(status, line)
        self.lines.append(line)


@pytest.fixture
def sweep_file(tmp_path: Path) -> Path:
    data = {
        "name": "tiny_progress",
        "model": {"preset": "tiny"},
        "hardware": "cpu",
        "settings": {"seq_len": 256, "dtype": "float32"},
        "sweep": {"zip": [{"layout": LAYOUTS}]},
    }
    path = tmp_path / "tiny_progress.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_args(path: Path, results: Path) -> list[str]:
    cli = [sys.executable, "-m", "tspbench"]
    return [*cli, "run", str(path), "--executor", "predict", "--results", str(results)]


def run_in_terminal(argv: list[str], timeout: float = 120.0) -> tuple[int, str]:
    """``argv`` with stdout and stderr on a pseudo-terminal; (exit code, everything it wrote)."""
    main, child = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "160"}
    for name in ("NO_COLOR", "TTY_INTERACTIVE", "TTY_COMPATIBLE"):
        env.pop(name, None)
    proc = subprocess.Popen(argv, stdin=child, stdout=child, stderr=child, env=env, cwd=ROOT)
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    return proc.wait(timeout=timeout), b"".join(chunks).decode(errors="replace")


def test_a_sweep_on_a_terminal_shows_a_bar_with_an_eta(sweep_file: Path, tmp_path: Path) -> None:
    code, out = run_in_terminal(run_args(sweep_file, tmp_path / "results"))
    assert code == 0, out
    assert ESC + "[" in out  # drawn in place, with colour
    bars = [line for line in out.replace("\r", "\n").splitlines() if "ETA" in line and "━" in line]
    assert bars, out  # rich's bar, its elapsed time and ETA columns
    assert any("3/3" in line for line in bars), bars
    assert "[1/3] completed" in out  # finished points printed above the bar
    assert "run_id" in out and "─" in out  # the summary as a rich table


def test_a_sweep_into_a_pipe_prints_plain_lines(sweep_file: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        run_args(sweep_file, tmp_path / "results"), capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert ESC not in done.stdout and ESC not in done.stderr
    lines = done.stdout.splitlines()
    finished = [line for line in lines if line.startswith("[") and "] completed" in line]
    assert [line.split()[0] for line in finished] == ["[1/3]", "[2/3]", "[3/3]"]
    assert all("elapsed " in line and "ETA " in line for line in finished), finished
    assert "[3/3 done, 0 running, 0 failed]" in done.stdout
    assert any(line.split()[:2] == ["run_id", "strategy"] for line in lines)  # the plain table


def test_calibrate_reports_every_step_it_takes() -> None:
    progress = Recorded()
    calibrate(
        ranks=2, model=ModelConfig.preset("tiny"), seq_len=256, repeats=1, quick=True, progress=progress
    )
    assert progress.starts == [(calibration_steps(cuda=False, ranks=2), "calibrate tiny at 256 tokens")]
    assert progress.done == progress.total == 11 and progress.bad == 0
    assert progress.lines[0].startswith("GEMM rate") and progress.lines[-1].startswith("overlap")


def _rank() -> int:
    return dist.get_rank()


def test_the_fake_world_reports_each_rank_as_it_finishes() -> None:
    progress = Recorded()
    with FakeWorld(2, progress=progress) as world:
        assert world.run(_rank, [0, 5, 7], 8) == [0, 5, 7]
    assert progress.starts == [(3, "fake world of 8 ranks")]
    assert sorted(progress.lines) == ["rank 0", "rank 5", "rank 7"] and progress.done == 3
