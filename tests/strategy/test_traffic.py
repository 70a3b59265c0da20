"""What recomputation repeats of a strategy's declared traffic (tspbench.strategy.traffic): a
forward collective's ``scope`` says which recomputation issues it again in backward."""

from __future__ import annotations

import pytest

from tspbench.core.spec import ModelConfig, Workload
from tspbench.strategy import Traffic, with_recomputation

TINY = ModelConfig.preset("tiny")
CORE = Traffic("all_gather", ("sp",), 100, 2, scope="core")  # inside the attention core
BLOCK = Traffic("all_reduce", ("tp",), 200, 3, scope="block")  # inside a decoder block
END = Traffic("reduce_scatter", ("tp",), 300, 1, scope="block_end")  # the block's last op
MODEL = Traffic("all_gather", ("tp",), 400, 1, scope="model")  # outside the blocks
GRADS = Traffic("all_reduce", ("tp",), 500, 3, "backward", scope="block")  # not a forward one
DECLARED = [CORE, BLOCK, END, MODEL, GRADS]


def _repeated(recompute: str, mode: str = "train") -> list[Traffic]:
    out = with_recomputation(DECLARED, Workload(TINY, mode=mode, recompute=recompute))
    assert out[: len(DECLARED)] == DECLARED  # the declared traffic first, unchanged
    return out[len(DECLARED) :]


@pytest.mark.parametrize(
    ("recompute", "again"),
    [("none", []), ("selective", [CORE]), ("full", [CORE, BLOCK]), ("op", [CORE, BLOCK])],
)
def test_recomputation_repeats_the_forward_traffic_of_its_scopes_in_backward(
    recompute: str, again: list[Traffic]
) -> None:
    repeated = _repeated(recompute)
    assert [(t.op, t.msg_bytes, t.count) for t in repeated] == [(t.op, t.msg_bytes, t.count) for t in again]
    assert all(t.phase == "backward" for t in repeated)


def test_nothing_is_repeated_outside_training() -> None:
    assert _repeated("full", mode="infer") == []


def test_a_declaration_of_no_calls_is_dropped() -> None:
    silent = Traffic("broadcast", ("tsp",), 64, 0)
    assert with_recomputation([silent, BLOCK], Workload(TINY)) == [BLOCK]


def test_a_declaration_defaults_to_one_blocking_forward_call_in_a_block() -> None:
    t = Traffic("all_reduce", ("tp",), 8)
    assert (t.count, t.phase, t.scope, t.channel) == (1, "forward", "block", 0)
    assert not t.hidden and not t.batched
    assert (t.window_flops, t.window, t.queue, t.queue_flops, t.window_count) == (None, "", "", 0.0, 0)
