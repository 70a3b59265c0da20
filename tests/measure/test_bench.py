"""What one bench point does between its steps: nothing a step creates outlives it.

An inference step returns its logits [B, S, V]; a bench that kept them (the tracked steps'
measurements did) would carry one logits tensor into every later step's peak: on a GPU the
allocator's peak grew by one such tensor per step (7b at 32K: 21.29, 23.24, 25.19 GiB), while
the CPU tracker, which counts only what a step allocates, could not see it. Here every step's
output is followed by a weak reference, checked dead when the next step starts.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.measure.bench import rank_bench
from tspbench.measure.runner import RankRun


@pytest.mark.parametrize("mode", ["infer", "train"])
def test_no_step_output_outlives_its_step(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    outputs: list[weakref.ref] = []
    alive_at_start: list[int] = []
    step = RankRun.step

    def watched(self: RankRun, *args: object, **kwargs: object):
        gc.collect()
        alive_at_start.append(sum(ref() is not None for ref in outputs))
        out = step(self, *args, **kwargs)
        outputs.append(weakref.ref(out))
        return out

    monkeypatch.setattr(RankRun, "step", watched)
    workload = Workload(ModelConfig.preset("tiny"), batch=2, seq_len=64, mode=mode)
    result = rank_bench(Layout("dp", dp=1), workload, steps=3, warmup=2, repeats=1, capacity_bytes=None)
    assert len(alive_at_start) == 2 + 3 + 3  # warm-up (one counting FLOPs), tracked, timed
    assert alive_at_start == [0] * len(alive_at_start)
    assert all(m.output is None for m in result["memory"] if hasattr(m, "output"))
