"""Each study's report.md says how its records were made and how long they took (#46): the
command is held against what it would run (the CLI's own parser and the sweep's expansion must
give back every stored point, into the study's own folder), the run time against the status
files read here directly, and a made-up study whose times are known by hand."""

from __future__ import annotations

import json
import shlex
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest

from tspbench.cli.main import build_parser
from tspbench.report.build import ReportOutputs, index_text, study_line
from tspbench.report.frame import context, prepare
from tspbench.report.provenance import provenance_lines, run_command, run_time
from tspbench.sweep.run import prepare_sweep
from tspbench.sweep.store import load

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
STUDIES = sorted(p.parent.name for p in (ROOT / "results").glob("*/experiment.json"))


@pytest.fixture(autouse=True)
def in_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the commands name paths from the repository's root, as the docs do


def frame(intervals: list[tuple[str, str]], **columns: object) -> pd.DataFrame:
    starts, ends = zip(*intervals, strict=True)
    return pd.DataFrame({"started": starts, "finished": ends, **columns})


def test_run_time_counts_overlapping_points_once_and_the_gap_between_sessions_not_at_all() -> None:
    # 0-10 s and 5-20 s overlap (20 s busy), then a session ten minutes later runs 10 s: 30 s busy,
    # 10 + 15 + 10 = 35 s summed, median 10 s; first start to last finish would be 610 s.
    df = frame(
        [
            ("2026-01-01T00:00:00+00:00", "2026-01-01T00:00:10+00:00"),
            ("2026-01-01T00:00:05+00:00", "2026-01-01T00:00:20+00:00"),
            ("2026-01-01T00:10:00+00:00", "2026-01-01T00:10:10+00:00"),
        ],
        env_host="vm",
        env_cpu_count=2,
    )
    text = run_time(df)
    assert text.startswith("30 s of wall time with a point running, on vm (2 CPUs), 2026-01-01 ")
    assert "35 s summed" in text and "10 s a point at the median" in text and "3 points" in text


def test_run_time_spans_days_and_hours_and_names_each_host() -> None:
    df = frame(
        [("2026-01-01T23:00:00+00:00", "2026-01-02T01:05:00+00:00"), ("2026-01-02T00:00:00+00:00", None)],
        env_host=["a", "b"],
        env_cpu_count=[16, 64],
    )
    text = run_time(df)  # the second point has no finish: left out, and said so
    assert text.startswith(
        "2 h 5 min of wall time with a point running, on a (16 CPUs), 2026-01-01 to 2026-01-02"
    )
    assert "1 points without times" in text


def test_a_run_time_not_stored_is_said_not_invented() -> None:
    assert run_time(pd.DataFrame({"status": ["completed"]})).startswith("not stored")
    assert run_time(frame([(None, None)])).startswith("not stored")


def test_a_study_outside_results_names_its_results_root(tmp_path: Path) -> None:
    study = tmp_path / "mine" / "s"
    study.mkdir(parents=True)
    stored = {"name": "s", "file": "my studies/s.yaml", "overrides": ["a.b=[1, 2]"], "executor": "predict"}
    (study / "experiment.json").write_text(json.dumps(stored))
    words = shlex.split(run_command(study))
    assert words == ["tspbench", "run", "my studies/s.yaml", "--executor", "predict", "--set", "a.b=[1, 2]",
                     "--results", str(tmp_path / "mine")]  # fmt: skip
    assert run_command(tmp_path) is None  # no experiment.json: no command made up


def busy_seconds_from_status_files(study: Path) -> int:
    """Seconds in which some point of ``study`` was running, counted second by second from its
    status.json files (times are stored to the second)."""
    busy: set[int] = set()
    for status in study.glob("*/status.json"):
        data = json.loads(status.read_text())
        if not (data.get("started") and data.get("finished")):
            continue  # not run yet (or never finished): no time to count
        start, end = (int(datetime.fromisoformat(data[k]).timestamp()) for k in ("started", "finished"))
        busy.update(range(start, end))
    return len(busy)


@pytest.mark.parametrize("name", STUDIES)
def test_every_committed_study_gives_a_command_that_runs_its_stored_points_and_their_run_time(
    name: str,
) -> None:
    study = Path("results") / name
    df = load(study)
    lines = provenance_lines(df, study)
    records = next(line for line in lines if line.startswith("- Records: "))
    command = shlex.split(records.split("`")[1])
    assert command[:2] == ["tspbench", "run"]
    args = build_parser().parse_args(command[1:])  # what `tspbench run` would read
    sweep = prepare_sweep(args.experiment, args.set or [], args.executor, args.cluster)
    assert Path(args.results) / sweep.experiment.name == study  # into this study's own folder
    stored = {p.parent.name for p in study.glob("*/point.json")}
    assert stored <= {p.run_id for p in sweep.points}  # every stored record is one it makes again

    when = next(line for line in lines if line.startswith("- Run time: "))
    busy = busy_seconds_from_status_files(study)
    shown = when.removeprefix("- Run time: ").split(" of wall time")[0]
    if busy == 0:
        assert shown == "under 1 s"
    elif busy < 60:
        assert shown == f"{busy} s"
    elif busy < 3600:
        assert shown == f"{busy // 60} min {busy % 60} s"
    else:
        assert shown == f"{busy // 3600} h {busy // 60 % 60} min"
    env = json.loads(next(study.glob("*/env.json")).read_text())
    assert f"on {env['host']} ({env['cpu_count']} CPUs)" in when
    assert "`tspbench report results/" + name + "`" in next(line for line in lines if "This report" in line)

    stored_json = json.loads((study / "experiment.json").read_text())
    words = ["tspbench", "run", stored_json["file"], "--executor", stored_json["executor"]]
    words += [w for o in stored_json["overrides"] for w in ("--set", o)]
    assert study_line(name, study) == f"- [{name}]({name}/report.md): `{shlex.join(words)}`"  # the root index


def test_report_md_says_it_near_the_top(tmp_path: Path) -> None:
    study = Path("results") / "sp_kv_exchange_cpu"
    df = prepare(load(study))
    text = index_text(df, context(df), ReportOutputs(tmp_path, tmp_path / "report.md"), study)
    head = text.splitlines()[:8]
    assert head[0] == "# sp_kv_exchange_cpu"
    assert [line.split(":")[0] for line in head[4:7]] == ["- Records", "- Run time", "- This report"]
