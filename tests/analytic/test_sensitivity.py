"""What a projected step time rests on (tspbench.analytic.sensitivity): each figure's range
follows its provenance, a figure moved here prices exactly as the same edit of the YAML file,
and a figure the step does not read moves nothing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from tspbench.analytic import sensitivity as sens
from tspbench.analytic.hardware import find_profile, load_hardware
from tspbench.analytic.predict import predict
from tspbench.core.spec import Layout, ModelConfig, Workload

MI300X = load_hardware("mi300x")
W16K = Workload(ModelConfig.preset("7b"), 1, 16384, "train", "selective", "bfloat16", "cuda")


@pytest.mark.parametrize(
    ("words", "cls", "factors"),
    [
        ("datasheet: dense BF16", "datasheet", (0.6, 1.0)),
        ("assumed: achievable GEMM", "assumed", (0.5, 2.0)),
        ("datasheet and assumed: 7 links, ~75% achievable", "assumed", (0.5, 2.0)),
        ("carried from the H200 measurement x ratio 1", "assumed", (0.5, 2.0)),
        ("unstated", "assumed", (0.5, 2.0)),
        ("measured: calibrate, median of 5", "measured", (0.9, 1.1)),
    ],
)
def test_a_figures_range_follows_its_provenance(words: str, cls: str, factors: tuple[float, float]) -> None:
    """The issue's ranges: assumed x0.5-x2, a datasheet peak x0.6-x1 (it cannot be beaten), a
    measurement within its spread; anything partly assumed counts as assumed."""
    assert sens.provenance_class(words) == cls
    assert sens.value_range(100.0, cls) == pytest.approx(tuple(100 * f for f in factors))


def test_mi300x_figures_are_the_ones_the_issue_names_with_their_values() -> None:
    got = {f.key: (f.value, f.provenance) for f in sens.figures(MI300X)}
    assert got["gemm_tflops"] == (650, "assumed")
    assert got["attention_tflops"] == (400, "assumed")
    assert got["ring_shift_gbs"] == (48, "assumed")
    assert got["overlap_efficiency"] == (1.0, "assumed")
    assert got["hbm_bandwidth_gbs"] == (5300, "datasheet")
    assert "host_overhead_us" not in got and "launch_us" not in got  # 0 on this profile: nothing to scale
    assert sens.figure_named(MI300X, "overlap_efficiency").high == 1.0  # an efficiency cannot pass 1


@pytest.mark.parametrize(
    ("key", "value"), [("gemm_tflops", 1000.0), ("attention_tflops", 250.0), ("overlap_efficiency", 0.7)]
)
def test_a_figure_moved_here_prices_as_a_hand_edit(key: str, value: float, tmp_path: Path) -> None:
    data = yaml.safe_load(find_profile("mi300x").read_text())
    data[key] = value
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(data))
    by_hand = predict(Layout("tsp", tsp=8), W16K, load_hardware(str(edited))).step_time_s
    moved = sens.figure_named(MI300X, key).at(MI300X, value)
    assert predict(Layout("tsp", tsp=8), W16K, moved).step_time_s == by_hand


def test_the_ring_shift_moves_every_send_and_nothing_else() -> None:
    moved = sens.figure_named(MI300X, "ring_shift_gbs").at(MI300X, 96.0)
    for old, new in zip(MI300X.collectives, moved.collectives, strict=True):
        assert new.bandwidth_gbs == (96.0 if old.op == "send_recv" else old.bandwidth_gbs)
    assert replace(moved, collectives=[]) == replace(MI300X, collectives=[])


def test_a_figure_the_step_does_not_read_moves_nothing() -> None:
    """An 8-rank layout fits one 8-GPU node, so the NIC's figures cannot change its step; a
    faster ring shift can only shorten TSP's (it never waits longer for a quicker link)."""
    swings = {s.figure.key: s for s in sens.swings(Layout("tsp", tsp=8), W16K, MI300X)}
    assert swings["inter_node_bandwidth_gbs"].span_s == 0
    assert swings["ring_shift_gbs"].low_s > swings["ring_shift_gbs"].base_s > swings["ring_shift_gbs"].high_s
    assert list(swings) == sorted(swings, key=lambda k: -swings[k].span_s)  # widest first


def test_no_break_even_inside_a_range_that_does_not_flip() -> None:
    """At 16K TP 8 stays ahead of TSP 8 at both ends of the GEMM rate's range, so no value inside
    it is a break-even."""
    gemm = sens.figure_named(MI300X, "gemm_tflops")
    (row,) = sens.break_evens(Layout("tsp", tsp=8), Layout("tp", tp=8), W16K, MI300X, [gemm])
    assert row.ratio < 1 and row.ratio_low < 1 and row.ratio_high < 1
    assert row.value is None


def test_a_band_holds_the_points_own_speed_and_reaches_the_tornados_ends() -> None:
    """The band a projected figure draws: the point's tokens/s inside it, its ends the slowest and
    fastest of the one-at-a-time moves (each end priced as a hand-edited profile would be)."""
    tsp8 = Layout("tsp", tsp=8)
    ring = sens.figure_named(MI300X, "ring_shift_gbs")
    got = sens.band(tsp8, W16K, MI300X, [ring])
    own = predict(tsp8, W16K, MI300X).tokens_per_s_per_gpu
    ends = [predict(tsp8, W16K, ring.at(MI300X, v)).tokens_per_s_per_gpu for v in (ring.low, ring.high)]
    assert got.low <= own == got.base <= got.high
    assert (got.low, got.high) == pytest.approx((min(ends), max(ends)))
    assert got.width > 0  # TSP's ring shift is assumed, and its step reads it
    whole = sens.band(tsp8, W16K, MI300X)
    assert whole.low <= got.low and whole.high >= got.high  # every figure: at least as wide


def test_a_profile_measured_throughout_has_no_band() -> None:
    """Only what the profile assumes opens the band: every figure marked measured, it is one value."""
    from dataclasses import fields

    from tspbench.analytic.hardware import Hardware

    measured = replace(MI300X, provenance={f.name: "measured: here" for f in fields(Hardware)})
    assert {f.provenance for f in sens.figures(measured)} == {"measured"}
    got = sens.band(Layout("tp", tp=8), W16K, measured)
    own = predict(Layout("tp", tp=8), W16K, MI300X).tokens_per_s_per_gpu
    assert got.width == 0 and got.low == got.base == own
