"""What the Strategy base class (tspbench.strategy.base) gives every plugin from its declarations
alone: the layout checks, the step's traffic (its own, the gradient all-reduces its placements
ask for, the loss all-reduce), and the axes its data and gradients are split and summed over.
A bare subclass stands in for a plugin; no process group is created."""

from __future__ import annotations

import math
from typing import ClassVar

import pytest

from tspbench.core.errors import LayoutError
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.strategy import Piece, Placement, Strategy, Traffic, divisible

TINY = ModelConfig.preset("tiny")  # h 64, 4 heads, ffn 256, vocabulary 512, 2 layers
WQ = "layers.0.attention.wq.weight"


class Heads(Strategy):
    """Shards the heads over tp (only wq, for the test), sequences over sp; one tp all-reduce."""

    name = "heads_for_test"
    axes = ("tp", "sp")
    sequence_axis = "sp"
    weight_axes: ClassVar[tuple[str, ...]] = ("tp",)

    def placement(self, name: str, shape: tuple[int, ...]) -> Placement:
        if name == WQ:
            return Placement((Piece(WQ, dim=0),), axis="tp", reduce=self.data_axes())
        return Placement((Piece(name),), reduce=("tp", *self.data_axes()))

    def traffic(self) -> list[Traffic]:
        return [Traffic("all_reduce", ("tp",), 1024, 2)]


def test_the_data_axes_are_the_batch_s_and_the_sequence_s() -> None:
    assert Heads.batch_split_axes() == ("dp",)
    assert Heads.data_axes() == ("dp", "sp")
    assert Heads.mesh_dims(Layout("heads_for_test", dp=2, tp=4)) == {"dp": 2, "tp": 4, "sp": 1}


@pytest.mark.parametrize(
    ("layout", "workload", "problem"),
    [
        (Layout("heads_for_test", tsp=2), Workload(TINY), r"uses axes \['dp', 'tp', 'sp'\]; tsp=2 must be 1"),
        (Layout("other"), Workload(TINY), "layout names strategy 'other', not 'heads_for_test'"),
        (Layout("heads_for_test", tp=8), Workload(TINY), "n_heads 4 is not divisible by tp = 8"),
        (Layout("heads_for_test", sp=4), Workload(TINY, seq_len=100), r"divisible by 2 x sp = 8 \(zigzag"),
    ],
)
def test_check_names_what_is_wrong(layout: Layout, workload: Workload, problem: str) -> None:
    with pytest.raises(LayoutError, match=problem):
        Heads.check(layout, workload)


def test_divisible_names_the_value_and_the_axis() -> None:
    divisible(256, 4, "ffn_hidden", "tp")
    with pytest.raises(LayoutError, match=r"^ffn_hidden 256 is not divisible by tp = 3$"):
        divisible(256, 3, "ffn_hidden", "tp")


def test_a_training_step_adds_the_gradient_and_loss_all_reduces_its_placements_ask_for() -> None:
    layout = Layout("heads_for_test", dp=2, tp=2)
    sized = Heads.for_analysis(layout, Workload(TINY, dtype="float32"))
    step = sized.step_traffic()
    own, grads, loss = step[0], step[1:-1], step[-1]
    assert own == Traffic("all_reduce", ("tp",), 1024, 2)
    plan = sized.local_parameters()
    assert plan[WQ][0] == (32, 64)  # wq's rows split over tp = 2
    assert len(grads) == len(plan)  # one per parameter: each placement names axes to sum over
    assert {g.axes for g in grads} == {("dp", "sp"), ("tp", "dp", "sp")}
    assert all((g.phase, g.scope, g.batched) == ("optimizer", "model", True) for g in grads)
    assert sum(g.msg_bytes for g in grads) == 4 * sum(math.prod(shape) for shape, _ in plan.values())
    assert loss == Traffic("all_reduce", ("dp", "sp"), 4, 1, "forward", "model")


def test_comm_volume_leaves_out_groups_of_one_rank() -> None:
    """On dp 2 alone the strategy's own tp all-reduces (a group of one) move nothing: left are
    the gradient and loss sums, over groups labelled by the axes they name, of 2 ranks."""
    records = Heads.comm_volume(Layout("heads_for_test", dp=2), Workload(TINY, dtype="float32"))
    assert records and all(r.group_size == 2 for r in records)
    assert {r.group for r in records} == {"dp+sp", "dp+tp+sp"}
    assert {r.phase for r in records} == {"optimizer", "forward"}


def test_an_inference_step_is_the_strategy_s_own_traffic_alone() -> None:
    sized = Heads.for_analysis(Layout("heads_for_test", tp=2), Workload(TINY, mode="infer"))
    assert [t.op for t in sized.step_traffic()] == ["all_reduce"]  # no gradients, no loss sum
