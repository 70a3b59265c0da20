"""``tspbench check NAME``: one command for every model check (tspbench.checks), each writing its
results folder. --help lists them all, an unknown name is one line naming the allowed ones
(exit 2), and the cheapest check (the op-level check replayed from its stored traces) runs end
to end into a folder of its own, giving the committed files byte for byte."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
from cli_exit import exit_code

from tspbench.cli.check import CHECKS
from tspbench.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
STORED = REPO / "results" / "timeline_check"
NAMES = (
    "backtest", "timeline-ops", "torch-estimator", "overlap", "trace-cost", "tsp-prefetch", "host-drift",
    "gpu-points",
    "reprice",
)  # fmt: skip


def test_help_lists_every_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert tuple(CHECKS) == NAMES
    assert exit_code(["check", "--help"]) == 0
    out = capsys.readouterr().out
    for name in NAMES:
        assert f"\n    {name}" in out, name
    assert exit_code(["--help"]) == 0
    assert "check" in capsys.readouterr().out


def test_an_unknown_check_is_one_line_naming_the_allowed_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["check", "no-such-check"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "'no-such-check'" in err and all(f"'{name}'" in err for name in NAMES), err


def test_a_check_without_a_name_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["check"]) == 2
    assert "NAME" in capsys.readouterr().err


def test_the_op_level_check_replays_into_its_folder_as_committed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--reprice`` measures nothing: the stored traces replayed on the stored profile write
    ops.json and ops.md again, equal to the committed ones, and the table is printed."""
    out = tmp_path / "timeline_check"
    out.mkdir()
    shutil.copy(STORED / "ops.json", out)
    shutil.copytree(STORED / "traces", out / "traces")
    hardware = json.loads((STORED / "ops.json").read_text())["hardware"]  # relative to the repository

    argv = ["check", "timeline-ops", "--reprice", "--hardware", str(REPO / hardware), "--out", str(out)]
    assert exit_code(argv) == 0

    assert (out / "ops.md").read_text().replace(str(REPO / hardware), hardware) == (
        STORED / "ops.md"
    ).read_text()
    again, stored = json.loads((out / "ops.json").read_text()), json.loads((STORED / "ops.json").read_text())
    assert again["rows"] == stored["rows"]
    assert "Replayed kernel seconds" in capsys.readouterr().out


def test_a_missing_results_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["check", "tsp-prefetch", str(tmp_path / "nowhere")]) == 2
    assert str(tmp_path / "nowhere") in capsys.readouterr().err


@pytest.mark.parametrize("name", NAMES)
def test_every_flag_of_every_check_has_help(name: str) -> None:
    parser = build_parser()
    check = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["check"]
    sub = next(a for a in check._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    bare = [a.dest for a in sub._actions if not isinstance(a, argparse._HelpAction) and not a.help]
    assert not bare, f"tspbench check {name}: no help for {bare}"
