"""Decode: a KV-cache prefill then greedy steps, for every registered strategy.

The reference's cached loop is checked against recomputing the whole sequence without a cache
(no cache code involved); every strategy against the reference in float64 at world 2 and 4 and
dp compositions (same greedy tokens at every step, every step's logits within 1e-9, counted
collectives equal to the analytic count and to the dispatcher's). Bench records carry the
decode columns; bad input is one line, exit 2, before anything starts.
"""

from __future__ import annotations

import math

import pytest
import torch

from tspbench.analytic.profile_choice import choose_profile
from tspbench.cli.main import main
from tspbench.core.errors import WorkloadError
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.measure.bench import bench
from tspbench.measure.validate import validate
from tspbench.model.reference import Reference, single_threaded
from tspbench.strategy import get_strategy, iter_strategies

pytestmark = pytest.mark.slow  # multi-rank runs, sweeps or Slurm: make test, not make check

TINY = ModelConfig.preset("tiny")
STEPS = 3
# B = 3: with P = 2 or 4 sequence ranks some slots are padding (b = ceil(3 / P)).
FLOAT64 = Workload(TINY, batch=3, seq_len=16, mode="decode", dtype="float64", decode_tokens=STEPS)


def decode_layouts(cls: type) -> list[Layout]:
    axes = cls.axes or ("dp",)
    if len(axes) > 1:  # tp_sp: 2 x 2
        return [Layout(cls.name, **dict.fromkeys(axes, 2))]
    return [Layout(cls.name, **{axes[0]: 2}), Layout(cls.name, **{axes[0]: 4})]


CASES = [layout for cls in iter_strategies() for layout in decode_layouts(cls)]
CASES += [Layout("tsp", dp=2, tsp=2), Layout("tp", dp=2, tp=2), Layout("fsdp_sp", dp=2, sp=2)]


def test_reference_decode_equals_recomputing_without_a_cache() -> None:
    workload = FLOAT64.with_(model=ModelConfig.preset("tiny-gqa"), decode_tokens=4)
    with single_threaded():
        ref = Reference(workload, 3)
        tokens, logits = ref.decode()
        sequence = ref.tokens.clone()
        for k in range(workload.decode_tokens + 1):
            with torch.no_grad():
                full = ref.model(sequence)[:, -1]
            assert torch.equal(full.argmax(-1), tokens[k])
            torch.testing.assert_close(logits[k], full, rtol=1e-12, atol=1e-12)
            sequence = torch.cat([sequence, tokens[k][:, None]], dim=1)
    assert len(set(tokens[:, 0].tolist())) > 1  # the tokens change from step to step


@pytest.mark.parametrize("layout", CASES, ids=[c.describe() for c in CASES])
def test_decode_matches_reference(layout: Layout) -> None:
    result = validate(layout, FLOAT64, ("decode",))
    assert result["tokens_match_reference"], result["layout"]
    assert result["max_rel_err"]["logits"] <= 1e-9, result["max_rel_err"]
    assert result["comm_matches_analytic"], (result["comm_counted"], result["comm_analytic"])
    assert result["comm_matches_dispatch"]
    assert result["passed"]


def test_grouped_query_decode_over_sharded_caches() -> None:
    gqa = FLOAT64.with_(model=ModelConfig.preset("tiny-gqa"), batch=1)  # b = 1, P - 1 padding slots
    for layout in (Layout("sp", sp=4), Layout("tsp", tsp=2)):
        assert validate(layout, gqa, ("decode",))["passed"], layout.describe()


