"""The contract every registered strategy must pass, checked against the single-device reference.

Parametrized over the registry, so a new strategy is covered the moment it registers: exact
train and inference parity in float64 (loss, logits, every gradient, every parameter after one
AdamW step), counted communication equal to the strategy's own analytic count, and per-rank
parameter memory equal to 1/(weight-sharding degree) of the reference up to replicated norms.
"""

from __future__ import annotations

import math

import pytest

from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.measure.validate import validate
from tspbench.strategy import iter_strategies

pytestmark = pytest.mark.slow  # multi-rank runs, sweeps or Slurm: make test, not make check

TINY = ModelConfig.preset("tiny")
FLOAT64 = Workload(TINY, batch=2, seq_len=512, dtype="float64")


def layouts_for(cls: type) -> list[Layout]:
    """2-way and 4-way on the strategy's own axes (every axis 2 for a 2-D mesh), and dp 2 x 2-way."""
    axes = cls.axes or ("dp",)
    if len(axes) == 1:
        two, four = {axes[0]: 2}, {axes[0]: 4}
        out = [Layout(cls.name, **two), Layout(cls.name, **four)]
        if axes[0] != "dp":
            out.append(Layout(cls.name, dp=2, **two))
        return out
    return [Layout(cls.name, **dict.fromkeys(axes, 2))]


CASES = [(cls, layout) for cls in iter_strategies() for layout in layouts_for(cls)]


def _ids(case: tuple) -> str:
    return case[1].describe()


def assert_exact(result: dict) -> None:
    for key, err in result["max_rel_err"].items():
        where = f"{result['layout']}: {key} rel err {err:.2e} ({result['worst_grad_param']})"
        assert err <= result["tolerance"], where
    assert result["comm_matches_analytic"], (result["comm_counted"], result["comm_analytic"])
    assert result["passed"]


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_train_and_infer_match_reference(case: tuple) -> None:
    cls, layout = case
    result = validate(layout, FLOAT64, ("train", "infer"))
    assert_exact(result)
    reference_bytes = TINY.n_params * 8
    norm_bytes = (2 * TINY.n_layers + 1) * TINY.hidden * 8
    degree = math.prod(layout.degree(a) for a in cls.weight_axes)
    for got in result["parameter_bytes_per_rank"]:
        assert reference_bytes / degree <= got <= reference_bytes / degree + norm_bytes, (got, degree)


RECOMPUTE_CASES = [
    (cls, layouts_for(cls)[0], mode) for cls in iter_strategies() for mode in ("selective", "op", "full")
]


@pytest.mark.parametrize("case", RECOMPUTE_CASES, ids=[f"{c[1].describe()}-{c[2]}" for c in RECOMPUTE_CASES])
def test_recomputation_keeps_results_and_counts(case: tuple) -> None:
    """Recomputation repeats forward collectives in backward; counts must still be exact."""
    _, layout, mode = case
    assert_exact(validate(layout, FLOAT64.with_(recompute=mode), ("train",)))


@pytest.mark.parametrize("cls", list(iter_strategies()), ids=lambda c: c.name)
def test_grouped_query_attention(cls: type) -> None:
    gqa = ModelConfig.preset("tiny-gqa")  # 4 query heads share 2 K/V heads
    assert_exact(validate(layouts_for(cls)[0], FLOAT64.with_(model=gqa), ("train",)))


@pytest.mark.parametrize("layout", [Layout("tp", tp=2), Layout("tp_sp", tp=2, sp=2)], ids=Layout.describe)
def test_megatron_sequence_parallel_variant(layout: Layout) -> None:
    result = validate(layout, FLOAT64.with_(megatron_sp=True), ("train", "infer"))
    assert_exact(result)
    ops = {entry["op"] for entry in result["comm_counted"]["train"]}
    assert {"all_gather", "reduce_scatter"} <= ops  # instead of activation all-reduces


def test_float32_within_its_tolerance() -> None:
    result = validate(Layout("tsp", tsp=2), FLOAT64.with_(dtype="float32"), ("train",))
    assert result["max_rel_err"]["grads"] < 1e-5
    assert result["max_rel_err"]["loss"] < 1e-5
