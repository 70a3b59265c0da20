"""The sequence axis's K/V exchange (#48): ``kv_exchange`` allgather, ring or ulysses on sp,
fsdp_sp and TP+SP's sequence axis. The refusals and the analytic count need no processes; the
validate runs (float64, every rank, train, prefill and decode) are slow."""

from __future__ import annotations

import pytest

from tspbench.core.errors import LayoutError, WorkloadError
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.measure.validate import validate
from tspbench.strategy import check_layout, get_strategy

TINY = ModelConfig.preset("tiny")
FLOAT64 = Workload(TINY, batch=2, seq_len=64, dtype="float64")


def test_an_unknown_exchange_names_the_allowed_ones() -> None:
    with pytest.raises(WorkloadError, match=r"kv_exchange must be one of \['allgather', 'ring', 'ulysses'\]"):
        FLOAT64.with_(kv_exchange="p2p")


def test_a_layout_without_a_sequence_axis_refuses_an_exchange() -> None:
    with pytest.raises(WorkloadError, match=r"kv_exchange .* applies to fsdp_sp, sp, tp_sp only"):
        check_layout(Layout("tp", tp=2), FLOAT64.with_(kv_exchange="ring"))


@pytest.mark.parametrize(
    "layout, model, reason",
    [
        (Layout("sp", sp=4), "tiny-gqa", "2 key/value heads do not divide by the sequence degree 4"),
        (Layout("fsdp_sp", sp=8), "tiny", "4 query heads do not divide by the sequence degree 8"),
        (Layout("tp_sp", tp=2, sp=4), "tiny", "2 query heads do not divide by the sequence degree 4"),
    ],
)
def test_ulysses_is_refused_where_the_heads_do_not_split(layout: Layout, model: str, reason: str) -> None:
    workload = FLOAT64.with_(model=ModelConfig.preset(model), kv_exchange="ulysses")
    with pytest.raises(LayoutError, match=f"kv_exchange ulysses: {reason}"):
        check_layout(layout, workload)


def _sp_records(exchange: str, mode: str = "train") -> dict[tuple[str, str], tuple[int, int]]:
    """(op, phase) -> (calls, bytes) of the analytic count on sp's group (sp 4, tiny, seq 64)."""
    workload = FLOAT64.with_(kv_exchange=exchange, mode=mode)
    records = get_strategy("sp").comm_volume(Layout("sp", sp=4), workload)
    out: dict = {}
    for r in records:
        if r.group == "sp" and r.op != "all_reduce":
            calls, nbytes = out.get((r.op, r.phase), (0, 0))
            out[(r.op, r.phase)] = (calls + r.count, nbytes + r.count * r.msg_bytes)
    return out


def test_the_ring_and_ulysses_counts_by_hand() -> None:
    """tiny: 2 layers, 4 heads of 16, B 2, S 64 over 4 ranks: 16 tokens per rank, float64."""
    chunk = 2 * 2 * 16 * 64 * 8  # K and V of the local tokens [2, B, m, 2C, d]
    assert _sp_records("ring") == {
        ("send_recv", "forward"): (2 * 3, 2 * 3 * chunk),
        ("send_recv", "backward"): (2 * (3 + 4), 2 * (3 + 4) * chunk),
    }
    assert _sp_records("ring", "infer") == {("send_recv", "forward"): (6, 6 * chunk)}
    row = 2 * 16 * 16 * 8  # [B, 2C, d] of one head
    per_layer = row * (4 + 2 * 4) + row * 4  # q, k, v to heads; o back
    for phase in ("forward", "backward"):
        assert _sp_records("ulysses")[("all_to_all", phase)] == (4, 2 * per_layer)


@pytest.mark.slow
@pytest.mark.parametrize("exchange", ["ring", "ulysses"])
@pytest.mark.parametrize(
    "layout", [Layout("sp", sp=2), Layout("fsdp_sp", sp=2), Layout("tp_sp", tp=2, sp=2)], ids=str
)
def test_each_exchange_matches_the_reference_on_every_rank(layout: Layout, exchange: str) -> None:
    workload = FLOAT64.with_(kv_exchange=exchange, mode="decode", decode_tokens=2)
    result = validate(layout, workload, ("train", "infer", "decode"))
    for key, err in result["max_rel_err"].items():
        assert err <= result["tolerance"], f"{layout.describe()} {exchange}: {key} {err:.2e}"
    assert result["comm_matches_analytic"] and result["passed"]
