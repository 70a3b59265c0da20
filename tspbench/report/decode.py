"""The decode figures (issue #15): TPOT vs batch per layout with TSP's break-even batch marked,
and p50 against p99 TPOT per layout. Both read records of mode "decode" (measured by ``bench
--mode decode`` or projected by tspbench.analytic.decode) and return None for other records.

A panel per setting that varies besides the batch (the hardware a projection is for, the
context, the model); a line per layout; out-of-memory points as an X on the x axis (they have
no TPOT). TSP's break-even batch (the model's: the smallest batch whose GEMMs on one weight
shard last as long as moving the next) is a dotted vertical line in its color, or, when it lies
beyond the batches swept, an arrow at the right edge with its value.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from tspbench.report import style as st
from tspbench.report.figures import OOM_STYLE, facets, series_handles, series_list
from tspbench.report.frame import Context, column

# Record columns, first present wins (a measured record may name its median differently).
TPOT = {"p50": ("tpot_p50_s", "tpot_median_s"), "p99": ("tpot_p99_s",)}
BREAK_EVEN = "break_even_batch"
FACETS = ("setting", "seq_len", "model", "dtype")
NOTE = {"ha": "right", "fontsize": 7.5}


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


def _figure(panels: int) -> tuple[Figure, list[Axes]]:
    ncols = min(panels, 2)
    nrows = -(-panels // ncols)
    fig = st.new_figure(5.2 * ncols + 2.2, 3.6 * nrows + 0.7)
    return fig, list(fig.subplots(nrows, ncols, squeeze=False).ravel())


def _oom(ax: Axes, sub: pd.DataFrame, style: st.SeriesStyle, bottom: float) -> None:
    """An X per out-of-memory point on the panel's floor; marks at one batch side by side."""
    oom = sub[sub["status"] == "oom"]
    for batch, group in oom.groupby("batch", sort=True):
        labels = [lab for lab in style.labels if lab in set(group["series"])]
        for k, label in enumerate(labels):
            at = batch * 2 ** (0.09 * (k - (len(labels) - 1) / 2))
            ax.scatter([at], [bottom], color=style.color[label], clip_on=False, **OOM_STYLE)


def _break_even(ax: Axes, sub: pd.DataFrame, style: st.SeriesStyle) -> list[str]:
    """TSP's break-even batch: a line within the swept range, else an arrow at the edge."""
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
                ax.annotate(text, (0.99, 0.03), xycoords="axes fraction", **NOTE, va="bottom", color=color)
            notes.append(label)
    return notes


def _finish(ax: Axes, rows: pd.DataFrame, title: str, ylabel: str) -> None:
    st.log2_axis(ax, rows["batch"].unique(), st.count_label)
    ax.set_xlabel("batch (sequences per replica)")
    st.plain_y(ax, log=True)
    ax.set_ylabel(ylabel)
    ax.set_title(title)


OOM_HANDLE = {
    "ls": "",
    "marker": st.OOM_MARKER,
    "color": "#999999",
    "markeredgecolor": "black",
    "markersize": 8,
}


def _legend(fig: Figure, style: st.SeriesStyle, rows: pd.DataFrame, extra: list[Line2D]) -> None:
    handles = series_handles(style) + extra
    if (rows["status"] == "oom").any():
        handles.append(Line2D([], [], label="out of memory (no TPOT)", **OOM_HANDLE))
    fig.legend(handles=handles, loc="outside right center", frameon=False, title="layout")


def _draw(df: pd.DataFrame, ctx: Context, title: str, tails: bool) -> Figure | None:
    rows = decode_rows(df)
    if rows is None or rows["p50"].notna().sum() == 0 or (tails and rows["p99"].notna().sum() == 0):
        return None
    style = st.SeriesStyle(series_list(rows), ctx.strategies)
    groups = _panels(rows, ctx)
    fig, axes = _figure(len(groups))
    done = rows[(rows["status"] == "completed") & rows["p50"].notna()]
    bottom = float(done["p50"].min()) / 1.6 if len(done) else 1.0
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
        _oom(ax, sub, style, bottom)
        if not tails:
            _break_even(ax, sub, style)
        ax.set_ylim(bottom=bottom)
        _finish(ax, rows, label, "TPOT p50 (ms)" if not tails else "TPOT (ms): p50 solid, p99 dashed")
    for ax in axes[len(groups) :]:
        ax.set_visible(False)
    extra = []
    if tails:
        extra = [
            Line2D([], [], color="#555555", label="p50"),
            Line2D([], [], color="#555555", ls="--", label="p99"),
        ]
    _legend(fig, style, rows, extra)
    fig.suptitle(ctx.title(title, rows))
    return fig


def tpot_vs_batch(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """Time per output token (p50 over the decode steps) vs batch, TSP's break-even marked."""
    return _draw(df, ctx, "Decode: time per output token vs batch", tails=False)


def tpot_tails(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """p50 and p99 time per output token vs batch, per layout."""
    return _draw(df, ctx, "Decode: p50 and p99 time per output token", tails=True)
