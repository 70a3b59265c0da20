"""The decode model (tspbench.costs.decode, tspbench.analytic.decode, the planner's decode
question), each against a hand calculation from the spec of issue #15: cache bytes counted by
hand, the GEMM roofline's switch at rows* = rate x elt / (2 x HBM bandwidth), TSP's break-even
batch, the planner's ranking at small and large batch, and - once the decode mechanism is
present - the spec's per-step collectives against what each strategy's traffic() declares."""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from dataclasses import replace

import matplotlib as mpl
import numpy as np
import pandas as pd
import pytest

from tspbench.analytic.decode import break_even_batch, predict_decode
from tspbench.analytic.hardware import Hardware, load_hardware
from tspbench.analytic.planner import plan_decode
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.costs.decode import DecodeShape, kv_cache_bytes
from tspbench.report import decode as decode_figures
from tspbench.report import style as report_style
from tspbench.report.build import report_experiment
from tspbench.report.frame import context, prepare
from tspbench.strategy import get_strategy

TINY = ModelConfig.preset("tiny")  # h 64, L 2, 4 heads of d 16, ffn 256, V 512
GQA = ModelConfig.preset("tiny-gqa")  # as tiny, 2 KV heads
SEVEN_B = ModelConfig.preset("7b")
# name, GPUs per node, memory, peak, GEMM, attention TFLOP/s, HBM GB/s, intra GB/s, us, inter GB/s, us
TOY = Hardware("toy", 8, 2**40, 1.0, 1.0, 1.0, 100.0, 1.0, 10.0, 1.0, 10.0)


def shape(
    layout: Layout, batch: int, context: int, tokens: int, dtype: str = "float32", model: ModelConfig = TINY
) -> DecodeShape:
    """The rank's decode shape, as its strategy sizes it."""
    workload = Workload(model, batch, context, "decode", dtype=dtype, decode_tokens=tokens)
    return get_strategy(layout.strategy).for_analysis(layout, workload).decode_shape()


def test_cache_bytes_count_by_hand() -> None:
    # tp_sp 2x2, B 3, S 64, N 5, float32: 2 KV heads per rank, 32 context positions, 2 slots
    per_layer = 2 * 2 * 16 * (3 * 32 + 2 * 5) * 4  # K and V x heads x d x positions x 4 bytes
    assert kv_cache_bytes(TINY, shape(Layout("tp_sp", tp=2, sp=2), 3, 64, 5)) == 2 * per_layer
    # tsp 4, B 5: every head (4), 16 context positions of each of 5 sequences, ceil(5/4) = 2 slots
    assert (
        kv_cache_bytes(TINY, shape(Layout("tsp", tsp=4), 5, 64, 5)) == 2 * 2 * 4 * 16 * (5 * 16 + 2 * 5) * 4
    )
    # tp 2 with grouped KV heads: 1 of the 2 KV heads, every position; bf16
    assert (
        kv_cache_bytes(GQA, shape(Layout("tp", tp=2), 3, 64, 5, "bfloat16", GQA))
        == 2 * 2 * 1 * 16 * 3 * 69 * 2
    )
    # dp: everything (B S + B N positions of all 4 heads); dp degree does not shard a replica
    assert kv_cache_bytes(TINY, shape(Layout("dp", dp=4), 2, 64, 5)) == 2 * 2 * 4 * 16 * 2 * 69 * 4


def test_a_decode_gemm_switches_from_bandwidth_to_compute_bound_at_rows_star() -> None:
    """dp on one GPU, bf16: every GEMM reads its weights for B rows, so GEMM time is
    max(2 B W / rate, 2 W / bandwidth) with W the GEMM weights (elements): the switch is at
    B* = rate x 2 / (2 x bandwidth) = 1e12 x 2 / (2 x 1e11) = 10 rows on the toy profile."""
    w = 2 * (64 * 16 * (2 * 4 + 2 * 4) + 3 * 64 * 256) + 512 * 64  # block GEMMs x L + head, elements
    hw = replace(TOY, hbm_bandwidth_gbs=100.0, gemm_tflops=1.0)
    gemm = {
        b: predict_decode(Layout("dp"), TINY, b, 64, 1, "bfloat16", hw).steps[0].gemm_s for b in (5, 10, 20)
    }
    assert gemm[5] == pytest.approx(2 * w / 100e9)  # bandwidth-bound: the same for 5 rows as for 1
    assert gemm[10] == pytest.approx(2 * w / 100e9) == pytest.approx(2 * 10 * w / 1e12)  # the switch
    assert gemm[20] == pytest.approx(2 * 20 * w / 1e12)  # compute-bound: twice the rows, twice the time