def test_decode_traffic_per_step() -> None:
    """TSP moves every weight shard per step; TP only its [B, h] all-reduces (counted by hand)."""
    cfg, n = TINY, STEPS
    f32 = FLOAT64.with_(dtype="float32")
    per_step = {}
    for layout in (Layout("tsp", tsp=2), Layout("tp", tp=2)):
        records = get_strategy(layout.strategy).comm_volume(layout, f32)
        moved: dict[str, int] = {}
        for r in records:
            if r.phase == "decode" and r.group in ("tsp#1", "tp"):
                moved[r.op] = moved.get(r.op, 0) + r.msg_bytes * r.count // n
        per_step[layout.strategy] = moved
    d, h, L = 2, cfg.hidden, cfg.n_layers
    assert per_step["tsp"]["broadcast"] == d * L * (4 * h // d) * h * 4  # wq, wk, wv, wo rows: 4h/D
    assert (
        per_step["tsp"]["send_recv"]
        == ((d - 1) * L * 3 * cfg.ffn_hidden + 2 * (d - 1) * cfg.vocab_size) // d * h * 4
    )
    assert per_step["tp"] == {"all_reduce": (2 * L + 1) * 3 * h * 4, "all_gather": 3 * cfg.vocab_size * 4}


def test_bench_decode_record() -> None:
    layout, workload = Layout("tsp", tsp=2), FLOAT64.with_(dtype="float32")
    r = bench(layout, workload, choose_profile(None, device="cpu", measured=True), steps=2, warmup=1)
    assert r["status"] == "completed", r.get("error")
    assert len(r["tpot_times_s"]) == 2 * STEPS and len(r["ttft_times_s"]) == 2
    assert 0 < r["tpot_p50_s"] <= r["tpot_p90_s"] <= r["tpot_p99_s"] <= max(r["tpot_times_s"])
    assert r["decode_tokens_per_s"] == pytest.approx(3 / r["tpot_s"])
    # The cache by the spec's formula: 2 L m d (B S / P + ceil(B / P) N) x 4 bytes, all m heads (TSP).
    cfg = workload.model
    cache = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * (3 * 16 // 2 + math.ceil(3 / 2) * STEPS) * 4
    assert r["kv_cache_bytes"] == cache == r["peak_memory_kv_cache_bytes"]
    analytic = get_strategy("tsp").comm_volume(layout, workload)
    per_step = sum(c.bus_bytes for c in analytic if c.phase == "decode") / STEPS
    assert r["decode_comm_bytes_per_step"] == pytest.approx(per_step)
    assert r["hardware_flops_per_decode_step_per_gpu"] > 0
    if r["energy_per_token_j"] is None:
        assert r["energy_unavailable"]
    else:
        assert r["energy_per_token_j"] > 0 and r["energy_source"] in ("rapl", "nvml", "amdsmi")


def test_decode_over_capacity_is_an_oom_record() -> None:
    workload = FLOAT64.with_(dtype="float32")
    host = choose_profile(None, device="cpu", measured=True)
    r = bench(Layout("tp", tp=2), workload, host, steps=1, warmup=1, capacity_bytes=200_000)
    assert r["status"] == "oom"


def test_workload_decode_rules() -> None:
    with pytest.raises(WorkloadError, match="decode_tokens"):
        Workload(TINY, mode="train", decode_tokens=2)
    with pytest.raises(WorkloadError, match=">= 1 in decode mode"):
        Workload(TINY, mode="decode")
    with pytest.raises(WorkloadError, match="max_seq_len 16384"):
        Workload(TINY, seq_len=16384, mode="decode", decode_tokens=1)
    assert ModelConfig.preset("7b").max_seq_len == 131072 + 8192


BAD = [
    (["--mode", "train", "--decode-tokens", "4"], "--decode-tokens is for --mode decode only"),
    (["--mode", "decode"], "--mode decode needs --decode-tokens"),
    (["--mode", "decode", "--decode-tokens", "0"], "--decode-tokens: must be >= 1"),
    (["--mode", "decode", "--decode-tokens", "8", "--seq-len", "16380"], "exceeds max_seq_len 16384"),
    (["--mode", "decode", "--decode-tokens", "4", "--capacity", "1KiB"], "the KV cache needs"),
]


@pytest.mark.parametrize(("flags", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_decode_input(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["bench", "--strategy", "tp", "--tp", "2", *flags])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
