"""TSP's MLP weight exchange (#43): ``mlp_exchange`` ring (the paper's) or broadcast (each shard
from its owner, as the attention's). The refusals, the analytic count and the predictions need
no processes; the validate runs (float64, every rank: train, prefill, decode) are slow."""

from __future__ import annotations

import pytest

from tspbench.analytic.hardware import load_hardware
from tspbench.analytic.predict import predict
from tspbench.core.errors import WorkloadError
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.dist.comm import summarize
from tspbench.dist.fake_world import run_fake_ranks
from tspbench.measure import fake_cuda
from tspbench.measure.fake import fake_rank
from tspbench.measure.validate import validate
from tspbench.strategy import check_layout, get_strategy

TINY = ModelConfig.preset("tiny")
FLOAT64 = Workload(TINY, batch=2, seq_len=64, dtype="float64")


def test_an_unknown_exchange_names_the_allowed_ones() -> None:
    with pytest.raises(WorkloadError, match=r"mlp_exchange must be one of \['ring', 'broadcast'\]"):
        FLOAT64.with_(mlp_exchange="allgather")


@pytest.mark.parametrize("layout", [Layout("tp", tp=2), Layout("sp", sp=2), Layout("fsdp", fsdp=2)], ids=str)
def test_a_layout_other_than_tsp_refuses_it(layout: Layout) -> None:
    with pytest.raises(WorkloadError, match=r"mlp_exchange \(--mlp-exchange\) .* applies to tsp only"):
        check_layout(layout, FLOAT64.with_(mlp_exchange="broadcast"))


def _calls(exchange: str, mode: str = "train") -> dict[tuple[str, str, str], tuple[int, int]]:
    """(op, phase, group) -> (calls, bytes) of TSP's analytic count (tsp 4, tiny, float64)."""
    records = get_strategy("tsp").comm_volume(
        Layout("tsp", tsp=4), FLOAT64.with_(mlp_exchange=exchange, mode=mode)
    )
    out: dict = {}
    for r in records:
        calls, nbytes = out.get((r.op, r.phase, r.group), (0, 0))
        out[(r.op, r.phase, r.group)] = (calls + r.count, nbytes + r.count * r.msg_bytes)
    return out


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_broadcast_trades_each_pass_s_d_minus_1_shifts_for_d_broadcasts_by_hand(mode: str) -> None:
    """tiny: 2 layers, MLP shard [3 f/4, h] float64. Per layer and pass: D-1 = 3 ring shifts
    become D = 4 broadcasts (channel 1); backward's D accumulator shifts become D reduces
    (channel 0). Everything else (attention, embedding, head) is unchanged."""
    d, layers, shard = 4, TINY.n_layers, 3 * TINY.ffn_hidden // 4 * TINY.hidden * 8
    ring, broadcast = _calls("ring", mode), _calls("broadcast", mode)
    expected = {("send_recv", "forward", "tsp#1"): -(d - 1), ("broadcast", "forward", "tsp#1"): d}
    if mode == "train":
        expected |= {("send_recv", "backward", "tsp#1"): -(d - 1), ("broadcast", "backward", "tsp#1"): d}
        expected |= {("send_recv", "backward", "tsp"): -d, ("reduce", "backward", "tsp"): d}
    for key in ring.keys() | broadcast.keys():
        calls = layers * expected.get(key, 0)
        got = tuple(b - r for b, r in zip(broadcast.get(key, (0, 0)), ring.get(key, (0, 0)), strict=True))
        assert got == (calls, calls * shard), key


def _tokens_per_s(exchange: str, seq_len: int, hardware: str) -> float:
    workload = Workload(ModelConfig.preset("7b"), 1, seq_len, recompute="selective", dtype="bfloat16")
    layout = Layout("tsp", tsp=8)
    hw = load_hardware(hardware)
    return predict(layout, workload.with_(mlp_exchange=exchange), hw).tokens_per_s_per_gpu


def test_on_mi300x_the_broadcast_lifts_short_sequences_and_leaves_long_ones() -> None:
    """A ring shift crosses one xGMI link (48 GB/s); a broadcast over 8 uses all seven (300): at
    16K the ring's shifts outlast the MLP's GEMMs, at 128K both hide."""
    assert _tokens_per_s("broadcast", 16384, "mi300x") > 1.8 * _tokens_per_s("ring", 16384, "mi300x")
    long = _tokens_per_s("broadcast", 131072, "mi300x") / _tokens_per_s("ring", 131072, "mi300x")
    assert 0.99 < long <= 1.0


def test_on_nvswitch_a_shift_gets_the_whole_port_so_the_ring_keeps_its_edge() -> None:
    """H100: send_recv and broadcast both at 360 GB/s; the broadcast's first shard of each pass
    has nothing to hide behind, so the ring is no slower."""
    ratio = _tokens_per_s("broadcast", 16384, "h100") / _tokens_per_s("ring", 16384, "h100")
    assert 0.95 < ratio <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "blocking"])
@pytest.mark.parametrize("d", [2, 4])
def test_broadcast_matches_the_reference_on_every_rank(d: int, overlap: bool) -> None:
    workload = FLOAT64.with_(mlp_exchange="broadcast", overlap=overlap, mode="decode", decode_tokens=2)
    result = validate(Layout("tsp", tsp=d), workload, ("train", "infer", "decode"))
    for key, err in result["max_rel_err"].items():
        assert err <= result["tolerance"], f"tsp {d} broadcast: {key} {err:.2e}"
    assert result["comm_matches_analytic"] and result["passed"]


@pytest.mark.slow
def test_broadcast_under_full_recomputation_with_dp() -> None:
    workload = FLOAT64.with_(mlp_exchange="broadcast", recompute="full")
    result = validate(Layout("tsp", tsp=2, dp=2), workload, ("train",))
    assert result["comm_matches_analytic"] and result["passed"], result["max_rel_err"]


@pytest.mark.slow
def test_the_fake_world_executes_it_with_the_declared_collectives() -> None:
    """Simulated GPU, bf16, tsp 4: the first and last rank's counted collectives equal the
    analytic count, training (selective) and prefill."""
    layout, loads = Layout("tsp", tsp=4), []
    for mode, recompute in (("train", "selective"), ("infer", "none")):
        w = Workload(TINY, 1, 256, mode, recompute, "bfloat16", "cuda", mlp_exchange="broadcast")
        loads.append(w)
    env = fake_cuda.preload_env("cuda")
    ranks = run_fake_ranks(_fake_steps, [0, 3], 4, layout, loads, workers=2, env=env)
    cls = check_layout(layout, loads[0])
    for records in ranks:
        for workload, comm in zip(loads, records, strict=True):
            assert summarize(comm) == summarize(cls.comm_volume(layout, workload)), workload.mode


def _fake_steps(layout: Layout, loads: list[Workload]) -> list[list]:
    return [fake_rank(layout, workload)["comm"] for workload in loads]
