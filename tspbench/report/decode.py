"""The decode figures (issue #15): TPOT vs batch per layout with TSP's break-even batch marked,
and p50 against p99 TPOT per layout. Both read records of mode "decode" (measured by ``bench
--mode decode`` or projected by tspbench.analytic.decode) and return None for other records.

A panel per setting that varies besides the batch (the hardware a projection is for, the
context, the model); a line per layout. A point that does not fit (status "oom") has no TPOT: it
is its layout's marker crossed out in a grey strip at the foot of its panel, below every TPOT
drawn, a row per layout that ran out (as the throughput figure's strip), so that no mark hides
another. TSP's break-even batch (the model's: the smallest batch whose GEMMs on one weight shard
last as long as moving the next) is a dotted vertical line in its color, or, when it lies beyond
the batches swept, an arrow at the right edge with its value. The title names the source and the
device (Context.where: projected for a GPU, measured on CPU, executed in a fake world); where
p99 lies within 1% of p50 at every point of a panel (a projection's spread is small), the tails
figure says so, since the dashed lines then hide under the solid ones.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter
from matplotlib.transforms import blended_transform_factory

from tspbench.report import style as st
from tspbench.report.band import rests_on
from tspbench.report.figures import (
    OOM_KEY,
    OOM_STYLE,
    draw_oom_strip,
    facets,
    oom_rows,
    series_handles,
    series_list,
)
from tspbench.report.frame import Context, column

# Record columns, first present wins (a measured record may name its median differently).
TPOT = {"p50": ("tpot_p50_s", "tpot_median_s"), "p99": ("tpot_p99_s",)}
BREAK_EVEN = "break_even_batch"
FACETS = ("setting", "seq_len", "model", "dtype")
NOTE = {"ha": "right", "fontsize": 7.5}
GREY = {"fontsize": 7.5, "color": "#444444"}
SAME = 0.01  # p99 within 1% of p50 everywhere: the tails figure says the two coincide
ROW = 0.032  # axes fraction per layout in the does-not-fit strip


def decode_rows(df: pd.DataFrame) -> pd.DataFrame | None:
    """The decode records with ``p50``/``p99`` TPOT in ms and a ``setting`` to facet on, or None."""
    if "mode" not in df or not (df["mode"] == "decode").any():
        return None
    rows = df[df["mode"] == "decode"].copy()
    for name, candidates in TPOT.items():
        present = [c for c in candidates if c in rows]
        rows[name] = column(rows, present[0]) * 1e3 if present else np.nan
    hardware = rows["hardware"].fillna("").astype(str).str.upper() if "hardware" in rows else ""
    rows["setting"] = np.where(rows["source"] == "predicted", "projected, " + hardware, "measured")
    return rows


def _panels(rows: pd.DataFrame, ctx: Context) -> list[tuple[str, pd.DataFrame]]:
    cols = [c for c in FACETS if c in rows and rows[c].nunique() > 1]
    if cols == ["setting"]:  # name the hardware alone: 'projected, MI300X'
        return [(str(sub["setting"].iloc[0]), sub) for _, sub in rows.groupby("setting", sort=True)]
    return facets(rows, cols, ctx.noun)


def _figure(panels: int, strip: float) -> tuple[Figure, list[Axes]]:
    """Panels two to a row, each taller by its does-not-fit strip (``strip``: axes fraction)."""
    ncols = min(panels, 2)
    nrows = -(-panels // ncols)
    fig = st.new_figure(5.2 * ncols + 2.2, 3.6 / (1 - strip) * nrows + 0.7)
    return fig, list(fig.subplots(nrows, ncols, squeeze=False).ravel())


def _strip(rows: pd.DataFrame, style: st.SeriesStyle) -> float:
    """Axes fraction of the does-not-fit strip: a row per layout that ran out in any panel."""
    n = len(oom_rows(rows, style))
    return ROW * n + 0.02 if n else 0.0


def _floor(ax: Axes, low: float, high: float, strip: float) -> None:
    """Log y limits with ``low`` (ms) on the strip's top edge and a little room above ``high``;
    no tick labels inside the strip, whose values mean nothing there."""
    top = high * 1.25
    bottom = low / (top / low) ** (strip / (1 - strip)) if strip else low
    ax.set_ylim(bottom, top)
    if strip:
        label = ax.yaxis.get_major_formatter()
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, pos: "" if v < low * 0.999 else label(v, pos)))
        ax.axhline(low, color="#888888", lw=0.8, zorder=2)


def _oom_marks(ax: Axes, sub: pd.DataFrame, rows: pd.DataFrame, style: st.SeriesStyle, strip: float) -> None:
    """An X per point of ``sub`` that does not fit, in its layout's row of the strip (rows as in
    every panel of the figure: the layouts that ran out anywhere, in legend order)."""
    where = blended_transform_factory(ax.transData, ax.transAxes)
    oom = sub[sub["status"] == "oom"]
    for k, label in enumerate(oom_rows(rows, style)):
        xs = oom.loc[oom["series"] == label, "batch"]
        y = strip - ROW * (k + 0.5) - 0.01
        ax.scatter(xs, [y] * len(xs), transform=where, **{**OOM_STYLE, **style.oom(label), "s": 70})


def _break_even(ax: Axes, sub: pd.DataFrame, style: st.SeriesStyle, floor: float) -> list[str]:
    """TSP's break-even batch: a line within the swept range, else an arrow at the right edge
    just above the strip (``floor``, axes fraction)."""
    notes = []
    if BREAK_EVEN not in sub:
        return notes
    top = sub["batch"].max()
    for label in style.labels:
        values = column(sub[sub["series"] == label], BREAK_EVEN).dropna().unique()
        for value in values:
            color = style.color[label]
            if value <= top * 2**0.3:
                ax.axvline(value, color=color, ls=":", lw=1.4, zorder=2)
                text = f"{label} hides its weights\nfrom B = {value:,.0f}"
                ax.annotate(
                    text, (value, 0.97), xycoords=("data", "axes fraction"), **NOTE, va="top", color=color
                )
            else:
                text = f"{label} hides its weights only from B = {value:,.0f} ->"
                ax.annotate(
                    text, (0.99, floor + 0.01), xycoords="axes fraction", **NOTE, va="bottom", color=color
                )
            notes.append(label)
    return notes


def _finish(ax: Axes, rows: pd.DataFrame, title: str, ylabel: str) -> None:
    st.log2_axis(ax, rows["batch"].unique(), st.count_label)
    ax.set_xlabel("batch (sequences per replica)")
    st.plain_y(ax, log=True)
    ax.set_ylabel(ylabel)
    ax.set_title(title)


def _legend(fig: Figure, style: st.SeriesStyle, rows: pd.DataFrame, extra: list[Line2D]) -> None:
    handles = series_handles(style) + extra
    if (rows["status"] == "oom").any():
        handles.append(
            Line2D(
                [],
                [],
                label="does not fit (out of memory, no TPOT):\nits marker crossed, in the grey strip",
                **OOM_KEY,
            )
        )
    fig.legend(handles=handles, loc="outside right center", frameon=False, title="layout")


def _draw(df: pd.DataFrame, ctx: Context, title: str, tails: bool) -> Figure | None:
    rows = decode_rows(df)
    if rows is None or rows["p50"].notna().sum() == 0 or (tails and rows["p99"].notna().sum() == 0):
        return None
    style = st.SeriesStyle(series_list(rows), ctx.strategies)
    groups = _panels(rows, ctx)
    strip = _strip(rows, style)
    fig, axes = _figure(len(groups), strip)
    done = rows[(rows["status"] == "completed") & rows["p50"].notna()]
    values = [*done["p50"], *(done["p99"].dropna() if tails else [])]
    low, high = (min(values) / 1.15, max(values)) if values else (1.0, 10.0)
    for ax, (label, sub) in zip(axes, groups, strict=False):
        ok = sub[(sub["status"] == "completed") & sub["p50"].notna()].sort_values("batch")
        for name in style.labels:
            line = ok[ok["series"] == name]
            if not len(line):
                continue
            ax.plot(line["batch"], line["p50"], zorder=3, **style.line(name))
            if tails:  # p99 dashed, thin, in the same color, the band between shaded
                ax.plot(line["batch"], line["p99"], color=style.color[name], ls="--", lw=1.0, zorder=3)
                ax.fill_between(line["batch"], line["p50"], line["p99"], color=style.color[name], alpha=0.15)
        if strip:
            draw_oom_strip(ax, rows.iloc[:0], "batch", style, strip)  # the strip's band and label
            _oom_marks(ax, sub, rows, style, strip)
        spread = float((ok["p99"] / ok["p50"] - 1).abs().max()) if tails and len(ok) else np.nan
        if spread < SAME:  # the lines would hide each other: say so rather than look like p99 is missing
            note = f"p99 within {spread:.1%} of p50 at every point: the dashed lines lie under the solid"
            ax.annotate(note, (0.01, 0.985), xycoords="axes fraction", ha="left", va="top", **GREY)
        if not tails:
            _break_even(ax, sub, style, strip)
        _finish(ax, rows, label, "TPOT p50 (ms)" if not tails else "TPOT (ms): p50 solid, p99 dashed")
        _floor(ax, low, high, strip)
    for ax in axes[len(groups) :]:
        ax.set_visible(False)
    extra = []
    if tails:
        extra = [
            Line2D([], [], color="#555555", label="p50"),
            Line2D([], [], color="#555555", ls="--", label="p99"),
        ]
    _legend(fig, style, rows, extra)
    note = rests_on(rows[(rows["source"] != "measured") & rows["p50"].notna()])  # no band: which rates
    fig.suptitle(ctx.title(title, rows) + (f"\n{note}" if note else ""))
    return fig


def tpot_vs_batch(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """Time per output token (p50 over the decode steps) vs batch, TSP's break-even marked."""
    return _draw(df, ctx, "Decode: time per output token vs batch", tails=False)


def tpot_tails(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """p50 and p99 time per output token vs batch, per layout."""
    return _draw(df, ctx, "Decode: p50 and p99 time per output token", tails=True)
