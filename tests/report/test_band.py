"""The band a projected speed carries (tspbench.report.band): only the analytic model's completed
points get one, the throughput figure draws it in each layout's color and says in its title what
it is, and a priced figure with no band says so and names the unmeasured rates it rests on."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib as mpl
import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection

from tspbench.report import band, figures
from tspbench.report.build import best_against_best, with_run_dirs
from tspbench.report.frame import context, prepare
from tspbench.report.style import RC
from tspbench.sweep.store import load

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
STUDY = ROOT / "results" / "paper_throughput"


def own_speed(run: Path) -> float:
    return float(json.loads((run / "result.json").read_text())["tokens_per_s_per_gpu"])


def halves_and_doubles(run: Path) -> tuple[float, float]:
    """A stand-in for the sensitivity's prices: half and twice the point's own tokens/s."""
    speed = own_speed(run)
    return speed / 2, speed * 2


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return prepare(with_run_dirs(load(STUDY), STUDY))


def test_only_completed_projected_points_get_a_band_and_all_devices_scale_it(frame: pd.DataFrame) -> None:
    asked: list[Path] = []

    def finder(run: Path) -> tuple[float, float]:
        asked.append(run)
        return halves_and_doubles(run)

    df = band.with_bands(frame, finder)
    done = df["status"] == "completed"
    assert len(asked) == int(done.sum()) > 0  # an out-of-memory point has no speed to band
    assert df.loc[~done, "tput_low"].isna().all()
    assert (df.loc[done, "tput_low"] <= df.loc[done, "tput"]).all()
    assert (df.loc[done, "tput_high"] >= df.loc[done, "tput"]).all()
    assert (df["agg_high"].dropna() == (df["tput_high"] * df["world_size"]).dropna()).all()
    assert band.with_bands(frame, None) is frame  # no finder: nothing priced, nothing added


def test_a_measured_point_gets_no_band_and_its_figure_no_note(frame: pd.DataFrame) -> None:
    measured = frame.assign(source="measured")
    assert band.with_bands(measured, halves_and_doubles)["tput_low"].isna().all()
    assert band.band_note(measured, ["tput"]) == ""
    assert band.band_note(frame, ["peak"]) == ""  # a memory figure: no speed to rest on anything


def test_the_throughput_figure_draws_the_band_and_says_what_it_is(frame: pd.DataFrame) -> None:
    banded = band.with_bands(frame, halves_and_doubles)
    df, ctx = best_against_best(banded, context(banded), STUDY)  # as the report draws it
    with mpl.rc_context(RC):
        fig = figures.throughput_vs_seq(df, ctx)
    try:
        shaded = [c for ax in fig.axes for c in ax.collections if isinstance(c, PolyCollection)]
        layouts_per_panel = [len({s for s in df.loc[df["world_size"] == w, "series"]}) for w in (2, 4, 8)]
        assert len(shaded) == sum(layouts_per_panel)  # one band per layout that completed a length
        assert "Band: each unmeasured figure of the MI300X profile" in fig._suptitle.get_text()
        assert any("band:" in t.get_text() for legend in fig.legends for t in legend.get_texts())
    finally:
        plt.close(fig)


def test_without_a_band_the_title_names_the_unmeasured_rates(frame: pd.DataFrame) -> None:
    with mpl.rc_context(RC):
        fig = figures.throughput_vs_seq(frame, context(frame))
    try:
        assert not [c for ax in fig.axes for c in ax.collections if isinstance(c, PolyCollection)]
        title = fig._suptitle.get_text()
        assert "No band: rests on the MI300X profile's unmeasured GEMM, attention, HBM, links" in title
    finally:
        plt.close(fig)


def test_a_rate_measured_on_the_profile_is_not_named() -> None:
    """The h200 profile's GEMM rate is measured there; MI300X's is assumed."""
    assert "GEMM" in band.unmeasured_rates(["mi300x"])
    assert "GEMM" not in band.unmeasured_rates(["h200"])
