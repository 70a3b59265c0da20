"""One training step per registered strategy at world size 2 (tiny preset, 512 tokens, float32)."""

from __future__ import annotations

import pytest

from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.measure.runner import RankRun
from tspbench.strategy import iter_strategies

WORKLOAD = Workload(ModelConfig.preset("tiny"), batch=2, seq_len=512, dtype="float32")
_RUNS: dict = {}


def two_way(cls: type) -> Layout:
    axes = cls.axes or ("dp",)
    return Layout(cls.name, **{axes[-1]: 2})


def train_step(layout: Layout) -> None:
    if layout not in _RUNS:
        _RUNS[layout] = RankRun(layout, WORKLOAD)
    _RUNS[layout].step()


@pytest.mark.parametrize("cls", list(iter_strategies()), ids=lambda c: c.name)
def test_train_step(benchmark, world2, cls: type) -> None:
    layout = two_way(cls)
    world2.call(train_step, layout)
    benchmark.group = "train step, tiny, seq 512, world size 2"
    benchmark.pedantic(world2.call, args=(train_step, layout), rounds=10, iterations=1)
