"""The band a projected speed carries: how far its tokens/s moves when the profile's unmeasured
figures move over the ranges their provenance allows (tspbench.analytic.sensitivity).

A projected throughput is a single line only in appearance: on the MI300X profile every rate it
rests on is assumed. So the report's speed panels draw, for each analytic-model point, the range
of its tokens/s with each assumed or datasheet figure at either end of its range, one at a time
(the envelope of the tornado's ends), as a shaded band in the layout's color; a panel whose
priced points have no band (the timeline's replays, decode) says so in its title and names the
unmeasured figures it rests on. The band's prices come from a ``BandFinder`` the command line
gives (it may import the model; this layer needs no torch), as the ledger's hinges do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.patches import Patch

from tspbench.analytic.profile_choice import named_profile, profile_name
from tspbench.core.errors import HardwareError

RUN_DIR = "run_dir"  # each point's run folder: tspbench.report.gantt.RUN_DIR (build adds it)
BandFinder = Callable[[Path], "tuple[float, float] | None"]  # run folder -> tokens/s per GPU (low, high)
SPEED = ("tput", "agg")  # the columns a band is drawn for: per device, and all devices (x world size)
BAND_ALPHA = 0.16
# the rates a projected step rests on, by the profile key whose provenance says where each is from
RATES = {
    "gemm_tflops": "GEMM",
    "attention_tflops": "attention",
    "hbm_bandwidth_gbs": "HBM",
    "collectives": "links",
    "overlap_efficiency": "overlap",
}
BAND_WORDS = "Band: each unmeasured figure of the {p} profile over its range, one at a time"
NO_BAND_WORDS = "No band: rests on the {p} profile's unmeasured {rates} figures (tspbench sensitivity)"


def with_bands(df: pd.DataFrame, finder: BandFinder | None) -> pd.DataFrame:
    """``df`` with ``tput_low``/``tput_high`` (and ``agg_`` for all devices) for every completed
    analytic-model point of a step the sensitivity prices (train, infer), where ``finder`` and
    the run folders are known; NaN elsewhere."""
    if finder is None or RUN_DIR not in df or not len(df):
        return df
    rows = (df["source"] == "predicted") & (df["status"] == "completed") & df["mode"].isin(("train", "infer"))
    low = pd.Series(np.nan, index=df.index)
    high = pd.Series(np.nan, index=df.index)
    for i in df.index[rows]:
        found = finder(Path(str(df.at[i, RUN_DIR])))
        if found is not None:
            low[i], high[i] = found
    world = df["world_size"]
    return df.assign(tput_low=low, tput_high=high, agg_low=low * world, agg_high=high * world)


def draw_band(ax: Axes, rows: pd.DataFrame, x: str, column: str, color: str, scale: float) -> None:
    """The band of ``column`` over ``x`` for one layout's rows, under its line, where it has one."""
    if f"{column}_low" not in rows:
        return
    has = rows[rows[f"{column}_low"].notna()].sort_values(x)
    if len(has):
        low, high = has[f"{column}_low"] / scale, has[f"{column}_high"] / scale
        ax.fill_between(has[x], low, high, color=color, alpha=BAND_ALPHA, lw=0, zorder=2)


def has_band(df: pd.DataFrame) -> bool:
    return "tput_low" in df and bool(df["tput_low"].notna().any())


def band_handles(df: pd.DataFrame, columns: Sequence[str]) -> list[Patch]:
    """The legend's entry for the band, when a speed panel draws one."""
    if not has_band(df) or not set(columns) & set(SPEED):
        return []
    label = (
        "band: each unmeasured figure over\nits range, one at a time; the layouts\n"
        "share those figures, so bands that\noverlap do not make a tie"
    )
    return [Patch(color="#555555", alpha=BAND_ALPHA * 2, lw=0, label=label)]


def band_note(df: pd.DataFrame, columns: Sequence[str]) -> str:
    """The title's line on what a figure's priced speeds rest on (``rests_on``), where one of its
    panels (``columns``) is a speed; '' otherwise."""
    if not set(columns) & set(SPEED) or "tput" not in df:
        return ""
    return rests_on(df[(df["source"] != "measured") & df["tput"].notna()])


def rests_on(priced: pd.DataFrame) -> str:
    """What the ``priced`` points (those a model gave a time: the analytic model's, the
    timeline's replays) rest on: their band, or that they have none and the unmeasured rates of
    their profiles; '' when there are none (a measured figure)."""
    if not len(priced):
        return ""
    names = sorted({profile_name(row) for _, row in priced.iterrows()})
    profiles = " / ".join(n.upper() for n in names)
    if "tput_low" in priced and priced["tput_low"].notna().all():
        return BAND_WORDS.format(p=profiles)
    return NO_BAND_WORDS.format(p=profiles, rates=", ".join(unmeasured_rates(names)) or "no")


def unmeasured_rates(names: Sequence[str]) -> list[str]:
    """The words of RATES whose provenance is not 'measured' on any of the profiles ``names``."""
    out: list[str] = []
    for name in names:
        try:
            hw = named_profile(name)
        except HardwareError:
            continue
        for key, word in RATES.items():
            if not hw.source_of(key).strip().lower().startswith("measured") and word not in out:
                out.append(word)
    return out
