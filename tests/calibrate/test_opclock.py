"""Each op's wall and on-core time (tspbench.calibrate.opclock), held to what the test makes the
host do: an op alone on a core spends its wall time there; an op that shares its core with a
spinning process gets about half of it; backward's ops are timed like forward's."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from tspbench.calibrate.opclock import OpClock
from tspbench.core.trace import COMPUTE
from tspbench.measure.trace import StepRecorder

GEMMS = 30


def matmuls(n: int = GEMMS) -> None:
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    for _ in range(n):
        torch.mm(a, b)


def test_every_op_of_a_step_is_timed_on_both_clocks_forward_and_backward():
    w = torch.randn(64, 64, requires_grad=True)
    with OpClock() as clock:
        torch.relu(torch.randn(8, 64) @ w).sum().backward()
    assert {"mm", "relu", "threshold_backward"} <= set(clock.wall_s)
    assert set(clock.wall_s) == set(clock.cpu_s)
    for name in clock.wall_s:  # a thread's CPU clock never runs ahead of the wall
        assert 0 <= clock.cpu_s[name] <= clock.wall_s[name] + 1e-4


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_an_op_sharing_its_core_with_a_spinning_process_waits_about_as_long_as_it_runs():
    torch.set_num_threads(1)
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        with OpClock() as alone:
            matmuls()
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            os.sched_setaffinity(spinner.pid, {core})
            time.sleep(0.2)  # the spinner is running on the core
            with OpClock() as shared:
                matmuls()
        finally:
            spinner.kill()
            spinner.wait()
    finally:
        os.sched_setaffinity(0, before)
    # two on one core: each gets about half of it (a test running beside this one only adds waits)
    assert shared.wall_s["mm"] / shared.cpu_s["mm"] > 1.5
    assert shared.cpu_s["mm"] == pytest.approx(alone.cpu_s["mm"], rel=0.5)  # the same work on a core


def test_the_clock_times_exactly_the_ops_the_trace_prices() -> None:
    """The op-level check's on-core split holds the replay's price of the traced ops against their
    clocked time, kind by kind: the clock must see the same ops, each whole. torch.profiler does
    not: it splits the zero-fill of nll_loss_backward's output into a ``fill_`` the trace never
    records."""
    logits = torch.randn(64, 512, requires_grad=True)
    target = torch.randint(0, 512, (64,))

    def step() -> None:
        logits.grad = None
        torch.nn.functional.cross_entropy(torch.relu(logits), target).backward()

    with StepRecorder(0) as recorder:
        step()
    trace = recorder.trace()
    traced = {trace.names[i] for i in trace.events[trace.events["kind"] == COMPUTE]["name"]}
    with OpClock() as clock:
        step()

    assert "nll_loss_backward" in traced and "fill_" not in traced
    assert set(clock.wall_s) == traced
