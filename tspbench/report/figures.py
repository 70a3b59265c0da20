"""The report's line figures (memory, throughput, scaling, micro-batch) and what all figures share.

Every figure function takes the prepared records (``tspbench.report.frame.prepare``) and a
``Context`` (what to call the hardware and the preset) and returns a Figure, or None when the
records do not support it (no sequence sweep, no world-size sweep, ...); the bar charts and
the parity plot are in tspbench.report.bars. Panels vary one thing on the x axis; whatever
else varies across the records (recomputation mode, micro-batch, D) gets a panel of its own,
so no line ever mixes two settings.

Out-of-memory points are results: on memory axes an X sits at the predicted peak (or on the
capacity line when there is no prediction); on throughput axes, which have no value to show,
the X sits on the x axis.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from tspbench.report import style as st
from tspbench.report.frame import RECOMPUTE_RANK, Context

CONTEXT = ("model", "mode", "dtype", "recompute", "batch", "seq_len")


# ----------------------------------------------------------------------------- selecting data


def natural_key(col: str) -> Callable[[pd.Series], pd.Series]:
    return lambda s: s.map(RECOMPUTE_RANK) if col == "recompute" else s


def varying(df: pd.DataFrame, cols: Sequence[str]) -> list[str]:
    return [c for c in cols if c in df and df[c].nunique(dropna=False) > 1]


def swept(df: pd.DataFrame, x: str, series: str = "series") -> bool:
    """Whether some series has two or more values of ``x`` in one setting (a line to draw)."""
    keys = [series, *[c for c in CONTEXT if c in df and c != x]]
    return bool(len(df) and df.groupby(keys, dropna=False)[x].nunique().max() > 1)


def facet_columns(df: pd.DataFrame, x: str, extra: Sequence[str] = ()) -> list[str]:
    """What else varies: each value combination gets its own panel. World size only when every
    world size holds two or more series (else the size is just part of the series' name)."""
    cols = varying(df, [c for c in (*CONTEXT, *extra) if c != x])
    if "world_size" in cols and df.groupby("world_size")["series"].nunique().min() < 2:
        cols.remove("world_size")
    return cols


def facet_label(col: str, value: object, noun: str) -> str:
    if col == "world_size":
        return f"{value} {noun}s"
    if col == "seq_len":
        return f"seq {st.tokens_label(float(value))}"
    return {"recompute": f"recompute {value}", "batch": f"micro-batch {value}"}.get(col, str(value))


def facets(df: pd.DataFrame, cols: list[str], noun: str) -> list[tuple[str, pd.DataFrame]]:
    """(title, rows) per combination of ``cols``, in natural order; one untitled panel if none."""
    if not cols:
        return [("", df)]
    keys = df[cols].drop_duplicates().sort_values(cols, key=lambda s: natural_key(s.name)(s))
    out = []
    for _, key in keys.iterrows():
        mask = np.logical_and.reduce([df[c] == key[c] for c in cols])
        out.append((", ".join(facet_label(c, key[c], noun) for c in cols), df[mask]))
    return out


def series_list(df: pd.DataFrame, label: str = "series") -> list[tuple[str, str]]:
    """(label, strategy) in legend order (the frame arrives sorted by strategy, then layout)."""
    return list(dict.fromkeys(zip(df[label], df["strategy"], strict=True)))


# ----------------------------------------------------------------------------- lines


@dataclass
class Panel:
    """One quantity on the y axis: its column, its label, and how to scale it."""

    column: str
    label: str  # may hold {unit}
    memory: bool = False  # bytes: unit chosen from the data, capacity drawn, OOM at the prediction
    log: bool = False


def draw_lines(
    ax: Axes, df: pd.DataFrame, x: str, panel: Panel, style: st.SeriesStyle, scale: float, top: float | None
) -> None:
    """One line per series over ``x`` (completed points), OOM points as X, capacity dashed."""
    ok = df[(df["status"] == "completed") & df[panel.column].notna()].sort_values(x)
    for label in style.labels:
        rows = ok[ok["series"] == label]
        if len(rows):
            ax.plot(rows[x], rows[panel.column] / scale, zorder=3, **style.line(label))
    if not panel.log:  # the OOM X sits at zero, which a log axis does not have
        draw_oom(ax, df[df["status"] == "oom"], x, panel, style, scale, top)
    if panel.memory and df["capacity"].nunique() == 1:
        ax.axhline(df["capacity"].iloc[0] / scale, color=st.CAPACITY_COLOR, ls="--", lw=1.1, zorder=2)


def draw_oom(
    ax: Axes, oom: pd.DataFrame, x: str, panel: Panel, style: st.SeriesStyle, scale: float, top: float | None
) -> None:
    """An X per out-of-memory point: at its predicted peak on memory axes, on the x axis otherwise.
    Marks that share an x value sit side by side (x axes are log2: a shift is a factor) so none
    hides another. Predictions above ``top`` (far over capacity) sit on the top edge, their
    values printed beneath, so that they do not squash the lines that fit."""
    for value, group in oom.groupby(x, sort=True):
        order = sorted(group.index, key=lambda i: style.labels.index(group.at[i, "series"]))
        clipped = 0
        for k, i in enumerate(order):
            at = value * 2 ** (0.09 * (k - (len(order) - 1) / 2))
            y = group.at[i, "oom_at"] / scale if panel.memory else 0.0
            if top is not None and y > top:
                ax.annotate(f"{y:,.0f}", (at, top), xytext=(0, -9 - 9 * clipped), textcoords="offset points",
                            ha="center", va="top", fontsize=7, color="#444444")  # fmt: skip
                y, clipped = top, clipped + 1
            ax.scatter([at], [y], color=style.color[group.at[i, "series"]], clip_on=False, **OOM_STYLE)


def memory_top(df: pd.DataFrame, panel: Panel, scale: float) -> float | None:
    """The y limit of a memory panel when some OOM prediction is far above everything else:
    twice the larger of the capacity and the highest completed point; None if nothing is."""
    if not panel.memory:
        return None
    done = df.loc[df["status"] == "completed", panel.column].max()
    base = np.nanmax([done, df["capacity"].max(), 0.0]) / scale
    return 2.0 * base if base > 0 and (df["oom_at"] / scale > 2.0 * base).any() else None


OOM_STYLE = {"marker": st.OOM_MARKER, "s": 70, "edgecolors": "black", "linewidths": 0.7, "zorder": 5}


def series_handles(style: st.SeriesStyle) -> list[Line2D]:
    return [Line2D([], [], **style.line(label)) for label in style.labels]


def key_handles(df: pd.DataFrame, memory: bool, unit: tuple[str, float]) -> list[Line2D]:
    """Legend entries for the capacity line and the OOM mark, when the panel has them."""
    out = []
    if memory and df["capacity"].nunique() == 1:
        cap = f"{df['capacity'].iloc[0] / unit[1]:.0f} {unit[0]}"
        out.append(Line2D([], [], color=st.CAPACITY_COLOR, ls="--", label=f"{capacity_name(df)} ({cap})"))
    if (df["status"] == "oom").any():
        where = "at its predicted peak" if memory else "no throughput"
        out.append(Line2D([], [], ls="", marker=st.OOM_MARKER, color="#999999", markeredgecolor="black",
                          markersize=8, label=f"out of memory ({where})"))  # fmt: skip
    return out


def capacity_name(df: pd.DataFrame) -> str:
    """A CPU run's capacity is a simulated device (the tracker's limit), a GPU's or a profile's real."""
    return "simulated capacity" if (df["device"] == "cpu").all() else "device capacity"


def line_figure(
    ctx: Context,
    df: pd.DataFrame,
    x: str,
    xlabel: str,
    panels: list[Panel],
    title: str,
    series: str = "series",
) -> Figure:
    """A panel per setting (facet) and quantity: facets in a row of up to three for one quantity,
    else one row per facet. Panels share y when they hold the same kind of run; when facets hold
    different layouts (one per world size) each gets its own legend below it."""
    df = df.assign(series=df[series])
    cols = facet_columns(df, x, ("world_size",) if series == "series" else ())
    groups = facets(df, cols, ctx.noun)
    styles = [st.SeriesStyle(series_list(sub), ctx.strategies) for _, sub in groups]
    shared = all(s.labels == styles[0].labels for s in styles)
    ncols = len(panels) if len(panels) > 1 else min(len(groups), 3)
    nrows = -(-len(groups) * len(panels) // ncols)
    below = 0 if shared else 0.22 * max(len(s.labels) for s in styles) + 0.5
    fig = st.new_figure((4.8 if ncols == 1 else 3.9) * ncols + 2.4, (3.0 + below) * nrows + 0.6)
    sharey = "col" if len(panels) > 1 else "world_size" not in cols
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=sharey).ravel()
    units = {p.column: memory_unit(df, p) for p in panels}
    cells = [(t, sub, style, p) for (t, sub), style in zip(groups, styles, strict=True) for p in panels]
    for i, (ax, (label, sub, style, panel)) in enumerate(zip(axes, cells, strict=False)):
        scale = units[panel.column][1]
        top = memory_top(sub if not sharey else df, panel, scale)
        draw_lines(ax, sub, x, panel, style, scale, top)
        finish_axes(ax, df[x], x, panel, label, xlabel, top)
        first_in_row = i % ncols == 0 or len(panels) > 1 or not sharey
        ax.set_ylabel(panel.label.format(unit=units[panel.column][0]) if first_in_row else "")
        if not shared and i % len(panels) == len(panels) - 1:
            ax.legend(
                handles=series_handles(style), loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False
            )
    for ax in axes[len(cells) :]:
        ax.set_visible(False)
    memory = next((p for p in panels if p.memory), None)
    keys = key_handles(df, memory is not None, units[memory.column] if memory else ("", 1.0))
    handles = (series_handles(styles[0]) if shared else []) + keys
    if handles:
        fig.legend(
            handles=handles, loc="outside right center", frameon=False, title="layout" if shared else None
        )
    fig.suptitle(ctx.title(title, df))
    return fig


def memory_unit(df: pd.DataFrame, panel: Panel) -> tuple[str, float]:
    if not panel.memory:
        return "", 1.0
    return st.byte_unit([*df[panel.column].dropna(), *df["oom_at"].dropna(), *df["capacity"].dropna()])


def finish_axes(
    ax: Axes, xs: pd.Series, x: str, panel: Panel, title: str, xlabel: str, top: float | None = None
) -> None:
    st.log2_axis(ax, xs.dropna().unique(), st.tokens_label if x == "seq_len" else st.count_label)
    ax.set_xlabel(xlabel)
    if not panel.log:
        ax.set_ylim(bottom=0, top=top)
    st.plain_y(ax, panel.log)
    ax.set_title(title)


# ----------------------------------------------------------------------------- the line figures


def memory_vs_seq(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """(a) Peak memory per device over sequence length, capacity drawn, OOM marked."""
    if not swept(df, "seq_len") or df["peak"].notna().sum() == 0:
        return None
    panel = Panel("peak", f"peak memory per {ctx.noun} ({{unit}})", memory=True)
    title = f"Peak memory per {ctx.noun} vs sequence length"
    return line_figure(ctx, df, "seq_len", "sequence length (tokens)", [panel], title)


def throughput_vs_seq(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """(b) Tokens/s per device over sequence length."""
    if not swept(df, "seq_len") or df["tput"].notna().sum() == 0:
        return None
    panel = Panel("tput", f"tokens/s per {ctx.noun}")
    title = f"Throughput per {ctx.noun} vs sequence length"
    return line_figure(ctx, df, "seq_len", "sequence length (tokens)", [panel], title)


def scaling(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """(c) Per-device and aggregate throughput over the number of devices (same replica, more dp)."""
    if not swept(df, "world_size", "series_mp") or df["tput"].notna().sum() == 0:
        return None
    panels = [Panel("tput", f"tokens/s per {ctx.noun}"), Panel("agg", f"tokens/s, all {ctx.noun}s", log=True)]
    title = "Scaling: model-parallel replicas x data parallel"
    return line_figure(ctx, df, "world_size", f"{ctx.noun}s", panels, title, "series_mp")


def microbatch(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """(d) Throughput and peak memory over micro-batch size."""
    if not swept(df, "batch") or df["tput"].notna().sum() == 0:
        return None
    panels = [Panel("tput", f"tokens/s per {ctx.noun}"),
              Panel("peak", f"peak memory per {ctx.noun} ({{unit}})", memory=True)]  # fmt: skip
    return line_figure(ctx, df, "batch", "micro-batch (sequences per replica)", panels, "Micro-batch sweep")
