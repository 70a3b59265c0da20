"""The time model's terms, each against a hand calculation; hardware profiles' validation and
provenance; calibrate's profile is one predict accepts. (Whether the model matches measured
step times is a measurement, not a unit test: results/cpu_reference and the README hold it.)"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from tspbench.analytic.hardware import RATES, Collective, Hardware, available_hardware, load_hardware
from tspbench.analytic.predict import predict
from tspbench.analytic.timing import StepTime, comm_seconds
from tspbench.calibrate.probes import Rate, link_figures
from tspbench.calibrate.profile import calibrate
from tspbench.calibrate.profiled import elementwise_seconds
from tspbench.cli import main
from tspbench.core.errors import HardwareError
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.dist.mesh import Mesh
from tspbench.model.transformer import Transformer
from tspbench.strategy import check_layout
from tspbench.strategy.traffic import Traffic

SMALL = Workload(ModelConfig.preset("small"), 1, 2048, "train", "none", "float32", "cpu")
BASE = Hardware("toy", 8, 2**34, 1.0, 0.1, 0.05, 20.0, 1.0, 100.0, 1.0, 100.0)


def test_ranks_that_outnumber_cores_share_them() -> None:
    alone = predict(Layout("tp", tp=4), SMALL, BASE).time
    shared = predict(Layout("tp", tp=4), SMALL, replace(BASE, cores_per_node=2)).time
    assert shared.share == 0.5 and alone.share == 1.0
    assert shared.compute_s == pytest.approx(2 * alone.compute_s)  # 4 single-thread ranks, 2 cores
    measured = replace(BASE, cores_per_node=2, contention={4: 0.4})
    assert predict(Layout("tp", tp=4), SMALL, measured).time.compute_s == pytest.approx(alone.compute_s / 0.4)


def test_gemm_and_attention_rates_apply_to_their_flops() -> None:
    p = predict(Layout("sp", sp=4), SMALL, BASE)
    flops, t = p.flops, p.time
    assert t.gemm_s == pytest.approx(flops.gemm / 0.1e12)
    causal = flops.attention * flops.causal_fraction
    assert flops.causal_fraction == pytest.approx(2 / 9)  # zigzag over 4: 2 diagonal blocks of 2P + 1
    assert t.attention_s == pytest.approx((flops.attention - causal) / 0.05e12 + causal / 0.1e12)


def test_causal_rates_follow_the_square_they_are_measured_at() -> None:
    hw = replace(BASE, attention_causal_by_size={128: 0.02, 2048: 0.06})
    assert hw.causal_tflops(64) == 0.02 and hw.causal_tflops(4096) == 0.06  # clamped at the ends
    assert hw.causal_tflops(512) == pytest.approx(0.04)  # halfway in log(side)
    tp, tsp = Layout("tp", tp=4), Layout("tsp", tsp=4)
    assert predict(tp, SMALL, hw).flops.causal_block == 2048  # TP: the whole sequence, unsharded
    assert predict(tsp, SMALL, hw).flops.causal_block == 256  # zigzag chunks of S / 2D
    assert BASE.causal_tflops(512) == pytest.approx(0.1)  # no table: twice the rectangle rate


def test_rectangles_are_rated_at_their_query_chunk() -> None:
    """Zigzag rectangles (a chunk of S / 2P queries against the keys before it) at the rate
    measured for that chunk; the causal diagonal blocks at theirs."""
    hw = replace(BASE, attention_by_size={128: 0.02, 512: 0.04}, attention_causal_by_size={256: 0.08})
    assert hw.rectangle_tflops(256) == pytest.approx(0.03)  # halfway in log(chunk)
    assert hw.rectangle_tflops(4096) == 0.04 and BASE.rectangle_tflops(256) == 0.05  # clamped; no table
    p = predict(Layout("sp", sp=4), SMALL, hw)  # chunk 2048 / 8 = 256
    causal = p.flops.attention * p.flops.causal_fraction
    assert p.time.attention_s == pytest.approx((p.flops.attention - causal) / 0.03e12 + causal / 0.08e12)


def test_attention_shares_the_cores_at_its_own_measured_rate() -> None:
    """Ranks outnumbering cores: attention at the attention share calibrate measured, GEMMs and
    element-wise ops at the GEMM share; without an attention table, the GEMM share for all."""
    gemm_only = replace(BASE, cores_per_node=2, contention={4: 0.4})
    both = replace(gemm_only, attention_contention={4: 0.5})
    alone = predict(Layout("tp", tp=4), SMALL, BASE).time
    shared, split = (predict(Layout("tp", tp=4), SMALL, hw).time for hw in (gemm_only, both))
    assert shared.attention_s == pytest.approx(alone.attention_s / 0.4)
    assert split.attention_s == pytest.approx(alone.attention_s / 0.5)
    assert split.gemm_s == pytest.approx(alone.gemm_s / 0.4) == shared.gemm_s
    assert replace(BASE, attention_contention={4: 0.5}).attention_share(4) == 1.0  # a GPU owns its device


def test_collective_figures_are_the_line_through_every_size() -> None:
    """calibrate's fit recovers latency and bus bandwidth from seconds per call at several
    sizes (exact on a line; a noisy point moves it less than a two-point fit would)."""
    line = [(b, Rate(1e-3 + 1.5 * b / 2e9, 0.0, 5)) for b in (4096, 1 << 20, 16 << 20)]
    assert link_figures("all_reduce", 4, line) == pytest.approx((1000.0, 2.0))  # bus factor 2(n-1)/n
    noisy = [line[0], (line[1][0], Rate(2 * line[1][1].value, 0.0, 5)), line[2]]
    latency, bandwidth = link_figures("all_reduce", 4, noisy)
    assert 1000.0 < latency < 2 * line[1][1].value * 1e6 and 1.0 < bandwidth < 2.5


def test_measured_collective_figures_replace_the_link_figures() -> None:
    tp2 = Layout("tp", tp=2)
    plain = predict(tp2, SMALL, BASE).time.comm_exposed_s
    entry = Collective("all_reduce", 2, 2, latency_us=500.0, bandwidth_gbs=0.5)
    measured = predict(tp2, SMALL, replace(BASE, collectives=[entry])).time.comm_exposed_s
    calls = [r for r in predict(tp2, SMALL, BASE).comm if r.op == "all_reduce"]
    by_hand = sum(r.count * (500e-6 + 2 * (2 - 1) / 2 * r.msg_bytes / 0.5e9) for r in calls)
    others = plain - sum(r.count * (100e-6 + r.msg_bytes / 1e9) for r in calls)  # 2(n-1)/n = 1
    assert measured == pytest.approx(others + by_hand)


def test_batched_gradient_all_reduces_cost_their_batched_latency() -> None:
    """The gradient all-reduces after backward are issued async together (Strategy.sync_grads):
    each at the batched latency calibrate measured; every other call at the blocking one."""
    sp2 = Layout("sp", sp=2)  # weights replicated: every gradient all-reduced over the SP group
    blocking = Collective("all_reduce", 2, 2, latency_us=500.0, bandwidth_gbs=0.5)
    batched = replace(blocking, batched_latency_us=100.0)
    times = [
        predict(sp2, SMALL, replace(BASE, collectives=[c])).time.comm_exposed_s for c in (blocking, batched)
    ]
    grads = [r for r in predict(sp2, SMALL, BASE).comm if r.op == "all_reduce" and r.phase == "optimizer"]
    assert grads and sum(r.count for r in grads) == len(grads)  # one call per replicated gradient
    assert times[0] - times[1] == pytest.approx(len(grads) * 400e-6)


def test_every_wait_on_peers_costs_the_sync_measured_after_as_much_compute() -> None:
    """Ranks sharing cores wait for each other once per blocking call, and once for the batched
    gradient all-reduces together, each wait the one calibrate measured after the same length
    of compute (the step's compute over its waits); ranks that own their devices never."""
    sp4 = Layout("sp", sp=4)
    p = predict(sp4, SMALL, BASE)
    waits = sum(r.count for r in p.comm if r.phase != "optimizer") + 1  # + the gradient batch
    chunk_us = p.time.compute_s / waits * 1e6
    table = {chunk_us / 2: 100.0, chunk_us * 2: 400.0}  # halfway between: 200 us
    synced = predict(sp4, SMALL, replace(BASE, sync_us={4: table, 2: {1.0: 1e6}})).time.comm_exposed_s
    assert synced - p.time.comm_exposed_s == pytest.approx(waits * 200e-6)
    assert predict(sp4, SMALL, replace(BASE, sync_us={2: table})).time.comm_exposed_s == p.time.comm_exposed_s


def test_the_wait_grows_with_the_compute_before_it_up_to_the_longest_measured() -> None:
    hw = replace(BASE, sync_us={4: {1000.0: 200.0, 5000.0: 1000.0}})
    assert hw.sync_s(4, 500e-6) == pytest.approx(100e-6)  # proportional below the shortest chunk
    assert hw.sync_s(4, 3000e-6) == pytest.approx(600e-6)  # linear between
    assert hw.sync_s(4, 1.0) == pytest.approx(1000e-6) and hw.sync_s(2, 1.0) == 0.0  # flat above; unmeasured


def test_overlap_efficiency_decides_what_hidden_traffic_costs() -> None:
    step = StepTime(gemm_s=1.0, attention_s=0.5, elementwise_s=0.5, comm_exposed_s=0.2, comm_hidden_s=1.5,
                    overlap_efficiency=1.0, share=1.0)  # fmt: skip
    assert step.step_s == pytest.approx(2.0 + 0.2)  # all 1.5 s hidden under 2 s of compute
    assert replace(step, overlap_efficiency=0.0).step_s == pytest.approx(2.0 + 0.2 + 1.5)
    assert replace(step, overlap_efficiency=0.5).step_s == pytest.approx(2.0 + 0.2 + 0.75)
    assert replace(step, comm_hidden_s=3.0).step_s == pytest.approx(2.0 + 0.2 + 1.0)  # outlasts compute
    breakdown = replace(step, overlap_efficiency=0.5).to_dict()
    assert breakdown["compute_s"] + breakdown["comm_exposed_s"] == pytest.approx(breakdown["step_time_s"])


def test_a_transfer_with_a_window_hides_at_most_the_compute_of_its_window() -> None:
    """A hidden call declared with a window overlaps only that many GEMM FLOPs (at the profile's
    GEMM rate) and exposes the rest, call by call; without a window it may hide anywhere."""
    mesh = Mesh({"tsp": 2}, create=False)
    shift = Traffic("send_recv", ("tsp",), 2**26, 10, hidden=True)
    exposed, hidden = comm_seconds(mesh, [shift], BASE)
    call = hidden / 10
    assert exposed == 0.0 and call > 0
    flops_per_second = BASE.gemm_tflops * 1e12
    quarter = replace(shift, window_flops=call / 4 * flops_per_second)
    assert comm_seconds(mesh, [quarter], BASE) == pytest.approx((10 * call * 3 / 4, 10 * call / 4))
    assert comm_seconds(mesh, [quarter], BASE, share=0.5) == pytest.approx((10 * call / 2, 10 * call / 2))
    longer = replace(shift, window_flops=2 * call * flops_per_second)
    assert comm_seconds(mesh, [longer], BASE) == pytest.approx((0.0, 10 * call))
    assert comm_seconds(mesh, [replace(shift, window_flops=0.0)], BASE) == pytest.approx((10 * call, 0.0))


def test_transfers_that_share_a_window_add_up_before_it_hides_them() -> None:
    """Two calls of one phase naming the same window are in flight together on one link: a
    window that hides each alone (1.5 calls long) hides 1.5 of the 2 calls they take together;
    the same two windows named apart hide both; another phase's window is another window."""
    mesh = Mesh({"tsp": 2}, create=False)
    shift = Traffic("send_recv", ("tsp",), 2**26, 10, "backward", hidden=True)
    call = comm_seconds(mesh, [shift], BASE)[1] / 10
    window = 1.5 * call * BASE.gemm_tflops * 1e12
    weights = replace(shift, window_flops=window, window="shard")
    gradients = replace(weights, channel=1)
    assert comm_seconds(mesh, [weights, gradients], BASE) == pytest.approx((10 * call / 2, 10 * 1.5 * call))
    apart = [weights, replace(gradients, window="other shard")]
    assert comm_seconds(mesh, apart, BASE) == pytest.approx((0.0, 20 * call))
    forward = [weights, replace(gradients, phase="forward")]
    assert comm_seconds(mesh, forward, BASE) == pytest.approx((0.0, 20 * call))


def test_a_blocking_call_queued_behind_a_window_waits_for_what_its_transfers_still_hold() -> None:
    """A window's transfers (2 calls long together per occurrence, 10 occurrences) issued before
    a blocking gather, with 0.5 calls of compute between them: the gather waits 1.5 calls each
    time. Where the window's own compute (1.5 calls) already exposes 0.5 of them, the gather
    waits the other 1: the two do not count the same link time twice. Unbounded windows (FSDP's)
    expose nothing of their own; another phase's window holds nothing back."""
    mesh = Mesh({"tsp": 2}, create=False)
    shift = Traffic("send_recv", ("tsp",), 2**26, 10, "backward", hidden=True, window="block")
    call = comm_seconds(mesh, [shift], BASE)[1] / 10
    flops = call * BASE.gemm_tflops * 1e12  # one call's time of compute
    pair = [shift, replace(shift, channel=1)]
    gather = Traffic("all_gather", ("tsp",), 2**20, 10, "backward", queue="block", queue_flops=0.5 * flops)
    alone = comm_seconds(mesh, [gather], BASE)[0]
    assert comm_seconds(mesh, [*pair, gather], BASE) == pytest.approx((alone + 10 * 1.5 * call, 20 * call))
    bounded = [replace(t, window_flops=1.5 * flops) for t in pair]
    exposed, hidden = comm_seconds(mesh, [*bounded, gather], BASE)
    assert (exposed, hidden) == pytest.approx((alone + 10 * 0.5 * call + 10 * 1.0 * call, 10 * 1.5 * call))
    elsewhere = replace(gather, phase="forward")
    assert comm_seconds(mesh, [*pair, elsewhere], BASE)[0] == pytest.approx(alone)


def test_element_wise_time_follows_the_profiles_passes() -> None:
    """Doubling every pass doubles the element-wise seconds and nothing else; a forward has no
    optimizer term, so only its own pass count moves it."""
    measured = replace(BASE, elementwise_passes={"train": 12.0, "infer": 4.0, "optimizer": 12.0})
    base = predict(Layout("tp", tp=2), SMALL, measured).time
    doubled = predict(
        Layout("tp", tp=2),
        SMALL,
        replace(BASE, elementwise_passes={"train": 24.0, "infer": 8.0, "optimizer": 24.0}),
    ).time
    assert doubled.elementwise_s == pytest.approx(2 * base.elementwise_s)
    assert (doubled.gemm_s, doubled.attention_s) == (base.gemm_s, base.attention_s)
    infer = replace(SMALL, mode="infer")
    fwd = predict(Layout("tp", tp=2), infer, measured).time
    other = replace(BASE, elementwise_passes={"train": 1.0, "infer": 4.0, "optimizer": 1.0})
    assert predict(Layout("tp", tp=2), infer, other).time.elementwise_s == pytest.approx(fwd.elementwise_s)


def test_a_fully_recomputed_step_adds_a_forwards_element_wise_passes() -> None:
    """Recomputing every block runs its forward again: at train 12 + forward 4 passes it moves
    what a step without recomputation moves at train 16."""
    passes = replace(BASE, elementwise_passes={"train": 12.0, "infer": 4.0})
    full = predict(Layout("tp", tp=2), replace(SMALL, recompute="full"), passes).time
    sixteen = replace(BASE, elementwise_passes={"train": 16.0, "infer": 4.0})
    assert full.elementwise_s == pytest.approx(predict(Layout("tp", tp=2), SMALL, sixteen).time.elementwise_s)


@pytest.mark.parametrize(("strategy", "element_bytes"), [("dp", 96), ("fsdp", 8 * 4)])
def test_without_measured_passes_the_optimizer_costs_what_its_step_moves(
    strategy: str, element_bytes: int
) -> None:
    """On a GPU in bfloat16, AdamW on float32 master copies moves 96 B a parameter (kernels
    listed in tspbench.model.optim and recorded in tests/measure/test_trace.py), FSDP2's fused AdamW on
    its float32 shards 8 x 4 B; a profile that measured 1 pass over the parameter bytes instead
    moves 2 B (bfloat16) or 4 B (float32) a parameter."""
    workload = replace(SMALL, dtype="bfloat16", device="cuda")
    with torch.device("meta"):
        n_params = sum(p.numel() for p in Transformer(workload.model).parameters())
    counted = replace(BASE, elementwise_passes={"train": 12.0, "infer": 4.0})
    one_pass = replace(BASE, elementwise_passes={"train": 12.0, "infer": 4.0, "optimizer": 1.0})
    layout = Layout(strategy, **{strategy: 1})
    diff = (
        predict(layout, workload, counted).time.elementwise_s
        - predict(layout, workload, one_pass).time.elementwise_s
    )
    held = 2 if strategy == "dp" else 4
    bandwidth = BASE.hbm_bandwidth_gbs * 1e9
    assert diff == pytest.approx(n_params * (element_bytes - held) / bandwidth, rel=1e-9)


def test_every_shipped_profile_says_where_each_rate_comes_from() -> None:
    for name in available_hardware():
        hw = load_hardware(name)
        for key in (*RATES, "memory_bytes"):
            if key == "attention_causal_tflops" and not hw.attention_causal_tflops:
                continue
            source = hw.source_of(key)
            kinds = ("datasheet", "assumed", "measured", "carried", "fitted")
            assert source.startswith(kinds), (name, key, source)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gemm_tflops": None}, r"gemm_tflops: expected a number, got None"),
        ({"gemm_tflops": -3}, r"gemm_tflops: must be > 0, got -3"),
        ({"hbm_bandwidth_gbs": "fast"}, r"hbm_bandwidth_gbs: expected a number, got 'fast'"),
        ({"overlap_efficiency": 1.5}, r"overlap_efficiency: must be in \(0, 1\]"),
        ({"collectives": [{"op": "all_reduce"}]}, r"collectives\[0\]: expected keys"),
        ({"elementwise_passes": {"train": -1}}, r"elementwise_passes\.train: must be > 0, got -1"),
        ({"elementwise_passes": {"backward": 3}}, r"elementwise_passes: expected a mapping with keys among"),
        ({"sync_us": {4: {1000.0: -1.0}}}, r"sync_us\.4\.1000\.0: must be >= 0, got -1"),
        ({"sync_us": {4: 3.0}}, r"sync_us: expected"),
        ({"attention_by_size": [128]}, r"attention_by_size: expected a mapping of sizes to numbers"),
    ],
)
def test_a_bad_profile_field_is_one_line_naming_file_and_key(
    tmp_path: Path, change: dict, message: str
) -> None:
    data = yaml.safe_load((Path(__file__).parents[2] / "tspbench/analytic/profiles/h100.yaml").read_text())
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**data, **change}))
    with pytest.raises(HardwareError, match=rf"bad\.yaml: {message}"):
        load_hardware(str(path))
    missing = {k: v for k, v in data.items() if k != "gpus_per_node"}
    path.write_text(yaml.safe_dump(missing))
    with pytest.raises(HardwareError, match=r"bad\.yaml: missing key\(s\) \['gpus_per_node'\]"):
        load_hardware(str(path))


