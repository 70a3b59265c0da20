"""Longest files first: ``make test`` spreads whole files over the CPUs (pytest-xdist,
``--dist loadfile``: a file's module fixtures and its order stay on one worker), and starting the
longest ones first keeps one CPU from running a long file alone at the end. Order within a file
is kept; serial runs are unaffected but for the file order."""

from __future__ import annotations

import pytest

# files taking more than ~25 s on a 2-core host, longest first (tests/ and benchmarks/ alike)
LONGEST_FIRST = (
    "test_analytic.py",
    "test_fake.py",
    "test_sweep.py",
    "test_strategies.py",
    "test_slurm_sweep.py",
    "test_checks.py",
    "test_docs.py",
    "test_slurm_local.py",
    "test_tsp.py",
    "test_gpu_check.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept
