"""Benchmarks: pytest-benchmark over a persistent 2-rank world (see benchmarks/world.py).

Run for real with ``make bench`` (or ``pytest benchmarks --benchmark-enable``); the test
suite runs each once with timing disabled, so they cannot rot.
"""

from __future__ import annotations

import pytest
from world import World


@pytest.fixture(scope="session")
def world2():
    with World(2) as world:
        yield world
