"""Op-level selective recomputation (torchtitan's policy, tspbench.model.recompute): its analytic
terms (tspbench.costs.memory.op_saved, tspbench.costs.flops.op_recomputed_gemm) against the policy
derived by hand, the fake world against the same derivation, and the analytic model against the
fake world.

What a block keeps is derived here from the policy and the model's shapes alone: the block input,
the outputs of the 1st, 3rd, 5th and 7th mm of its forward (wq, wk, wv, wo, w1, w3, w2 in call
order: wq, wv, w1, w2 kept) and the attention kernel's output and log-sum-exp.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from tspbench.analytic.hardware import load_hardware
from tspbench.analytic.predict import predict
from tspbench.analytic.profile_choice import choose_profile
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.costs.flops import op_recomputed_gemm
from tspbench.costs.memory import Shapes, block_mm_calls, op_saved
from tspbench.dist.fake_world import FakeWorld
from tspbench.measure.fake import fake_bench

SMALL = ModelConfig.preset("small")
SEQ = 1024
# the families' memory tolerances of tests/analytic/test_predict.py
# the CUDA flash op (the simulated GPU's kernel here) also returns its RNG state, kept with its
# outputs: a seed [2] and an offset [], 64-bit each
FLASH_RNG_STATE = 2 * 8 + 8
MEMORY_TOLERANCE = {"dp": 0.02, "tp": 0.02, "sp": 0.02, "tp_sp": 0.02, "tsp": 0.06, "fsdp": 0.08}


@pytest.fixture(scope="module")
def world() -> Iterator[FakeWorld]:
    with FakeWorld(2) as pool:  # started once for the module's points
        yield pool


def _executed(layout: Layout, workload: Workload, world: FakeWorld) -> dict:
    shared = world if workload.device == "cpu" else None  # a simulated GPU's workers preload its library
    hardware = choose_profile(None, device=workload.device, measured=False)
    out = fake_bench(layout, workload, hardware, world=shared, trace=False)
    assert out["status"] == "completed", out.get("error")
    return out


def kept_per_layer(cfg: ModelConfig, batch: int, seq: int, elt: int) -> int:
    """By hand: x [B, S, h]; wq [B, S, n d]; wv [B, S, m d]; w1 [B, S, f]; w2 [B, S, h]; the
    attention output [B, n, S, d] and its log-sum-exp [B, n, S] (float32 at least)."""
    tokens, q, kv = batch * seq, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    widths = cfg.hidden + q + kv + cfg.ffn_hidden + cfg.hidden + q
    return tokens * widths * elt + batch * cfg.n_heads * seq * max(elt, 4)


def whole_model_shapes(cfg: ModelConfig, batch: int, seq: int, elt: int) -> Shapes:
    """One rank holding the whole model and every token (dp's)."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    widths = (cfg.hidden, q, kv, cfg.ffn_hidden, cfg.vocab_size, cfg.n_heads)
    return Shapes(batch, seq, seq, seq, *widths, kv_parts=1, elt=elt, layers=cfg.n_layers)


@pytest.mark.parametrize("elt", [4, 2])
def test_the_cost_terms_are_the_policy_by_hand(elt: int) -> None:
    """What a block keeps (op_saved) and the GEMMs its recompute re-runs (wk, wo, w3)."""
    s = whole_model_shapes(SMALL, 1, SEQ, elt)
    assert op_saved(s) == kept_per_layer(SMALL, 1, SEQ, elt)
    h, kv, f = SMALL.hidden, SMALL.n_kv_heads * SMALL.head_dim, SMALL.ffn_hidden
    q = SMALL.n_heads * SMALL.head_dim
    assert op_recomputed_gemm(s, block_mm_calls(s)) == 2 * SEQ * (h * kv + q * h + h * f)


@pytest.mark.parametrize(("dtype", "device"), [("float32", "cpu"), ("bfloat16", "cuda")])
def test_fake_world_keeps_what_the_policy_names(dtype: str, device: str, world: FakeWorld) -> None:
    """A whole-model rank at two depths: the activations held at the peak (the head's backward,
    every block's kept set live) grow by the hand-derived bytes per layer."""
    held = {}
    for layers in (2, 4):
        model = replace(SMALL, n_layers=layers)
        executed = _executed(Layout("dp"), Workload(model, 1, SEQ, "train", "op", dtype, device), world)
        held[layers] = executed["peak_memory_activations_bytes"]
        assert executed["peak_memory_gradients_bytes"] == 0  # the head's backward, before any block's
    elt = 4 if dtype == "float32" else 2
    rng_state = FLASH_RNG_STATE if device == "cuda" else 0
    assert (held[4] - held[2]) // 2 == kept_per_layer(SMALL, 1, SEQ, elt) + rng_state


@pytest.mark.parametrize("layout", [Layout("dp"), Layout("tsp", tsp=2)], ids=Layout.describe)
def test_op_peak_lies_between_full_and_none(layout: Layout, world: FakeWorld) -> None:
    base = Workload(SMALL, 1, SEQ, "train", "none", "float32", "cpu")
    modes = ("none", "op", "full")
    peak = {r: _executed(layout, base.with_(recompute=r), world)["peak_memory_bytes"] for r in modes}
    assert peak["full"] < peak["op"] < peak["none"], peak


LAYOUTS = [Layout("dp"), Layout("tp", tp=2), Layout("sp", sp=2), Layout("tsp", tsp=2), Layout("fsdp", fsdp=2)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=Layout.describe)
def test_analytic_model_is_the_fake_world_s(layout: Layout, world: FakeWorld) -> None:
    """Peak memory within the family's tolerance, hardware FLOPs (3 of 7 block GEMMs again, no
    attention core; TSP: every GEMM of its forward but the kept mm) exactly."""
    workload = Workload(SMALL, 1, SEQ, "train", "op", "float32", "cpu")
    executed = _executed(layout, workload, world)
    predicted = predict(layout, workload, load_hardware("cpu"))
    error = predicted.memory.peak_bytes / executed["peak_memory_bytes"] - 1
    assert abs(error) <= MEMORY_TOLERANCE[layout.strategy], f"{error:+.2%} ({predicted.memory.moment})"
    assert predicted.flops.total == executed["hardware_flops_per_step_per_gpu"]


def test_op_recomputes_three_of_seven_gemms() -> None:
    """On a whole-model rank the FLOPs op adds over none are those of wk, wo and w3, by hand."""
    workload = Workload(SMALL, 1, SEQ, "train", "none", "float32", "cpu")
    none, op = (
        predict(Layout("dp"), workload.with_(recompute=r), load_hardware("cpu")).flops for r in ("none", "op")
    )
    h, kv, f = SMALL.hidden, SMALL.n_kv_heads * SMALL.head_dim, SMALL.ffn_hidden
    q = SMALL.n_heads * SMALL.head_dim
    assert op.gemm - none.gemm == SMALL.n_layers * 2 * SEQ * (h * kv + q * h + h * f)
    assert op.attention == none.attention
