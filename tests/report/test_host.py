"""A measured study's step times against the profile that priced them (#46): a contended host (or
a profile from another host) is said in the terminal, in report.md and under the time_parity
figure's title, with how to price on this host; an idle, matching host says nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib as mpl
import pytest

from tspbench.cli.main import main
from tspbench.report.bars import time_parity
from tspbench.report.frame import context, prepare
from tspbench.report.style import RC
from tspbench.sweep.store import load

# a committed measured study (results/demo is made by `make demo`, not committed)
MEASURED = Path(__file__).resolve().parents[2] / "results" / "cpu_reference"


def demo_with(tmp_path: Path, on_core: float, runqueue: float, predicted: float) -> Path:
    """cpu_reference's records (4 ranks on 2 cores, priced on the cpu profile, measured on the
    host it names) with each rank's clocks and prediction set as fractions of its step."""
    study = tmp_path / "cpu_reference"
    shutil.copytree(MEASURED, study, ignore=shutil.ignore_patterns("report", "*.npz", "logs"))
    for path in study.glob("*/result.json"):
        record = json.loads(path.read_text())
        if record.get("status") == "completed" and record.get("step_time_s"):
            step = record["step_time_s"]
            record.update(cpu_busy_s=(on_core + runqueue) * step, cpu_runqueue_s=runqueue * step)
            record["predicted_step_time_s"] = predicted * step
            path.write_text(json.dumps(record))
    return study


@pytest.mark.slow
def test_a_contended_host_is_said_everywhere_the_times_are_shown(tmp_path: Path, capsys) -> None:
    study = demo_with(tmp_path, on_core=0.17, runqueue=0.6, predicted=1.5)  # the 17% of a CPU
    assert main(["report", str(study), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    said = "this host was contended while they ran: a rank was on a core 17% of its step, where 50% is"
    assert f"  warning: {said}" in out and "tspbench calibrate --out" in out, out
    md = (tmp_path / "out" / "report.md").read_text()
    assert said in md and "tspbench calibrate --out this-host.yaml" in md
    df = prepare(load(study))
    with mpl.rc_context(RC):
        title = " ".join(time_parity(df, context(df)).get_suptitle().split())
    assert "warning: this host was contended" in title and "tspbench calibrate" in title, title


@pytest.mark.slow
def test_an_idle_host_on_its_own_profile_says_nothing(tmp_path: Path, capsys) -> None:
    study = demo_with(tmp_path, on_core=0.5, runqueue=0.3, predicted=1.05)  # its fair share, 5% off
    assert main(["report", str(study), "--out", str(tmp_path / "out")]) == 0
    assert "warning" not in capsys.readouterr().out
    assert "Warning" not in (tmp_path / "out" / "report.md").read_text()
