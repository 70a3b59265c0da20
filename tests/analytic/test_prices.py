"""The price list (tspbench.analytic.prices) is the only one: ops built by hand - a GEMM, a causal
square and a rectangle of attention, an element-wise op, collectives inside a node and across
the NIC, traffic hidden behind compute - are priced the same, bit for bit, by the closed form
(timing.py), the timeline (timeline.py) and the decode model (decode.py), and equal the price
list's own figure. Where the models price a kind differently on purpose (the closed form has
no byte count, so no roofline; decode's GEMMs run at the achievable rate, not the profiled
step's), the test says which named variant each one takes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tspbench.analytic import decode, decode_step, prices, timing
from tspbench.analytic.hardware import Hardware
from tspbench.analytic.timeline import Costs, kernel_seconds
from tspbench.core.spec import Layout, ModelConfig
from tspbench.core.trace import ATTENTION, CAUSAL, COMPUTE, ELEMENTWISE, EVENT, GEMM, RankTrace
from tspbench.costs.flops import FlopTerms
from tspbench.dist.mesh import Mesh
from tspbench.strategy import Traffic

# awkward rates, so that equal prices mean the same arithmetic, not round numbers
HW = Hardware(
    "awkward", 8, 2**40, 3.1, 0.731, 0.457, 3.3, 1.7, 3.9, 0.29, 7.3,
    attention_causal_by_size={256: 0.61, 4096: 1.13}, attention_by_size={128: 0.37, 2048: 0.52},
    overlap_efficiency=0.83,
)  # fmt: skip
GEMM_FLOPS, ATTENTION_FLOPS, NBYTES = 3.7e10, 2.9e9, 1.23e6


def replayed(*rows: dict, hw: Hardware = HW) -> np.ndarray:
    """The timeline's kernel seconds of a one-rank trace of compute events ``rows``."""
    events = np.zeros(len(rows), dtype=EVENT)
    for event, row in zip(events, rows, strict=True):
        event["kind"] = COMPUTE
        for key, value in row.items():
            event[key] = value
    return kernel_seconds(RankTrace(0, events, ["mm", "sdpa", "add"]), Costs(hw, 1))


def closed_form(flops: FlopTerms, elementwise_bytes: float = 0.0) -> tuple[float, float, float]:
    return timing.compute_seconds(flops, elementwise_bytes, HW, 1)


def decoded(gemm=0.0, weight_bytes=0.0, attention=0.0, cache_bytes=0.0, elementwise_bytes=0.0):
    return decode_step.compute_seconds(HW, 1, gemm, weight_bytes, attention, cache_bytes, elementwise_bytes)


def test_a_gemm_is_priced_alike_by_all_three() -> None:
    price = prices.gemm_seconds(HW, GEMM_FLOPS)
    assert price == GEMM_FLOPS / (HW.gemm_tflops * 1e12)
    assert closed_form(FlopTerms(GEMM_FLOPS, 0.0))[0] == price
    assert replayed({"cls": GEMM, "flops": GEMM_FLOPS, "nbytes": NBYTES})[0] == price  # compute-bound
    assert decoded(gemm=GEMM_FLOPS, weight_bytes=NBYTES)[0] == price
    # memory-bound: the timeline and decode take the roofline (the closed form counts no bytes)
    heavy = 1e9
    bound = prices.gemm_seconds(HW, GEMM_FLOPS, heavy)
    assert bound == heavy / (HW.hbm_bandwidth_gbs * 1e9) > price
    assert replayed({"cls": GEMM, "flops": GEMM_FLOPS, "nbytes": heavy})[0] == bound
    assert decoded(gemm=GEMM_FLOPS, weight_bytes=heavy)[0] == bound


def test_the_named_gemm_rates_differ_only_where_a_profile_measured_its_step() -> None:
    """The step's rate (calibrate's profiled step) for training and prefill, the achievable one
    for decode: one price, two named rates."""
    profiled = replace(HW, step_gemm_tflops=0.5)
    assert prices.gemm_seconds(profiled, GEMM_FLOPS) == GEMM_FLOPS / 0.5e12
    assert prices.gemm_seconds(profiled, GEMM_FLOPS, decode=True) == GEMM_FLOPS / (HW.gemm_tflops * 1e12)
    assert timing.compute_seconds(FlopTerms(GEMM_FLOPS, 0.0), 0.0, profiled, 1)[0] == GEMM_FLOPS / 0.5e12


@pytest.mark.parametrize("causal, side", [(True, 1024), (False, 512), (False, 0)])
def test_an_attention_call_is_priced_alike_by_all_three(causal: bool, side: int) -> None:
    price = prices.attention_seconds(HW, ATTENTION_FLOPS, causal, side)
    rate = HW.causal_tflops(side) if causal else HW.rectangle_tflops(side)
    assert price == ATTENTION_FLOPS / (rate * 1e12)
    terms = FlopTerms(0.0, ATTENTION_FLOPS, 1.0 if causal else 0.0, side)
    assert closed_form(terms)[1] == price
    flags = CAUSAL if causal else 0
    assert replayed({"cls": ATTENTION, "flops": ATTENTION_FLOPS, "size": side, "flags": flags})[0] == price
    if not causal and side == 0:  # decode's calls: one query against the keys, the profile's rate
        assert decoded(attention=ATTENTION_FLOPS, cache_bytes=NBYTES)[1] == price


