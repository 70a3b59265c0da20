"""dp on torch's DDP against the hand-written dp it replaced, at world size 4 (small preset).

The hand-written variant is the base class's path (tspbench.strategy.Strategy.sync_grads): one
async all-reduce per gradient, all issued after backward. DDP (strategies/dp.py) reduces
gradient buckets while backward runs. Both run in one world, interleaved in a seeded random
order over several rounds; each step is the slowest rank's (RankRun.timed_steps). The benchmark
reports each variant's median step time, their ratio, and the bytes each moved per step
(extra_info). Run it with

    .venv/bin/python -m pytest benchmarks/test_dp_ddp.py --benchmark-enable --benchmark-only \\
        --benchmark-json=results/dp_ddp/benchmark.json

The test suite runs it once, one step per variant, untimed.
"""

from __future__ import annotations

import random
import statistics

import pytest
from world import World

from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.measure.runner import RankRun
from tspbench.strategy import Strategy

LAYOUT = Layout("dp", dp=4)
WORKLOAD = Workload(ModelConfig.preset("small"), batch=1, seq_len=512, dtype="float32")
ROUNDS, STEPS, SEED = 15, 3, 0


class HandWrittenDP(Strategy):
    """dp before DDP: every gradient all-reduced over dp after backward (Strategy.sync_grads)."""

    name = "dp"


VARIANTS = {"ddp": None, "handwritten": HandWrittenDP}
_RUNS: dict[str, tuple[RankRun, float]] = {}


def _steps(variant: str, steps: int) -> tuple[list[float], float]:
    """Step times of ``variant`` on this rank's world (each the slowest rank's) and its bytes."""
    if variant not in _RUNS:
        run = RankRun(LAYOUT, WORKLOAD, strategy=VARIANTS[variant])
        run.step()  # warm-up
        _RUNS[variant] = run, sum(r.bus_bytes for r in run.measured_step().comm)
    run, moved = _RUNS[variant]
    return run.timed_steps(steps), moved


@pytest.fixture(scope="module")
def world4():
    with World(4) as world:
        yield world


def _compare(world: World, rounds: int, steps: int) -> dict[str, object]:
    order = random.Random(SEED)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    moved: dict[str, float] = {}
    for _ in range(rounds):
        for variant in order.sample(list(VARIANTS), len(VARIANTS)):
            step_times, nbytes = world.call(_steps, variant, steps)[0]
            times[variant] += step_times
            moved[variant] = nbytes
    medians = {v: statistics.median(t) for v, t in times.items()}
    return {
        "median_step_s": medians,
        "p10_p90_step_s": {
            v: statistics.quantiles(t, n=10)[::8] if len(t) > 1 else t for v, t in times.items()
        },
        "ddp_over_handwritten": medians["ddp"] / medians["handwritten"],
        "bus_bytes_per_step": moved,
        "rounds": rounds,
        "steps_per_round": steps,
        "seed": SEED,
    }


def test_ddp_against_handwritten_dp(benchmark, world4) -> None:
    rounds, steps = (1, 1) if benchmark.disabled else (ROUNDS, STEPS)
    result = benchmark.pedantic(_compare, args=(world4, rounds, steps), rounds=1, iterations=1)
    benchmark.group = "dp at world size 4, small preset, seq 512: DDP vs hand-written"
    benchmark.extra_info.update(result)
    assert result["bus_bytes_per_step"]["ddp"] == result["bus_bytes_per_step"]["handwritten"]
