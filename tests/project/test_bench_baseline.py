"""`make bench-compare` compares every benchmark against benchmarks/saved/: a benchmark added
without refreshing the baseline (`make bench`) would be compared with nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class _Benchmarks:
    """Collects the names of the tests that use pytest-benchmark's fixture."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.names = {item.name for item in items if "benchmark" in getattr(item, "fixturenames", ())}


def test_the_saved_baseline_covers_every_benchmark() -> None:
    found = _Benchmarks()
    code = pytest.main(
        ["--collect-only", "-q", "-p", "no:cacheprovider", str(ROOT / "benchmarks")], plugins=[found]
    )
    assert code == 0 and found.names
    newest = sorted((ROOT / "benchmarks" / "saved").glob("*/*.json"))[-1]
    saved = {b["name"] for b in json.loads(newest.read_text())["benchmarks"]}
    assert found.names <= saved, f"not in {newest.name}: {sorted(found.names - saved)}"
