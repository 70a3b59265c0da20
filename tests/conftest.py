"""Longest files first: ``make test`` spreads whole files over the CPUs (pytest-xdist,
``--dist loadfile``: a file's module fixtures and its order stay on one worker), and starting the
longest ones first keeps one CPU from running a long file alone at the end. Order within a file
is kept; serial runs are unaffected but for the file order.

A suite started in the background (``nohup``, ``cmd &`` in a script) inherits SIGINT ignored,
and every command the Ctrl-C tests start would inherit it too; each test process takes Python's
own handler back, so that a command's Ctrl-C reaches it as a terminal's does."""

from __future__ import annotations

import signal

import pytest

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# files taking more than ~25 s on a 2-core host, longest first (tests/ and benchmarks/ alike),
# by their path from the repository root (the rootdir)
LONGEST_FIRST = (
    "tests/analytic/test_predict.py",
    "tests/measure/test_fake.py",
    "tests/sweep/test_sweep.py",
    "tests/strategies/test_numerics.py",
    "tests/sweep/test_slurm.py",
    "tests/measure/test_validate.py",
    "tests/project/test_docs.py",
    "tests/project/test_slurm_local.py",
    "tests/strategies/test_tsp.py",
    "tests/checks/test_gpu_check.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    # a node id starts with its file's path from the rootdir: "tests/measure/test_fake.py::..."
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: file order kept
