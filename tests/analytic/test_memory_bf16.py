"""The memory model of a GPU step in bf16 against the fake world executing it on a simulated GPU
(whose peak the H200's allocator matched within 0.2%: results/h200/2026-12-04_dd1d213)."""

from __future__ import annotations

import pytest

from tspbench.analytic.hardware import load_hardware
from tspbench.analytic.predict import predict
from tspbench.analytic.profile_choice import choose_profile
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.measure.fake import fake_bench

# the test_analytic tolerances of each family (plain autograd counted exactly; FSDP2 modelled)
TOLERANCE = {"dp": 0.02, "sp": 0.02, "fsdp": 0.08}


@pytest.mark.slow
@pytest.mark.parametrize("layout", [Layout("dp"), Layout("sp", sp=2), Layout("fsdp", fsdp=2)], ids=str)
def test_the_bf16_memory_model_is_the_fake_world_s(layout: Layout) -> None:
    """Where the whole-vocabulary loss peaks (the head's backward), the fp32 logits it upcasts are
    counted once: the model was 12.6% over the fake world here (+3.3% on the 1b at 8K on one H200)."""
    workload = Workload(ModelConfig.preset("small"), 1, 2048, "train", "none", "bfloat16", "cuda")
    executed = fake_bench(layout, workload, choose_profile(None, device="cuda", measured=False))
    assert executed["status"] == "completed", executed.get("error")
    predicted = predict(layout, workload, load_hardware("h200")).memory
    assert predicted.moment == "head backward"
    assert abs(predicted.peak_bytes / executed["peak_memory_bytes"] - 1) <= TOLERANCE[layout.strategy]


TOLERANCE["fsdp_sp"] = TOLERANCE["fsdp"]  # FSDP2's buffers modelled, as under fsdp (test_predict)


@pytest.mark.slow
@pytest.mark.parametrize("exchange", ["ring", "ulysses"])
@pytest.mark.parametrize("layout", [Layout("sp", sp=2), Layout("fsdp_sp", sp=2)], ids=str)
def test_each_kv_exchange_s_memory_model_is_the_fake_world_s(layout: Layout, exchange: str) -> None:
    """Ring attention and Ulysses hold K/V unlike the all-gather (two chunks in hand; whole
    sequence over a head shard), so the peak the paper memory study projects for them
    (experiments/paper_memory_kv.yaml) is held to the fake world's under each, by the family's
    tolerance (#48)."""
    workload = Workload(
        ModelConfig.preset("small"), 1, 2048, "train", "none", "bfloat16", "cuda", kv_exchange=exchange
    )
    executed = fake_bench(layout, workload, choose_profile(None, device="cuda", measured=False))
    assert executed["status"] == "completed", executed.get("error")
    predicted = predict(layout, workload, load_hardware("h200")).memory
    assert abs(predicted.peak_bytes / executed["peak_memory_bytes"] - 1) <= TOLERANCE[layout.strategy]