def test_tsp_break_even_batch_against_a_hand_calculation() -> None:
    """TSP 4 on tiny, bf16, toy link (10 us + bytes / 1 GB/s), GEMMs at 1 TFLOP/s, eta 1. An
    attention shard is (2 h + 2 kv) / D x h = 4096 weights (8192 B), an MLP shard 3 f / D x h =
    12288 (24576 B); b slots run 2 b weights FLOPs on a shard; the break-even is the smallest
    b with 2 b weights / rate >= latency + bytes / bandwidth, B = D b."""
    b_attn = math.ceil(1e12 * (10e-6 + 8192 / 1e9) / (2 * 4096))
    b_mlp = math.ceil(1e12 * (10e-6 + 24576 / 1e9) / (2 * 12288))
    even = break_even_batch(TINY, Layout("tsp", tsp=4), "bfloat16", TOY)
    assert (b_attn, b_mlp) == (2221, 1407)
    assert even == {"attention": 4 * b_attn, "mlp": 4 * b_mlp, "batch": 4 * b_attn}
    half = break_even_batch(TINY, Layout("tsp", tsp=4), "bfloat16", replace(TOY, overlap_efficiency=0.5))
    assert half["mlp"] == 4 * math.ceil(0.5 * 1e12 * (10e-6 + 24576 / 1e9) / (2 * 12288))


