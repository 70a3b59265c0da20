"""A point that fails outside bench (#45): its recorded error begins with the exception itself,
not with 'Traceback (most recent call last):', and keeps the traceback after it."""

from __future__ import annotations

from pathlib import Path

from study_files import tiny_study

from tspbench.sweep.experiment import load_experiment
from tspbench.sweep.local import run_local
from tspbench.sweep.points import expand
from tspbench.sweep.store import Store


def test_a_failed_points_error_starts_with_the_exception(tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text(tiny_study("tiny", "{strategy: tp, tp: 2}"))
    points, _ = expand(load_experiment(str(tmp_path / "tiny.yaml"), []), "fake")
    store = Store(tmp_path / "results" / "tiny")
    for point in points:
        store.prepare(point.to_json())

    def measure(point: object) -> dict:
        raise RuntimeError("the fake world lost rank 1")

    run_local(points, store, measure, "fake")
    status = store.status(points[0].run_id)
    assert status["status"] == "failed"
    first, *rest = status["error"].splitlines()
    assert first == "RuntimeError: the fake world lost rank 1"
    assert rest[0] == "Traceback (most recent call last):"
