"""What crosses nodes (tspbench.analytic.internode), derived by hand on small meshes: ranks are
placed row-major, model-parallel innermost, so on 8-GPU nodes a tp 8 group stays in a node,
an sp group of a tp 8 x sp 2 replica spans two, and a dp group of 8-GPU replicas spans dp nodes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tspbench.analytic.hardware import load_hardware
from tspbench.analytic.internode import crossing_axes, internode_fields, internode_seconds
from tspbench.analytic.predict import predict_record
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.dist.mesh import Mesh
from tspbench.strategy.traffic import Traffic

GIB = 2**30


@pytest.mark.parametrize(
    ("dims", "expected"),
    [
        ({"dp": 1, "sp": 2, "tp": 8}, ("sp",)),  # tp_sp 8x2: tp ranks 0-7 in node 0, sp pairs 0 and 8
        ({"dp": 2, "sp": 2, "tp": 8}, ("dp", "sp")),  # dp pairs 0 and 16: nodes 0 and 2
        ({"dp": 1, "sp": 4, "tp": 2}, ()),  # tp_sp 2x4: all 8 in one node
        ({"dp": 1, "tsp": 8}, ()),
        ({"dp": 128, "tsp": 8}, ("dp",)),  # the paper's 1,024 GPUs: one replica per node
        ({"dp": 4, "tp": 2}, ()),  # 8 GPUs in all: one node, whatever the axes
    ],
)
def test_crossing_axes_by_hand(dims: dict[str, int], expected: tuple[str, ...]) -> None:
    assert crossing_axes(Mesh.planning(dims), 8) == expected


def test_a_dp_all_reduce_across_nodes_is_priced_at_the_nic() -> None:
    """P bytes all-reduced over dp 2 of tp_sp 8x2 replicas: ring bus factor 2(n-1)/n = 1, so
    latency + P / NIC bandwidth, from the profile; the tp all-reduce inside a node adds nothing,
    the sp gather across nodes is priced at the NIC too."""
    hw = load_hardware("mi300x")
    mesh, p = Mesh.planning({"dp": 2, "sp": 2, "tp": 8}), 2 * GIB
    dp = Traffic("all_reduce", ("dp",), p, 1, "optimizer", "model", batched=True)
    tp = Traffic("all_reduce", ("tp",), p, 3, "forward")
    by_hand = hw.inter_node_latency_us * 1e-6 + p / (hw.inter_node_bandwidth_gbs * 1e9)
    assert hw.inter_node_bandwidth_gbs == 45 and hw.inter_node_latency_us == 30  # the profile's NIC
    assert internode_seconds(mesh, [dp, tp], hw) == pytest.approx(by_hand, rel=1e-12)
    assert by_hand == pytest.approx(30e-6 + 2 * GIB / 45e9)
    sp = Traffic("all_gather", ("sp",), GIB, 4, "forward")  # bus factor (n-1)/n = 1/2, 4 calls
    gather = 4 * (30e-6 + 0.5 * GIB / 45e9)
    assert internode_seconds(mesh, [dp, tp, sp], hw) == pytest.approx(by_hand + gather, rel=1e-12)
    fields = internode_fields(mesh, [dp, tp, sp], hw, step_s=2.0)
    assert fields["crossing_axes"] == "dp+sp"
    assert fields["internode_share"] == pytest.approx((by_hand + gather) / 2.0)


def test_inside_one_node_nothing_crosses() -> None:
    hw = load_hardware("mi300x")
    mesh = Mesh.planning({"dp": 1, "tsp": 8})
    t = Traffic("all_gather", ("tsp",), GIB, 5, "forward")
    expected = {"crossing_axes": "", "internode_comm_s": 0.0, "internode_share": 0.0}
    assert internode_fields(mesh, [t], hw, 1.0) == expected


def test_predict_records_the_dp_gradient_all_reduce_across_nodes() -> None:
    """The predict path prices the gradient all-reduce on the NIC once dp x replica > a node:
    tsp 2 x dp 8 on 8-GPU nodes (dp groups span 2 nodes, 16 GPUs), none at dp 4 (8 GPUs)."""
    hw = replace(load_hardware("mi300x"), name="mi300x")
    model = ModelConfig.preset("tiny")
    work = Workload(model, batch=1, seq_len=64, mode="train", dtype="bfloat16", device="cuda")
    inside = predict_record(Layout("tsp", dp=4, tsp=2), work, hw)
    across = predict_record(Layout("tsp", dp=8, tsp=2), work, hw)
    assert (inside["crossing_axes"], inside["internode_comm_s"]) == ("", 0.0)
    assert across["crossing_axes"] == "dp"
    assert across["internode_share"] == pytest.approx(across["internode_comm_s"] / across["step_time_s"])
    # what crosses: the optimizer phase (the dp gradient all-reduces) and the loss all-reduce
    # (2 bytes over dp+tsp, 16 ranks: bus bytes 2 x 15/16 x 2), each call's latency beside
    nic = hw.inter_node_bandwidth_gbs * 1e9
    transfer = (across["comm_optimizer_bytes"] + 2 * 15 / 16 * 2) / nic
    calls = (across["internode_comm_s"] - transfer) / (hw.inter_node_latency_us * 1e-6)
    assert calls == pytest.approx(round(calls), abs=1e-6) and round(calls) > 1
    assert across["step_time_s"] > inside["step_time_s"]  # what bends per-GPU throughput
