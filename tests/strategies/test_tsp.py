"""What TSP promises beyond parity (the contract test covers that): its memory, on the CPU tracker.

Peak memory comes from the dispatch-level CPU tracker (bench's median of its tracked steps); the
comparisons below hold with wide margins, so step-to-step spread cannot flip them. They are
properties of the implementation, not timings.
"""

from __future__ import annotations

import pytest
import torch

from tspbench.analytic.profile_choice import choose_profile
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.dist.launch import launch
from tspbench.measure.bench import bench
from tspbench.measure.runner import RankRun
from tspbench.measure.validate import validate

pytestmark = pytest.mark.slow  # multi-rank runs, sweeps or Slurm: make test, not make check

TINY = ModelConfig.preset("tiny")
LONG = Workload(TINY, batch=1, seq_len=4096, dtype="float32")  # activations dominate the peak


def measure(layout: Layout, workload: Workload = LONG) -> dict:
    record = bench(layout, workload, choose_profile(None, device="cpu", measured=True), steps=1, warmup=1)
    assert record["status"] == "completed", record.get("error")
    return record


@pytest.fixture(scope="module")
def peaks() -> dict[str, dict]:
    layouts = [
        Layout("tsp", tsp=4),
        Layout("tsp", tsp=2),
        Layout("tp", tp=4),
        Layout("sp", sp=4),
        Layout("tp_sp", tp=2, sp=2),
    ]
    return {layout.describe(): measure(layout) for layout in layouts}


def test_blocking_schedule_is_the_same_math() -> None:
    result = validate(Layout("tsp", tsp=2), Workload(TINY, 2, 512, dtype="float64", overlap=False))
    assert result["passed"], result["max_rel_err"]


def test_model_state_is_one_quarter_at_d4(peaks: dict) -> None:
    """Parameters + gradients + AdamW state per rank at D=4 within 5% of 1/4 of one device's."""
    record = peaks["tsp(tsp4)"]
    state = sum(record[f"state_{k}_bytes"] for k in ("parameters", "gradients", "optimizer"))
    single_device = TINY.n_params * 4 * 4  # float32 weights, grads, Adam m and v
    assert abs(state / (single_device / 4) - 1) < 0.05, state


def test_activation_peak_shrinks_with_degree(peaks: dict) -> None:
    assert peaks["tsp(tsp4)"]["peak_memory_bytes"] <= 0.6 * peaks["tsp(tsp2)"]["peak_memory_bytes"]


def test_peak_below_every_baseline_at_world_size_4(peaks: dict) -> None:
    tsp = peaks["tsp(tsp4)"]["peak_memory_bytes"]
    for name in ("tp(tp4)", "sp(sp4)", "tp_sp(tp2 x sp2)"):
        assert tsp < peaks[name]["peak_memory_bytes"], (name, tsp, peaks[name]["peak_memory_bytes"])


def test_no_activation_all_reduce() -> None:
    """TSP moves weights and K/V, never activations: no all-reduce outside gradient sync and loss."""
    result = validate(Layout("tsp", tsp=2), Workload(TINY, 2, 512, dtype="float64"), ("train",))
    reductions = [e for e in result["comm_counted"]["train"] if e["op"] == "all_reduce"]
    assert all(e["phase"] != "backward" for e in reductions)
    forward = [e for e in reductions if e["phase"] == "forward"]
    assert forward == [] or all(e["msg_bytes"] == 8 * e["calls"] for e in forward)  # the loss scalar


def _forward_twice_then_train(layout: Layout, workload: Workload) -> dict:
    """A forward with grad and no backward (an evaluation under grad) leaves the last layer's
    prefetched W_0 in flight for a backward that never comes; the next forward must not use it."""
    unexpected, fresh = RankRun(layout, workload), RankRun(layout, workload)
    first = unexpected.strategy.loss(unexpected.model, unexpected.batch)
    second = unexpected.strategy.loss(unexpected.model, unexpected.batch)
    reference = fresh.strategy.loss(fresh.model, fresh.batch)
    second.backward()
    reference.backward()
    grads = zip(unexpected.model.parameters(), fresh.model.parameters(), strict=True)
    return {
        "losses_equal": bool(first == second == reference),
        "grads_equal": all(torch.equal(a.grad, b.grad) for a, b in grads),
    }


def test_a_pass_out_of_the_expected_order_fetches_its_own_weights() -> None:
    workload = Workload(TINY, 2, 256, dtype="float64")
    for rank in launch(_forward_twice_then_train, 2, Layout("tsp", tsp=2), workload):
        assert rank == {"losses_equal": True, "grads_equal": True}
