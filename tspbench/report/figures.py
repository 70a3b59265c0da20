"""The report's line figures (memory, throughput, scaling, micro-batch) and what all figures share.

Every figure function takes the prepared records (``tspbench.report.frame.prepare``) and a
``Context`` (what to call the hardware and the preset) and returns a Figure, or None when the
records do not support it (no sequence sweep, no world-size sweep, ...); the bar charts and
the parity plot are in tspbench.report.bars. Panels vary one thing on the x axis; whatever
else varies across the records (recomputation mode, micro-batch, D) gets a panel of its own,
so no line ever mixes two settings.

Out-of-memory points are results, and a figure must not let a peak that does not fit pass for
one that does: memory axes draw the capacity (the tracker's limit on CPU, the hardware profile's
usable memory for projected and fake-world points) as a named dashed line, and the layout's
marker crossed out (style.crossed: its shape and fill tell layouts apart without color, #46)
at every predicted OOM peak (on the capacity line when there is no prediction) and on every
fake-world peak over the capacity (the fake world never runs out: the cross says the device
would). Every mark stays inside the axes at its value: a memory axis turns log when some
prediction is far over everything else. Throughput axes have no value to show for an OOM
point: its mark sits in a strip below zero, a row per layout, so none hides another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter
from matplotlib.transforms import blended_transform_factory

from tspbench.report import studies
from tspbench.report import style as st
from tspbench.report.band import band_handles, band_note, draw_band
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


@dataclass(frozen=True)
class Panel:
    """One quantity on the y axis: its column, its label, and how to scale it."""

    column: str
    label: str  # may hold {unit}
    memory: bool = False  # bytes: unit chosen from the data, capacity drawn, OOM at the prediction
    log: bool = False

    @property
    def strip(self) -> bool:
        """Whether its OOM points go in a strip below zero (no value to show, a zero to show)."""
        return not self.memory and not self.log


STRIP_ROW = 0.045  # axes fraction per layout in a throughput panel's out-of-memory strip
OOM_STYLE = {"marker": st.OOM_MARKER, "s": 100, "edgecolors": "black", "linewidths": 0.7, "zorder": 5}
OOM_KEY = {
    "ls": "",
    "marker": st.crossed("s", "none"),
    "color": "white",
    "markeredgecolor": "black",
    "markersize": 8,
}


def draw_lines(ax: Axes, df: pd.DataFrame, x: str, panel: Panel, style: st.SeriesStyle, scale: float) -> None:
    """One line per series over ``x`` (completed points); on memory axes the capacity dashed and
    its crossed marker at every peak that does not fit (predicted for an OOM point, executed for
    a fake-world point over the device's usable memory)."""
    ok = df[(df["status"] == "completed") & df[panel.column].notna()].sort_values(x)
    for label in style.labels:
        rows = ok[ok["series"] == label]
        if len(rows):
            draw_band(ax, rows, x, panel.column, style.color[label], scale)  # projected: its range
            ax.plot(rows[x], rows[panel.column] / scale, zorder=3, **style.line(label))
    if not panel.memory:
        return
    draw_capacity(ax, df, scale)
    oom = df[df["status"] == "oom"]
    for value, group in oom.groupby(x, sort=True):  # marks at one x side by side (log2 x: a factor)
        order = sorted(group.index, key=lambda i: style.labels.index(group.at[i, "series"]))
        for k, i in enumerate(order):
            at = value * 2 ** (0.09 * (k - (len(order) - 1) / 2))
            mark = style.oom(group.at[i, "series"])
            ax.scatter([at], [group.at[i, "oom_at"] / scale], **{**OOM_STYLE, **mark})
    over = ok[ok["over_capacity"]]
    for label, rows in over.groupby("series", sort=False):  # on the line's own point
        ax.scatter(rows[x], rows[panel.column] / scale, **{**OOM_STYLE, **style.oom(label)})


def draw_capacity(ax: Axes, df: pd.DataFrame, scale: float) -> None:
    """The capacity as a dashed line across the panel, named on the panel too, under the line."""
    if df["capacity"].nunique() != 1:
        return
    cap = df["capacity"].iloc[0] / scale
    ax.axhline(cap, color=st.CAPACITY_COLOR, ls="--", lw=1.1, zorder=2, label=capacity_label(df, scale))
    # under the line: every X (a peak that does not fit) lies above it and would cover the name
    ax.annotate(capacity_label(df, scale, short=True), (0.01, cap), xycoords=("axes fraction", "data"),
                xytext=(0, -2), textcoords="offset points", ha="left", va="top", fontsize=7,
                color=st.CAPACITY_COLOR, zorder=4,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.75})  # fmt: skip