def test_tsp_step_hides_its_weights_only_beyond_the_break_even_batch() -> None:
    even = break_even_batch(TINY, Layout("tsp", tsp=4), "bfloat16", TOY)["batch"]
    below, above = (
        predict_decode(Layout("tsp", tsp=4), TINY, b, 64, 1, "bfloat16", TOY).steps[0]
        for b in (even // 4, even)
    )
    assert below.comm_exposed_s > below.comm_hidden_s  # weights mostly exposed
    attn, mlp, vocab = 8192, 24576, 512 // 4 * 64 * 2  # shard bytes; the embedding's ring never hides
    embedding_ring = 3 * (10e-6 + vocab / 1e9)
    assert above.comm_exposed_s >= embedding_ring
    hidden_by_hand = 2 * (4 * (10e-6 + attn / 1e9) + 3 * (10e-6 + mlp / 1e9)) + 3 * (10e-6 + vocab / 1e9)
    assert above.comm_hidden_s == pytest.approx(hidden_by_hand, rel=1e-9)  # both block rings and the head's


def test_planner_ranks_by_tpot_small_batch_tp_large_batch_memory() -> None:
    """7B on 8 MI300X, 32K context. At B = 1 every rank of TSP 8 receives 7/8 of the whole
    model each step (about 17.7 GB x 7/8 over 300 GB/s >= 50 ms), while TP 8 reads 1/8 of
    the weights (2.2 GB at 5.3 TB/s, 0.4 ms) and moves [1, h] all-reduces: TP is first. At
    B = 16 the cache alone (2 L h S x 2 B = 16 GiB per sequence) makes DP's replica need 256
    GiB: rejected, out of memory."""
    hw = load_hardware("mi300x")
    small = plan_decode(SEVEN_B, 8, hw, 1, 32768, 4)
    tpots = [c.prediction.tpot_s() for c in small.ranked]
    assert tpots == sorted(tpots)
    assert small.ranked[0].layout == Layout("tp", tp=8)
    tsp = next(c for c in small.ranked if c.layout == Layout("tsp", tsp=8))
    assert tsp.prediction.tpot_s() >= 7 / 8 * SEVEN_B.n_params * 2 / 300e9
    large = plan_decode(SEVEN_B, 8, hw, 16, 32768, 4)
    dp = next(c for c in large.rejected if c.layout == Layout("dp", dp=8))
    assert dp.reason.startswith("out of memory") and hw.usable_bytes < 16 * 2 * 32 * 4096 * 32768 * 2
    assert Layout("tp", tp=8) in [c.layout for c in large.ranked]


def test_prediction_records_carry_the_decode_columns() -> None:
    p = predict_decode(Layout("tp_sp", tp=2, sp=2), TINY, 3, 64, 8, "float32", TOY)
    r = p.record()
    assert r["tpot_p50_s"] <= r["tpot_p90_s"] <= r["tpot_p99_s"]  # later steps attend more keys
    assert r["peak_memory_kv_cache_bytes"] == kv_cache_bytes(
        TINY, shape(Layout("tp_sp", tp=2, sp=2), 3, 64, 8)
    )
    assert r["decode_tokens_per_s"] == pytest.approx(3 / r["tpot_p50_s"])
    assert r["ttft_s"] == pytest.approx(p.prefill.step_time_s) and r["status"] == "completed"


# ----------------------------------------------------------------------------- against the mechanism


def declared_decode_traffic(layout: Layout, workload: Workload) -> Counter:
    """What the strategy declares for the decode phase of a run (its step_traffic, which
    validate compares with what the ranks count): (op, axes, channel, message bytes) -> calls,
    over groups of more than one rank."""
    sized = get_strategy(layout.strategy).for_analysis(layout, workload)
    out: Counter = Counter()
    for t in sized.step_traffic():
        if t.phase == "decode" and sized.mesh.size(*t.axes) > 1:
            out[(t.op, tuple(t.axes), t.channel, t.msg_bytes)] += t.count
    return out


# one decode step's collectives of tiny (h 64, L 2, 4 heads of d 16, ffn 256, V 512), float32, B 3,
# counted by hand from the spec of issue #15: (op, axes, channel, message bytes) -> calls
SPEC = {
    Layout("dp", dp=2): {},
    Layout("tp", tp=2): {  # 2 L + 1 all-reduces [b, h] (the blocks and the embedding), logits [b, V]
        ("all_reduce", ("tp",), 0, 3 * 64 * 4): 5, ("all_gather", ("tp",), 0, 3 * 512 * 4): 1,
    },
    Layout("sp", sp=4): {  # per layer: q all-gather P b n d, partials all-to-all P b n (d + 1), b = 1
        ("all_gather", ("sp",), 0, 4 * 4 * 16 * 4): 2, ("all_to_all", ("sp",), 0, 4 * 4 * 17 * 4): 2,
    },
    Layout("tsp", tsp=4): {  # per layer D broadcasts of W_attn, D - 1 shifts of W_mlp; n / D heads
        ("broadcast", ("tsp",), 1, 64 * 64 * 4): 8, ("send_recv", ("tsp",), 1, 192 * 64 * 4): 6,
        ("send_recv", ("tsp",), 1, 128 * 64 * 4): 6,  # W_vocab: D - 1 for the embedding, D - 1 the head
        ("all_gather", ("tsp",), 0, 4 * 16 * 4): 8, ("all_to_all", ("tsp",), 0, 4 * 17 * 4): 8,
    },
    Layout("fsdp", fsdp=4): {  # the root's gather (padded rows) and every block's
        ("all_gather", ("fsdp",), 0, (2 * 512 * 64 + 64) * 4): 1,
        ("all_gather", ("fsdp",), 0, (4 * 64 * 64 + 3 * 256 * 64 + 2 * 64) * 4): 2,
    },
    Layout("tp_sp", tp=2, sp=2): {  # tp's on b = 2 slots, sp's with n / T = 2 heads
        ("all_reduce", ("tp",), 0, 2 * 64 * 4): 5, ("all_gather", ("tp",), 0, 2 * 512 * 4): 1,
        ("all_gather", ("sp",), 0, 2 * 2 * 2 * 16 * 4): 2, ("all_to_all", ("sp",), 0, 2 * 2 * 2 * 17 * 4): 2,
    },
    Layout("fsdp_sp", sp=4): {  # fsdp's gathers over sp, and sp's q / partials
        ("all_gather", ("sp",), 0, (2 * 512 * 64 + 64) * 4): 1,
        ("all_gather", ("sp",), 0, (4 * 64 * 64 + 3 * 256 * 64 + 2 * 64) * 4): 2,
        ("all_gather", ("sp",), 0, 4 * 4 * 16 * 4): 2, ("all_to_all", ("sp",), 0, 4 * 4 * 17 * 4): 2,
    },
}  # fmt: skip


@pytest.mark.parametrize("layout", list(SPEC), ids=lambda lay: lay.describe())
def test_each_strategy_declares_the_specs_decode_traffic(layout: Layout) -> None:
    """Each plugin's decode_traffic (the only declaration: the decode model prices it, validate
    compares it with what the ranks count) against the spec's table, counted by hand, over the
    N steps of a run."""
    n = 3
    workload = Workload(TINY, 3, 64, "decode", dtype="float32", decode_tokens=n)
    assert declared_decode_traffic(layout, workload) == Counter({k: v * n for k, v in SPEC[layout].items()})


def test_the_decode_model_prices_the_traffic_its_strategy_declares() -> None:
    """Bus bytes per step in the record are those of the plugin's declaration (no second table)."""
    workload = Workload(TINY, 3, 64, "decode", dtype="float32", decode_tokens=1)
    for layout in SPEC:
        p = predict_decode(layout, TINY, 3, 64, 1, "float32", TOY)
        sized = get_strategy(layout.strategy).for_analysis(layout, workload)
        declared = sum(r.bus_bytes for r in sized.comm_volume(layout, workload) if r.phase == "decode")
        assert p.record()["decode_comm_bytes_per_step"] == pytest.approx(declared, rel=1e-12)


@pytest.mark.slow
def test_decode_report_draws_tpot_figures_and_marks_tsp_break_even(tmp_path) -> None:
    """Projected decode records (tiny, toy profile: TSP 4 breaks even at B = 8,884) through the
    report: both decode figures drawn, the break-even named on the TPOT figure; a report of
    records without decode does not list the decode figures as missing."""
    rows = []
    for layout, batch in itertools.product((Layout("tp", tp=4), Layout("tsp", tsp=4)), (4, 16, 8192, 16384)):
        p = predict_decode(layout, TINY, batch, 64, 4, "bfloat16", TOY)
        rows.append({"strategy": layout.strategy, **layout.to_dict(), "world_size": 4, "model": "tiny",
                     "batch": batch, "seq_len": 64, "mode": "decode", "dtype": "bfloat16", "device": "cuda",
                     "recompute": "none", **p.record()})  # fmt: skip
    frame = pd.DataFrame(rows)
    out = report_experiment(frame, tmp_path / "decode")
    assert {"tpot_vs_batch", "tpot_tails"} <= set(out.figures)
    df = prepare(frame)
    with mpl.rc_context(report_style.RC):
        fig = decode_figures.tpot_vs_batch(df, context(df))
    notes = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("from B = 8,884" in n for n in notes), notes
    plain = report_experiment(frame.assign(mode="infer"), tmp_path / "infer")
    assert not {"tpot_vs_batch", "tpot_tails"} & (set(out.skipped) | set(plain.skipped) | set(plain.figures))


# ----------------------------------------------------------------------------- any number of tokens


def test_a_huge_number_of_decode_tokens_is_refused_or_answered_within_a_second(capsys) -> None:
    """plan-decode's time does not grow with --decode-tokens: beyond what the model serves it is
    refused at once, as predict --mode decode refuses it (one line, exit 2); a model that serves
    10^12 tokens is ranked at once (a prediction prices the few steps its percentiles need)."""
    from tspbench.cli.main import main
    from tspbench.core.errors import WorkloadError

    hw = load_hardware("mi300x")

    def seconds(run) -> float:  # this process's CPU time: the work done, not the wait on a busy host
        start = time.process_time()
        run()
        return time.process_time() - start

    def refused() -> None:
        with pytest.raises(SystemExit) as flag:  # past the flag's bound: argparse's one line
            main(["plan-decode", "--gpus", "8", "--seq-len", "1024", "--decode-tokens", str(10**12)])
        assert flag.value.code == 2
        with pytest.raises(WorkloadError, match="exceeds max_seq_len"):
            plan_decode(SEVEN_B, 8, hw, 1, 1024, 10**12)

    assert seconds(refused) < 1.0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--decode-tokens" in err and "1,000,000,000,000" in err  # one line
    served = replace(SEVEN_B, max_seq_len=2 * 10**12)
    plans = []
    assert seconds(lambda: plans.append(plan_decode(served, 8, hw, 1, 1024, 10**12))) < 3.0
    assert plans[0].rejected and all(c.reason for c in plans[0].rejected)
    p = predict_decode(Layout("tsp", tsp=8), served, 8, 1024, 10**12, "bfloat16", hw)
    assert seconds(lambda: p.record()) < 3.0
    assert p.tpot_s(50) <= p.tpot_s(99) and len(p.steps) == 10**12


@pytest.mark.parametrize("hardware", ["cpu", "mi300x"])
@pytest.mark.parametrize(
    "layout", [Layout("tp_sp", tp=2, sp=2), Layout("tsp", tsp=4), Layout("fsdp", fsdp=2)]
)
def test_tpot_percentiles_priced_from_a_few_steps_equal_numpys_over_every_step(hardware, layout) -> None:
    """The closed form of the percentiles against numpy over all N steps (the CPU profile waits
    on peers: its steps still never get cheaper)."""
    p = predict_decode(layout, TINY, 3, 64, 37, "float32", load_hardware(hardware))
    every = [s.step_s for s in p.steps[:]]
    assert all(b >= a * (1 - 1e-12) for a, b in itertools.pairwise(every))  # in order, to rounding
    for q in (0, 50, 90, 99, 100):
        assert p.tpot_s(q) == pytest.approx(float(np.percentile(every, q)), rel=1e-12)


VIEW_OPS = frozenset(
    ("view", "_unsafe_view", "t", "transpose", "permute", "expand", "select", "slice", "split", "unsqueeze",
     "squeeze", "detach", "alias", "as_strided", "reshape")
)  # fmt: skip


def _kernel_ops_of_a_decode_step(layers: int) -> int:
    """On one rank: the aten ops that are not views in one bf16 decode step of a dp model."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from tspbench.measure.runner import RankRun

    model = replace(ModelConfig.preset("small"), n_layers=layers)
    run = RankRun(Layout("dp"), Workload(model, 2, 64, "decode", "none", "bfloat16", "cpu", decode_tokens=2))
    cache, seen = run.strategy.allocate_cache(), []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Ops():
        run.strategy.decode_step(run.model, torch.zeros(2, 1, dtype=torch.long), cache, 1)
    return sum(name not in VIEW_OPS for name in seen)


def test_decode_kernels_are_the_ops_a_step_runs() -> None:
    """The kernels the decode model prices (costs.decode.decode_kernels) are the non-view ops of
    a real decode step: one layer more adds KERNELS_PER_LAYER, the rest is the fixed part; a
    graphed step's launches cost kernels x graph_kernel_us + one replay."""
    from tspbench.analytic import prices
    from tspbench.costs import decode as decode_costs
    from tspbench.dist.launch import launch

    one, two = (launch(_kernel_ops_of_a_decode_step, 1, n)[0] for n in (1, 2))
    model = replace(ModelConfig.preset("small"), n_layers=2)
    assert decode_costs.decode_kernels(model) == two
    assert two - one == decode_costs.KERNELS_PER_LAYER
    hw = replace(load_hardware("h200"), graph_kernel_us=0.84, graph_replay_us=4.35)
    assert prices.graph_launch_seconds(hw, 1000) == pytest.approx((1000 * 0.84 + 4.35) * 1e-6)
    assert prices.graph_launch_seconds(load_hardware("cpu"), 1000) == 0.0
