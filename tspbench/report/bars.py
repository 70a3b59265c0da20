"""The report's bar charts (memory by category, communication by collective) and the parity plot.

Bars compare layouts at one setting, so when the records sweep several settings the bars take
the swept length (or micro-batch) as panels and hold everything else at its first value, named
in the title. Bars are horizontal: layout names stay readable however many there are.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import numpy as np
import pandas as pd
import seaborn as sns  # palettes for collectives this module does not know
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import LogLocator, NullFormatter

from tspbench.core.names import CATEGORIES
from tspbench.report import style as st
from tspbench.report.figures import (
    CONTEXT,
    capacity_label,
    facet_label,
    natural_key,
    series_handles,
    series_list,
    swept,
    varying,
)
from tspbench.report.frame import Context
from tspbench.report.host import host_notes

MAX_BAR_PANELS = 5
REST_COLOR = "#c8c8c8"  # the part of a peak the record does not break down into categories
CUT_ROOM = 1.3  # the memory axis past its cut (bar_cut): room for the notes of bars that fit
CHAR = 0.025  # a 7.5 pt letter's width (with its box) as a fraction of a bar panel's width (2.9 in)
PHASES = ("backward", "forward", "optimizer", "prefill", "decode")  # a peak's phase, in a note
MAX_LEGEND = 16  # parity legend entries that fit beside the axes


# ----------------------------------------------------------------------------- parity


def memory_parity(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """(e) Predicted vs measured peak memory, y = x and the ±10% band: how far to trust the model."""
    return parity(df, ctx, "measured_peak", "pred_peak", "peak memory", 0.10, bytes_=True)


def time_parity(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """Predicted vs measured step time (the median), y = x and the ±25% band; under the title, why
    the times may miss the profile where the records show it (tspbench.report.host, #46)."""
    fig = parity(df, ctx, "measured_time", "pred_time", "step time", 0.25, bytes_=False)
    notes = host_notes(df)
    if fig is not None and notes:
        warning = textwrap.fill(f"warning: {notes[0]}", 72)  # the title wraps its own lines past ~80
        price = "price on this host: tspbench calibrate --out this-host.yaml"
        fig.suptitle(f"{fig.get_suptitle()}\n{warning}\n{price}")
    return fig


def parity(
    df: pd.DataFrame, ctx: Context, measured: str, predicted: str, what: str, band: float, bytes_: bool
) -> Figure | None:
    """Every completed point with both values: predicted on x, measured on y, the worst error named."""
    ok = df[(df["status"] == "completed") & df[measured].notna() & df[predicted].notna()]
    if ok.empty:
        return None
    unit, scale = st.byte_unit([*ok[measured], *ok[predicted]]) if bytes_ else ("s", 1.0)
    # a data-parallel sweep: one legend entry per model-parallel layout, its dp sizes together
    by = "series_mp" if ok["series"].nunique() > MAX_LEGEND > ok["series_mp"].nunique() else "series"
    style = st.SeriesStyle(series_list(ok, by), ctx.strategies)
    fig = st.new_figure(7.0, 5.2)  # the axes come out about square: y = x at 45 degrees
    ax = fig.subplots()
    keys = parity_axes(ax, [*ok[measured] / scale, *ok[predicted] / scale], band)
    for label in style.labels:
        rows = ok[ok[by] == label]
        line = {**style.line(label), "linestyle": "", "markersize": 7.5}
        ax.plot(rows[predicted] / scale, rows[measured] / scale, zorder=4, **line)
    per = f" per {ctx.noun}" if bytes_ else ""
    ax.set_xlabel(f"predicted {what}{per} ({unit})")
    ax.set_ylabel(f"{ctx.executed} {what}{per} ({unit})")
    handles = [*series_handles(style), *keys]
    title = "layout (every dp)" if by == "series_mp" else "layout"
    fig.legend(handles=handles, loc="outside right center", frameon=False, title=title)
    err = (ok[predicted] / ok[measured] - 1) * 100
    worst = ok.loc[err.abs().idxmax()]
    stats = (
        f"{len(ok)} points: median |error| {err.abs().median():.1f}%, worst {err.abs().max():.1f}% "
        f"({worst['series']} at seq {st.tokens_label(worst['seq_len'])}"
        f"{', recompute ' + worst['recompute'] if ok['recompute'].nunique() > 1 else ''})"
    )
    fig.suptitle(ctx.title(f"Predicted vs {ctx.executed} {what}{per}\n{stats}", ok))
    return fig


def parity_axes(ax: Axes, values: list[float], band: float = 0.10) -> list:
    """Equal axes over the values (log when they span more than 8x), the y = x line and the band
    where the prediction is within ±``band`` of the measurement (predicted / measured - 1)."""
    lo, hi = min(values), max(values)
    log = hi / lo > 8
    lo, hi = (lo / 1.25, hi * 1.25) if log else (0.0, hi * 1.08)
    grid = np.geomspace(lo, hi, 64) if log else np.linspace(lo, hi, 64)
    shade = ax.fill_between(
        grid, grid / (1 + band), grid / (1 - band), color="#bbbbbb", alpha=0.4, lw=0,
        label=f"within ±{band:.0%}",
    )  # fmt: skip
    (line,) = ax.plot(grid, grid, color=st.CAPACITY_COLOR, lw=1, ls="--", label="prediction = measurement")
    if log:
        ax.set(xscale="log", yscale="log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
            axis.set_minor_formatter(NullFormatter())
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(st.count_formatter(axis))
    ax.set(xlim=(lo, hi), ylim=(lo, hi))
    return [shade, line]


# ----------------------------------------------------------------------------- stacked bars


def bar_slice(df: pd.DataFrame) -> tuple[pd.DataFrame, str | None, str]:
    """One representative setting for bar charts: the swept length (or micro-batch) becomes the
    panels, every other varying setting is held at its first value (named in the title)."""
    dim = next((c for c in ("seq_len", "batch") if swept(df, c)), None)
    held = []
    for col in varying(df, [c for c in CONTEXT if c != dim]):
        first = df[col].sort_values(key=natural_key(col)).iloc[0]
        df = df[df[col] == first]
        held.append(facet_label(col, first, ""))
    if df["series_mp"].nunique() < df["series"].nunique():  # a data-parallel sweep: smallest dp
        df = df[df["dp"] == df.groupby("series_mp")["dp"].transform("min")]
    return df, dim, ", ".join(held)


def panel_values(values: Sequence[float]) -> list[float]:
    """At most MAX_BAR_PANELS values, evenly spaced, first and last kept."""
    values = sorted(values)
    if len(values) <= MAX_BAR_PANELS:
        return values
    picks = np.linspace(0, len(values) - 1, MAX_BAR_PANELS).round().astype(int)
    return [values[i] for i in sorted(set(picks))]


def stacked_bars(
    ctx: Context, df: pd.DataFrame, parts: dict[str, tuple[str, str]], what: str, xlabel: str, memory: bool
) -> Figure:
    """Horizontal stacked bars, one per layout (top to bottom in legend order), a panel per value
    of the swept length; ``parts`` maps column -> (legend name, color). Points that did not
    complete are named in text where their bar would be."""
    df, dim, held = bar_slice(df)
    values = panel_values(df[dim].unique()) if dim else [None]
    labels = list(dict.fromkeys(df["series"]))
    capacity = df["capacity"].dropna() if memory else []  # bus bytes are no share of the memory
    unit, scale = st.byte_unit([*df[list(parts)].fillna(0).sum(axis=1), *capacity])
    ncols = len(values) if len(values) <= 4 else 3  # five panels in a row would be a thin strip
    nrows = -(-len(values) // ncols)
    fig = st.new_figure(1.2 + 2.9 * ncols + 1.9, nrows * max(2.6, 1.0 + 0.32 * len(labels)) + 0.7)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True).ravel()
    for ax in axes[len(values) :]:
        ax.set_visible(False)
    cut = bar_cut(df, parts, scale) if memory else None
    shown = df if dim is None else df[df[dim].isin(values)]
    parts = {c: look for c, look in parts.items() if shown[c].fillna(0).gt(0).any()}  # legend: drawn only
    totals = np.maximum(shown[list(parts)].fillna(0).sum(axis=1), shown["peak"].fillna(0) if memory else 0)
    room = 1.3 if memory and df["over_capacity"].any() else 1.18  # "over capacity": longer than "OOM"
    room = CUT_ROOM if cut else room
    right = cut or max([*totals / scale, *(c / scale for c in capacity)], default=1.0) * 1.05
    for i, (ax, value) in enumerate(zip(axes, values, strict=False)):
        sub = df if value is None else df[df[dim] == value]
        draw_bars(ax, sub, labels, parts, scale, memory, cut, right * room)
        ax.set_title(facet_label(dim, value, ctx.noun) if dim else "")
        ax.set_xlabel(xlabel.format(unit=unit) if i + ncols >= len(values) else "")  # lowest in its column
        ax.xaxis.set_major_formatter(st.count_formatter(ax.xaxis))
    axes[0].set_yticks(range(len(labels)), labels)
    axes[0].set_ylim(len(labels) - 0.5, -0.5)
    for ax in axes:
        ax.set_xlim(0, right * room)  # one scale for all; room for the totals and OOM notes
    handles: list = [Patch(color=color, label=name) for name, color in parts.values()]
    if memory and df["capacity"].nunique() == 1:
        handles.append(Line2D([], [], color=st.CAPACITY_COLOR, ls="--", label=capacity_label(df, scale)))
    if memory and any(unattributed(row, parts, scale) > 0 for _, row in df.iterrows()):
        handles.append(Patch(color=REST_COLOR, label="not broken down\n(peak minus the categories)"))
    if memory and ((df["status"] == "oom") & df["breakdown"]).any():
        handles.append(
            Patch(facecolor="white", edgecolor="#555555", hatch="///", label="predicted, over capacity")
        )
    fig.legend(
        handles=handles,
        loc="outside right center",
        frameon=False,
        title="category" if memory else "collective",
    )
    phase = "\nEach bar: the categories at its peak, in the phase named under its total" if memory else ""
    fig.suptitle(ctx.title((f"{what}, {held}" if held else what) + phase, df))
    return fig


def unattributed(row: pd.Series, parts: dict[str, tuple[str, str]], scale: float) -> float:
    """The part of a record's peak that its categories leave out (a decode projection breaks
    down only parameters and KV cache, not the prefill's activations), in ``scale`` units;
    0 when the categories add up to the peak (within 0.5%)."""
    total = sum(row[c] for c in parts if row[c] == row[c])
    peak = row["peak"] if "peak" in row and row["peak"] == row["peak"] else total
    return (peak - total) / scale if peak > total * 1.005 else 0.0


def bar_cut(df: pd.DataFrame, parts: dict[str, tuple[str, str]], scale: float) -> float | None:
    """Where the memory axis ends when a peak that does not fit dwarfs the rest: twice the larger
    of the capacity and the largest peak that fits, once some bar runs past 2.5 times that (a
    4 TiB projection on a 0-4K axis leaves the bars that fit, and the capacity, a few pixels
    wide); None to show every bar whole."""
    totals = np.maximum(df[list(parts)].fillna(0).sum(axis=1), df["peak"].fillna(0)) / scale
    fits = (df["status"] == "completed") & ~df["over_capacity"].fillna(False).astype(bool)
    base = max([*totals[fits], *(df["capacity"].dropna() / scale)], default=0.0)
    return 2 * base if base > 0 and totals.max() > 2.5 * base else None


def draw_bars(
    ax: Axes,
    sub: pd.DataFrame,
    labels: list[str],
    parts: dict[str, tuple[str, str]],
    scale: float,
    memory: bool,
    cut: float | None = None,
    xmax: float | None = None,
) -> None:
    """A stacked bar per layout; one longer than ``cut`` runs off the axis' right edge (its
    total and an arrow written at the edge). Each bar's total, with the phase of a memory peak,
    is written where it crosses neither the capacity line nor the axis' edge (``note_at``)."""
    capacity = sub["capacity"].iloc[0] / scale if memory and sub["capacity"].nunique() == 1 else None
    for y, label in enumerate(labels):
        rows = sub[sub["series"] == label]
        if rows.empty:
            continue
        row = rows.iloc[0]
        show = row["status"] == "completed" or (memory and row["status"] == "oom" and row["breakdown"])
        if not show:
            status = "OOM" if row["status"] == "oom" else row["status"]
            ax.text(0, y, f" {status}", va="center", ha="left", fontsize=8, color="#b00000")
            continue
        left = 0.0
        hatch = "///" if row["status"] == "oom" else None
        for col, (_, color) in parts.items():
            width = (row[col] if row[col] == row[col] else 0.0) / scale
            ax.barh(y, width, left=left, color=color, height=0.7, hatch=hatch, edgecolor="white", lw=0.5)
            left += width
        rest = unattributed(row, parts, scale) if memory else 0.0
        if rest > 0:  # the peak is the bar's length, whatever the record breaks down
            ax.barh(y, rest, left=left, color=REST_COLOR, height=0.7, hatch=hatch, edgecolor="white", lw=0.5)
            left += rest
        note = bar_note(row, left, memory)
        if cut is not None and left > cut:  # past the cut: the value at the axis' edge, inside
            box = {"facecolor": "white", "edgecolor": "none", "pad": 0.8, "alpha": 0.9}
            ax.text(cut * CUT_ROOM * 0.99, y, f"{note} ->", va="center", ha="right", fontsize=7.5,
                    color="#333333", bbox=box)  # fmt: skip
        else:  # a light box: readable on the bar
            x, ha = note_at(left, len(max(note.split("\n"), key=len)) * CHAR * (xmax or left), capacity, xmax)
            box = {"facecolor": "white", "edgecolor": "none", "pad": 0.6, "alpha": 0.75}
            ax.text(x, y, note, va="center", ha=ha, fontsize=7.5, color="#333333", bbox=box)
    if capacity is not None:
        ax.axvline(capacity, color=st.CAPACITY_COLOR, ls="--", lw=1.1)
    ax.grid(axis="y", visible=False)


def bar_note(row: pd.Series, total: float, memory: bool) -> str:
    """'39.5' over 'backward' (a memory peak: its total and the phase its categories are from,
    which decides whether gradients or activations show), '214.6 OOM', a third line 'over
    capacity' for an executed peak the device could not hold."""
    phase = str(row.get("peak_memory_phase") or "") if memory else ""
    word = next((p for p in PHASES if p in phase), phase)
    oom = " OOM" if row["status"] == "oom" else ""
    over = "over capacity" if memory and not oom and row["over_capacity"] else ""
    return "\n".join(w for w in (f"{total:,.1f}{oom}", word, over) if w)


def note_at(end: float, width: float, capacity: float | None, xmax: float | None) -> tuple[float, str]:
    """(x, alignment) of a bar's note of ``width`` (data units): right of the bar's ``end`` where it
    fits before the capacity line (or, past it, the axis' edge); else inside the bar, right-aligned
    at its end, or left of the capacity line where the bar ends too little past it; a bar too
    short to hold it writes it past the line. Never across the line, never past the edge."""
    gap = 0.012 * (xmax or end)
    limit = capacity if capacity is not None and end < capacity else xmax
    if limit is None or end + gap + width <= limit - 2 * gap:
        return end + gap / 2, "left"
    inside = end
    if capacity is not None and end > capacity and end - width < capacity + gap:
        inside = capacity - gap  # the part of the bar before the line
    if inside - width >= 0:
        return inside - gap / 2, "right"
    return (capacity + gap if capacity is not None and end < capacity else end), "left"


def comm_by_op(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """(f) Bus bytes per step of the busiest rank, stacked by collective, per layout."""
    done = df[df["status"] == "completed"]
    ops = [c.removeprefix("comm_op_") for c in df.columns if c.startswith("comm_op_")]
    ops = [o for o in ops if done[f"comm_op_{o}"].fillna(0).sum() > 0]
    if not ops:
        return None
    ops = [o for o in st.OP_COLORS if o in ops] + sorted(set(ops) - set(st.OP_COLORS))
    parts = {f"comm_op_{o}": (o, c) for o, c in zip(ops, op_colors(ops), strict=True)}
    what = f"Communication per step by collective (bus bytes, busiest {ctx.noun})"
    return stacked_bars(ctx, df, parts, what, "bus bytes per step ({unit})", memory=False)


def op_colors(ops: list[str]) -> list[str]:
    extra = sns.color_palette("Dark2", 8).as_hex()
    unknown = sorted(o for o in ops if o not in st.OP_COLORS)
    return [st.OP_COLORS.get(o) or extra[unknown.index(o) % len(extra)] for o in ops]


def memory_breakdown(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """(g) Peak memory per device split into parameters, gradients, optimizer, activations, other."""
    parts = {f"peak_memory_{c}_bytes": (c, st.CATEGORY_COLORS[c]) for c in CATEGORIES}
    if not df["breakdown"].any():
        return None
    what = f"Peak memory per {ctx.noun} by category"
    return stacked_bars(ctx, df, parts, what, f"memory per {ctx.noun} ({{unit}})", memory=True)