def oom_rows(df: pd.DataFrame, style: st.SeriesStyle) -> list[str]:
    """The layouts with an out-of-memory point in ``df``, in legend order: one strip row each."""
    hit = set(df.loc[df["status"] == "oom", "series"])
    return [label for label in style.labels if label in hit]


def draw_oom_strip(ax: Axes, df: pd.DataFrame, x: str, style: st.SeriesStyle, height: float) -> None:
    """Out-of-memory points of an axis with no value to show (throughput): a strip of ``height``
    (axes fraction) below zero, a row per layout that ran out, its crossed marker at each length it could not
    run, so that no mark hides another. ``finish_strip`` puts zero on the strip's top edge."""
    ax.add_patch(Rectangle((0, 0), 1, height, transform=ax.transAxes, facecolor="#f3f3f3", lw=0, zorder=1))
    ax.text(-0.015, height / 2, "out of\nmemory", transform=ax.transAxes, ha="right", va="center",
            fontsize=7.5, color="#444444")  # fmt: skip
    where = blended_transform_factory(ax.transData, ax.transAxes)
    oom = df[df["status"] == "oom"]
    for k, label in enumerate(oom_rows(df, style)):
        xs = oom.loc[oom["series"] == label, x]
        y = height - STRIP_ROW * (k + 0.5) - 0.01
        ax.scatter(xs, [y] * len(xs), transform=where, **{**OOM_STYLE, **style.oom(label), "s": 70})


def finish_strip(ax: Axes, height: float) -> None:
    """Zero at ``height`` of the axes: the strip below it holds the OOM rows, unlabelled ticks."""
    top = ax.get_ylim()[1]
    ax.set_ylim(-top * height / (1 - height), top)
    label = ax.yaxis.get_major_formatter()
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, pos: "" if v < 0 else label(v, pos)))
    ax.axhline(0, color="#888888", lw=0.8, zorder=2)


def log_memory(df: pd.DataFrame, panel: Panel) -> Panel:
    """A memory panel on a log axis when some predicted OOM peak is more than twice the larger of
    the capacity and every completed peak: a linear axis would squash the lines that fit (and
    every mark must stay inside the axes, at its value)."""
    if not panel.memory:
        return panel
    done = df.loc[df["status"] == "completed", panel.column].max()
    base = np.nanmax([done, df["capacity"].max(), 0.0])
    if base <= 0 or not (df["oom_at"] > 2.0 * base).any():
        return panel
    return replace(panel, log=True, label=panel.label.replace("{unit}", "{unit}, log scale"))


def series_handles(style: st.SeriesStyle) -> list[Line2D]:
    return [Line2D([], [], **style.line(label)) for label in style.labels]


def key_handles(df: pd.DataFrame, memory: bool, unit: tuple[str, float], strip: bool) -> list[Line2D]:
    """Legend entries for the capacity line and the out-of-memory marks, when the figure has them
    (the mark white, so that it is no layout's color)."""
    out = []
    if memory and df["capacity"].nunique() == 1:
        out.append(Line2D([], [], color=st.CAPACITY_COLOR, ls="--", label=capacity_label(df, unit[1])))
    mark = OOM_KEY  # the layout's marker, crossed out (style.crossed)
    if memory and (df["status"] == "oom").any():
        out.append(Line2D([], [], **mark, label="out of memory: its marker crossed\nat its predicted peak"))
    if memory and df["over_capacity"].any():
        device = df["capacity_of"].iloc[0] or "the device"
        out.append(Line2D([], [], **mark, label=f"over {device}'s usable memory: would run out\n"
                          "of memory (crossed, at the executed peak)"))  # fmt: skip
    if strip:
        out.append(
            Line2D(
                [],
                [],
                **mark,
                label="out of memory (no throughput): its\nmarker crossed, in the strip below 0",
            )
        )
    return out


