"""Where a rank's wall time went (tspbench.measure.schedstat): each clock moves for what it names.

The expectations come from what the test makes the thread do, not from the module: a thread that
sleeps is asleep, one that spins never sleeps, and CPU another thread burns is that thread's.
"""

from __future__ import annotations

import threading
import time

import pytest

from tspbench.measure import schedstat

pytestmark = pytest.mark.skipif(schedstat.sample() is None, reason="the kernel keeps no schedstat")


def spin(cpu_seconds: float) -> None:
    """Run on a core until this thread has had ``cpu_seconds`` of it."""
    start = time.thread_time()
    while time.thread_time() - start < cpu_seconds:
        pass


# A thread's schedstat clocks advance at scheduler ticks and switches (10 ms apart at HZ=100),
# so a sample taken while the thread runs may lag by a tick: up to two ticks over a span.
TICKS = 0.02


def test_a_thread_that_sleeps_spends_its_wall_time_blocked():
    with schedstat.Spent() as spent:
        time.sleep(0.2)
    s = spent.seconds
    assert s["wall_s"] >= 0.2
    assert s["blocked_s"] >= 0.2 - TICKS  # a loaded CI host gave 0.186 s
    assert s["on_cpu_s"] < TICKS


def test_a_thread_that_spins_never_blocks_however_busy_the_host():
    with schedstat.Spent() as spent:
        spin(0.1)
    s = spent.seconds
    assert s["on_cpu_s"] >= 0.1
    # on a core or waiting for one: the rest of the wall time is rounding
    assert s["blocked_s"] < 0.01 + 0.05 * s["wall_s"]
    assert s["on_cpu_s"] + s["runqueue_s"] == pytest.approx(s["wall_s"], abs=0.01 + 0.05 * s["wall_s"])


def test_cpu_another_thread_burns_while_this_one_waits_is_counted_as_the_other_threads():
    worker = threading.Thread(target=spin, args=(0.15,))
    with schedstat.Spent() as spent:
        worker.start()
        worker.join()
    s = spent.seconds
    assert s["comm_threads_cpu_s"] >= 0.14
    assert s["on_cpu_s"] < 0.05