def test_an_elementwise_op_is_priced_alike_by_all_three() -> None:
    price = prices.elementwise_seconds(NBYTES, prices.elementwise_gbs(HW))
    assert price == NBYTES / (HW.hbm_bandwidth_gbs * 1e9)
    assert closed_form(FlopTerms(0.0, 0.0), NBYTES)[2] == price
    assert replayed({"cls": ELEMENTWISE, "nbytes": NBYTES, "name": 2})[0] == price
    assert decoded(elementwise_bytes=NBYTES)[2] == price
    # where a profile measured an op by name, the timeline prices that op at its own rate
    measured = replace(HW, elementwise_by_op={"add": 1.1, "*": 2.2})
    assert prices.elementwise_gbs(measured, "add") == 1.1 and prices.elementwise_gbs(measured, "mul") == 2.2


def test_the_per_op_overhead_and_share_are_one_rule() -> None:
    overhead = replace(HW, op_overhead_us=3.0)
    alone = replayed({"cls": GEMM, "flops": GEMM_FLOPS}, hw=overhead)[0]
    assert alone == prices.at_share(prices.gemm_seconds(HW, GEMM_FLOPS), 1.0, 3e-6)


@pytest.mark.parametrize("axis, dims", [("tp", {"dp": 1, "tp": 4}), ("dp", {"dp": 2, "tp": 8})])
def test_a_collective_is_priced_alike_by_all_three(axis: str, dims: dict[str, int]) -> None:
    """An all-reduce over 4 ranks of a node, and over 2 ranks on two nodes (the NIC)."""
    mesh = Mesh.planning(dims, 1)
    ranks = mesh.group(axis).ranks
    inter = prices.crosses_nodes(ranks, HW.gpus_per_node)
    assert inter == (axis == "dp")
    latency, transfer = prices.collective_seconds(
        HW, "all_reduce", len(ranks), mesh.world_size, inter, NBYTES
    )
    price = latency + transfer
    assert timing.comm_seconds(mesh, [Traffic("all_reduce", (axis,), NBYTES, 1)], HW) == (price, 0.0)
    link, *replay = Costs(HW, mesh.world_size).collective_seconds("all_reduce", ranks, NBYTES)
    assert (link, replay) == ("nic" if inter else "node", [latency, transfer])
    traffic = Traffic("all_reduce", (axis,), NBYTES, 3, hidden=True, window="w", window_flops=1.0)
    assert timing.call_seconds(mesh, traffic, HW) == price  # decode's exposed calls, and its windows':
    assert decode_step.window_spans([traffic], mesh, HW, 1.0)[0][1] == 3 * price


def test_traffic_hidden_behind_compute_costs_alike_in_the_closed_form_and_decode() -> None:
    """An FSDP decode step hides its block gathers behind the step's compute; what they still cost
    is the closed form's rule (StepTime) on the same compute and traffic."""
    tiny = ModelConfig.preset("tiny")
    slow = replace(HW, intra_node_bandwidth_gbs=0.01)  # gathers outlast the compute
    for hw in (HW, slow):
        p = decode.predict_decode(Layout("fsdp", fsdp=4), tiny, 4, 64, 3, "float32", hw)
        step = p.steps[1]
        traffic = [t for t in p.transfers if t.phase == "decode"]
        exposed, hidden = timing.comm_seconds(p.mesh, traffic, hw)
        closed = timing.StepTime(
            step.gemm_s, step.attention_s, step.elementwise_s, exposed, hidden, hw.overlap_efficiency, 1.0
        )
        assert (step.comm_exposed_s, step.comm_hidden_s) == (
            closed.to_dict()["comm_exposed_s"],
            closed.to_dict()["comm_hidden_s"],
        )
        assert closed.hidden_exposed_s == prices.hidden_exposed(
            closed.compute_s, hidden, hw.overlap_efficiency
        )


def test_a_wait_on_peers_is_the_price_lists() -> None:
    """Where ranks share a host's cores, a blocking call after a chunk of compute waits for its
    peers: the closed form charges the price list's wait per call (the timeline issues each call
    that much late, from the same function)."""
    host = replace(HW, cores_per_node=2, sync_us={4: {1000.0: 300.0, 9000.0: 100.0}})
    chunk = 2.5e-3
    price = prices.peer_wait_seconds(host, 4, chunk)
    assert price == pytest.approx(300e-6 + (100e-6 - 300e-6) * 1500 / 8000, rel=1e-12)
    mesh = Mesh.planning({"dp": 1, "tp": 4}, 1)
    assert timing.sync_seconds(mesh, [Traffic("all_reduce", ("tp",), NBYTES, 1)], host, chunk) == price
