"""The time model's count of element-wise bytes (tspbench.costs.elementwise and each strategy's
own) against what the fake world records the step's element-wise ops moving, rank by rank.

The expectation comes from executing the strategy's code (the recorder sums every element-wise
op's reads and writes); the model writes the same down operator by operator from the code. Small
ops it leaves out (norm statistics [T, 1], index arithmetic) stay under 4% at these shapes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tspbench.analytic.profile_choice import choose_profile
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.core.trace import COMPUTE, ELEMENTWISE, load_traces
from tspbench.costs import elementwise
from tspbench.costs.memory import Shapes
from tspbench.dist.fake_world import FakeWorld
from tspbench.measure import fake_cuda
from tspbench.measure.fake import fake_bench
from tspbench.strategy import check_layout

PROBE = ModelConfig(256, 2, 4, 4, 1024, vocab_size=1000, name="probe", max_seq_len=1 << 16)
PROBE_GQA = ModelConfig(256, 2, 4, 2, 1024, vocab_size=1000, name="probe-gqa", max_seq_len=1 << 16)
CASES = [  # (layout, mode, recompute, model)
    (Layout("dp", dp=1), "train", "none", PROBE),
    (Layout("tp", tp=2), "train", "none", PROBE),
    (Layout("sp", sp=2), "train", "selective", PROBE),
    (Layout("sp", sp=2), "train", "op", PROBE),
    (Layout("tsp", tsp=2), "train", "op", PROBE),
    (Layout("sp", sp=4), "train", "none", PROBE_GQA),
    (Layout("fsdp", fsdp=2), "train", "none", PROBE),
    (Layout("fsdp_sp", sp=2), "train", "full", PROBE),
    (Layout("tp_sp", tp=2, sp=2), "train", "none", PROBE),
    (Layout("tsp", tsp=2), "train", "none", PROBE),
    (Layout("tsp", tsp=4), "train", "full", PROBE),
    (Layout("tsp", tsp=2), "infer", "none", PROBE),
    (Layout("fsdp_sp", sp=2), "infer", "none", PROBE),
]


@pytest.fixture(scope="module")
def world() -> Iterator[FakeWorld]:
    """One pool of fake-world workers for every case (a process start each would double the time)."""
    with FakeWorld(2, fake_cuda.preload_env("cuda")) as pool:
        yield pool


def recorded_bytes(path: Path) -> list[int]:
    """Per executed rank: bytes of its element-wise ops outside the optimizer."""
    traces, _ = load_traces(path)
    out = []
    for trace in traces:
        ev = trace.events
        optimizer = trace.phases.index("optimizer")
        mask = (ev["kind"] == COMPUTE) & (ev["cls"] == ELEMENTWISE) & (ev["phase"] != optimizer)
        out.append(int(ev["nbytes"][mask].sum()))
    return out


@pytest.mark.parametrize(("layout", "mode", "recompute", "model"), CASES, ids=lambda c: str(c)[:40])
def test_the_model_counts_the_element_wise_bytes_the_step_records(
    layout: Layout, mode: str, recompute: str, model: ModelConfig, tmp_path: Path, world: FakeWorld
) -> None:
    workload = Workload(model, 1, 512, mode, recompute, "bfloat16", "cuda")
    hardware = choose_profile(None, device=workload.device, measured=False)  # mi300x
    record = fake_bench(layout, workload, hardware, trace_path=tmp_path / "t.npz", world=world)
    assert record["status"] == "completed", record.get("error")
    counted = check_layout(layout, workload).for_analysis(layout, workload).elementwise_step_bytes()
    assert counted == pytest.approx(max(recorded_bytes(tmp_path / "t.npz")), rel=0.04)


SMALL = Shapes(
    batch=2, tokens=8, stream_tokens=8, seq=8, hidden=16, q=16, kv=16, ffn=32, vocab=10, heads=2,
    kv_parts=1, elt=4, layers=3,
)  # fmt: skip


def test_an_rms_norm_moves_its_bytes_by_hand_in_float32_and_bfloat16() -> None:
    """Per element, from the operator list at the top of tspbench.costs.elementwise: float32
    forward norm 4, x * rstd 4 + 4, * weight 8 = 20, backward 3 x 4 + 16 x 4 = 76; bfloat16
    activations take 2 bytes and add a cast each way (4 + 2): forward 2 + 6 + 6 + 4 = 18,
    backward 6 + 64 + 6 = 76."""
    n = 2 * 8 * 16
    assert elementwise.norm_bytes(SMALL, 8) == (20 * n, 76 * n)
    assert elementwise.norm_bytes(replace(SMALL, elt=2), 8) == (18 * n, 76 * n)
    assert elementwise.norm_bytes(SMALL, 4) == (20 * n // 2, 76 * n // 2)  # over half the tokens


def test_a_step_runs_each_block_forward_once_more_where_it_is_recomputed() -> None:
    """3 layers of (forward 10, backward 30) and ends of (5, 7) bytes."""
    block, ends = (10, 30), (5, 7)
    assert elementwise.over_step(3, "train", 1, block, ends) == 3 * (10 + 30) + 5 + 7
    assert elementwise.over_step(3, "train", 2, block, ends) == 3 * (2 * 10 + 30) + 5 + 7
    assert elementwise.over_step(3, "infer", 2, block, ends) == 3 * 10 + 5  # a forward: no backward
    assert [elementwise.recomputed_forwards("train", r) for r in ("none", "selective", "full")] == [1, 2, 2]
    assert elementwise.recomputed_forwards("infer", "full") == 1