def test_the_cli_refuses_a_bad_profile_in_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\ngpus_per_node: eight\n")
    code = main(["predict", "--strategy", "tp", "--tp", "2", "--hardware", str(path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "bad.yaml" in err


@pytest.mark.slow
def test_calibrate_writes_a_profile_predict_accepts(tmp_path: Path) -> None:
    result = calibrate(ranks=2, model=ModelConfig.preset("tiny"), seq_len=256, repeats=2, quick=True)
    path = tmp_path / "here.yaml"
    path.write_text(yaml.safe_dump(result.profile, sort_keys=False))
    hw = load_hardware(str(path))
    assert hw.cores_per_node and set(hw.contention) == {1, 2}
    assert {(c.op, c.group_size) for c in hw.collectives} >= {("all_reduce", 2), ("send_recv", 2)}
    assert 0.0 <= hw.overlap_efficiency <= 1.0
    for key in ("gemm_tflops", "attention_tflops", "attention_causal_tflops", "hbm_bandwidth_gbs",
                "elementwise_passes"):  # fmt: skip
        assert hw.source_of(key).startswith("measured:"), key
    assert set(hw.elementwise_passes) == {"train", "infer", "optimizer"}  # measured, all three
    assert all(v > 0 for v in hw.elementwise_passes.values())
    assert hw.source_of("inter_node_bandwidth_gbs").startswith("assumed:")
    for key in ("attention_causal_by_size", "attention_by_size", "attention_contention"):
        assert len(getattr(hw, key)) >= 2 and hw.source_of(key).startswith("measured"), key
    assert (
        set(hw.sync_us) == {2} and len(hw.sync_us[2]) == 3 and hw.source_of("sync_us").startswith("measured")
    )
    assert all(c.batched_latency_us for c in hw.collectives if c.op == "all_reduce")
    p = predict(Layout("tsp", tsp=2), SMALL, hw)
    assert math.isfinite(p.step_time_s) and p.step_time_s > p.time.compute_s > 0


def test_the_element_wise_probe_counts_element_wise_ops_and_not_gemms() -> None:
    """GEMMs (and their dispatch) are not element-wise time; a product of the same tensors is.
    What the probe may count beside the GEMMs (a few tiny checks per call) stays under 5% of
    their wall time; counting the GEMMs would count nearly all of it. The least of three runs,
    so that one descheduled check on a loaded host does not decide it."""
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    shares = []
    for _ in range(3):
        start = time.perf_counter()
        gemm_only, _ = elementwise_seconds(lambda: [a @ b for _ in range(20)])
        shares.append(gemm_only / (time.perf_counter() - start))
    assert min(shares) < 0.05  # what is left: conjugation checks, no arithmetic
    mul_only, optimizer = elementwise_seconds(lambda: [a * b for _ in range(20)])
    assert mul_only > 0.0 and optimizer == 0.0


@pytest.mark.parametrize("degree", [2, 4])
def test_a_tsp_rank_does_the_element_wise_work_of_an_sp_rank(degree: int) -> None:
    """A TSP rank runs its own tokens through every head block and MLP shard, as an SP rank of
    the same degree runs its own through whole weights: the same activations are computed, even
    though TSP saves fewer of them (its backward recomputes the rest)."""
    for mode in ("train", "infer"):
        w = replace(SMALL, mode=mode)
        tsp, sp = (
            check_layout(lay, w).for_analysis(lay, w)
            for lay in (Layout("tsp", tsp=degree), Layout("sp", sp=degree))
        )
        assert tsp.elementwise_layer_bytes() == sp.elementwise_layer_bytes()
        assert tsp.activation_terms().saved_layer["none"] < sp.activation_terms().saved_layer["none"]