def capacity_label(df: pd.DataFrame, scale: float, short: bool = False) -> str:
    """'MI300X usable memory (182 GiB of 192 GiB)' for a profile's, 'simulated capacity (288 MiB)'
    for a CPU run's tracker limit; ``short``: the words on the line itself."""
    unit = st.unit_name(scale)
    cap = f"{df['capacity'].iloc[0] / scale:,.0f} {unit}"
    device, total = df["capacity_of"].iloc[0], df["memory_total"].iloc[0]
    if device and df["memory_total"].nunique() == 1:
        whole = f"{total / scale:,.0f} {unit}"
        return f"{device} usable {cap}" if short else f"{device} usable memory ({cap} of {whole})"
    name = capacity_name(df)
    return f"{name} {cap}" if short else f"{name} ({cap})"


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
    else one row per facet. Panels of one quantity share their y axis, so heights compare across
    panels; when facets hold different layouts (one per world size) each gets its own legend
    below it. Out-of-memory points of a quantity with no value (throughput) sit in a strip below
    zero, a row per layout."""
    df = df.assign(series=df[series])
    cols = facet_columns(df, x, ("world_size",) if series == "series" else ())
    groups = facets(df, cols, ctx.noun)
    styles = [st.SeriesStyle(series_list(sub), ctx.strategies) for _, sub in groups]
    shared = all(s.labels == styles[0].labels for s in styles)
    panels = [log_memory(df, p) for p in panels]
    rows = max(len(oom_rows(sub, style)) for (_, sub), style in zip(groups, styles, strict=True))
    strip = STRIP_ROW * rows + 0.02 if rows else 0.0
    ncols = len(panels) if len(panels) > 1 else min(len(groups), 3)
    nrows = -(-len(groups) * len(panels) // ncols)
    below = 0 if shared else 0.22 * max(len(s.labels) for s in styles) + 0.5
    fig = st.new_figure((4.8 if ncols == 1 else 3.9) * ncols + 2.4, (3.0 + below + 3.0 * strip) * nrows + 0.6)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey="col" if len(panels) > 1 else True).ravel()
    units = {p.column: memory_unit(df, p) for p in panels}
    cells = [(t, sub, style, p) for (t, sub), style in zip(groups, styles, strict=True) for p in panels]
    for i, (ax, (label, sub, style, panel)) in enumerate(zip(axes, cells, strict=False)):
        draw_lines(ax, sub, x, panel, style, units[panel.column][1])
        finish_axes(ax, df[x], x, panel, label, xlabel)
        if strip and panel.strip:
            draw_oom_strip(ax, sub, x, style, strip)
        first_in_row = i % ncols == 0 or len(panels) > 1
        ax.set_ylabel(panel.label.format(unit=units[panel.column][0]) if first_in_row else "")
        if not shared and i % len(panels) == len(panels) - 1:
            ax.legend(
                handles=series_handles(style), loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False
            )
    for ax, (_, _, _, panel) in zip(axes, cells, strict=False):
        if strip and panel.strip:
            finish_strip(ax, strip)
    for ax in axes[len(cells) :]:
        ax.set_visible(False)
    memory = next((p for p in panels if p.memory), None)
    unit = units[memory.column] if memory else ("", 1.0)
    keys = key_handles(df, memory is not None, unit, strip > 0 and any(p.strip for p in panels))
    keys += band_handles(df, [p.column for p in panels])
    handles = (series_handles(styles[0]) if shared else []) + keys
    if handles:
        fig.legend(
            handles=handles, loc="outside right center", frameon=False, title="layout" if shared else None
        )
    note = band_note(df, [p.column for p in panels])  # what a priced speed rests on
    fig.suptitle(ctx.title(title, df) + (f"\n{note}" if note else ""))
    return fig


def memory_unit(df: pd.DataFrame, panel: Panel) -> tuple[str, float]:
    if not panel.memory:
        return "", 1.0
    return st.byte_unit([*df[panel.column].dropna(), *df["oom_at"].dropna(), *df["capacity"].dropna()])


def finish_axes(ax: Axes, xs: pd.Series, x: str, panel: Panel, title: str, xlabel: str) -> None:
    st.log2_axis(ax, xs.dropna().unique(), st.tokens_label if x == "seq_len" else st.count_label)
    ax.set_xlabel(xlabel)
    if not panel.log:
        ax.set_ylim(bottom=0)
    st.plain_y(ax, panel.log)
    if panel.memory and panel.log:  # bytes in plain numbers, not '0.005K GiB'
        ax.yaxis.set_major_formatter(FuncFormatter(st.count_label))
    ax.set_title(title)


# ----------------------------------------------------------------------------- the line figures


def memory_vs_seq(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """(a) Peak memory per device over sequence length, capacity drawn, OOM marked."""
    if not swept(df, "seq_len") or df["peak"].notna().sum() == 0:
        return None
    panel = Panel("peak", f"peak memory per {ctx.noun} ({{unit}})", memory=True)
    title = f"Peak memory per {ctx.noun} vs sequence length{recompute_words(df)}"
    return line_figure(ctx, df, "seq_len", "sequence length (tokens)", [panel], title)


def throughput_vs_seq(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """(b) Tokens/s per device over sequence length."""
    if not swept(df, "seq_len") or df["tput"].notna().sum() == 0:
        return None
    panel = Panel("tput", f"tokens/s per {ctx.noun}")
    title = f"Throughput per {ctx.noun} vs sequence length{recompute_words(df)}"
    return line_figure(ctx, df, "seq_len", "sequence length (tokens)", [panel], title)


def recompute_words(df: pd.DataFrame) -> str:
    """', recompute selective' when every training point recomputes alike (memory and speed
    depend on it as much as on the layout); '' when it varies (each panel then names it)."""
    values = set(df["recompute"]) - {""}
    return f", recompute {values.pop()}" if len(values) == 1 and (df["mode"] == "train").all() else ""


def scaling(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """(c) Per-device and aggregate throughput over the number of devices (same replica, more dp)."""
    if not swept(df, "world_size", "series_mp") or df["tput"].notna().sum() == 0:
        return None
    panels = [Panel("tput", f"tokens/s per {ctx.noun}"), Panel("agg", f"tokens/s, all {ctx.noun}s", log=True)]
    if studies.trains(df) and studies.column(df, "internode_share").notna().any():  # what bends the curves
        share = studies.column(df, "internode_share").where(df["status"] == "completed")
        df = df.assign(internode_pct=share * 100)
        panels.append(Panel("internode_pct", "inter-node traffic, % of step"))
    note = studies.scaling_note(df)  # why the curves are flat (forward only), or what bends them
    title = "Scaling: model-parallel replicas x data parallel" + (f"\n{note}" if note else "")
    return line_figure(ctx, df, "world_size", f"{ctx.noun}s", panels, title, "series_mp")


def microbatch(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """(d) Throughput and peak memory over micro-batch size."""
    if not swept(df, "batch") or df["tput"].notna().sum() == 0:
        return None
    panels = [Panel("tput", f"tokens/s per {ctx.noun}"),
              Panel("peak", f"peak memory per {ctx.noun} ({{unit}})", memory=True)]  # fmt: skip
    title = "Micro-batch sweep" + ("\nDotted: each layout's wall, the first micro-batch that does not fit"
                                   if (df["status"] == "oom").any() else "")  # fmt: skip
    fig = line_figure(ctx, df, "batch", "micro-batch (sequences per replica)", panels, title)
    groups = facets(df, facet_columns(df, "batch", ("world_size",)), ctx.noun)  # as line_figure's cells
    for i, (_, sub) in enumerate(groups):
        style = st.SeriesStyle(series_list(sub), ctx.strategies)
        for j, ax in enumerate(fig.axes[i * len(panels) : (i + 1) * len(panels)]):
            studies.draw_walls(ax, sub, style, label=j == 0)
    return fig
