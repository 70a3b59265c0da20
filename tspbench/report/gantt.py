"""The report's Gantt figure: one decoder layer's forward per strategy, as the timeline replays it.

An experiment run with ``run.trace: true`` keeps each point's traced step beside its record
(``<run>/trace.npz``: what every rank issued, in program order). ``pick`` takes one completed,
traced point per strategy at one shape: the most common setting (world size, mode,
recomputation, micro-batch, model, dtype; ties to the larger world), the longest sequence that
every traced strategy ran there, and a strategy's first layout in the report's order among those
with the most model-parallel axes above 1 (TP+SP as tp4 x sp2, not tp8 x sp1, which is TP). Each is
re-priced (tspbench.analytic.replayed.reprice: the timeline) on the hardware profile its record
names (``timeline_hardware``, else ``hardware``, else ``cpu`` for a CPU run and ``mi300x`` for a
simulated GPU: tspbench.analytic.profile_choice.profile_name) in the point's world.

One panel per strategy shows the lowest replayed rank (rank 0) over one layer's forward, from
its begin mark to its end mark: the second layer's (a steady one: the first carries the step's
start), else the first. Lanes as in the Chrome trace (tspbench.analytic.chrome): ``compute:
<stream>`` per CUDA stream (one on CPU) with every op that runs a kernel, split into the host's
time per op (drawn first) and the kernel, coloured GEMM / attention / element-wise / host; and
``link: node`` / ``link: nic`` with each collective from its start to its end, coloured by op.
Bars are drawn where the replay placed them (an op or collective that overlaps the layer's span
is drawn whole, the axis cut at the longest layer); x in ms from the layer's start, shared by
the panels, a dashed line at each layer's end. Each bar collection's gid is ``lane|kind``.

A weight broadcast lasts about one pixel on a layer's scale, so a lone bar on a link or
side-stream lane shorter than ``MIN_WIDTH`` of the axis is drawn that wide and outlined (gid
``lane|kind|widened``, the width named in the x label and the legend), and a panel with such a
collective gets a zoomed row below the panels (``zoom_window``: one period of its shortest
collective, shaded in the panel) where every bar has its true length.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from tspbench.analytic import prices
from tspbench.analytic.chrome import LINK_TRACKS, kernel_ops, layer_spans
from tspbench.analytic.profile_choice import profile_name, record_profile
from tspbench.analytic.replayed import reprice
from tspbench.analytic.timeline import Timeline
from tspbench.core.errors import DamagedFileError
from tspbench.core.names import AXES
from tspbench.core.spec import model_label
from tspbench.core.trace import ATTENTION, ELEMENTWISE, GEMM, load_traces
from tspbench.report import style as st
from tspbench.report.bars import op_colors
from tspbench.report.frame import Context

TRACE_FILE = "trace.npz"
RUN_DIR = "run_dir"  # column: the point's run folder (tspbench.report.build adds it)
SETTING = ("world_size", "mode", "recompute", "batch", "model", "dtype")
LAYER = 1  # the second layer's forward, else the first
KIND_NAMES = {GEMM: "GEMM", ATTENTION: "attention", ELEMENTWISE: "element-wise"}
KIND_COLORS = {"GEMM": "#4c72b0", "attention": "#c44e52", "element-wise": "#7f7f7f", "host": "#d4d4d4"}
BAR_HEIGHT = 0.7
MIN_WIDTH = 0.0035  # the narrowest bar the overview draws, as a fraction of its x span (about 4 px)
ZOOM_COLOR = "#ececec"  # the overview's shading of the window zoomed below


@dataclass(frozen=True)
class Bar:
    """One drawn bar: its lane, what it is (a compute kind or a collective op), seconds from the
    layer's start and its length in seconds."""

    lane: str
    kind: str
    start: float
    seconds: float


@dataclass(frozen=True)
class Panel:
    """One strategy's layer: which point, which layer, how long its forward took, lanes, bars."""

    label: str
    run_id: str
    layer: str
    seconds: float
    lanes: list[str]
    bars: list[Bar]


# ----------------------------------------------------------------------------- choosing points


def traced(df: pd.DataFrame) -> pd.DataFrame:
    """The completed points whose run folder holds a step trace (none without a run_dir column)."""
    if RUN_DIR not in df:
        return df.iloc[:0]
    has = [isinstance(d, str) and (Path(d) / TRACE_FILE).is_file() for d in df[RUN_DIR]]
    return df[(df["status"] == "completed") & np.array(has, dtype=bool)]


def pick(df: pd.DataFrame) -> pd.DataFrame:
    """One traced point per strategy at a common shape (see the module docstring), in the
    report's order; empty when no point has a trace. A strategy's layout is its first with the
    most model-parallel axes above 1: TP+SP drawn as tp4 x sp2, not as tp8 x sp1 (plain TP)."""
    rows = traced(df)
    if rows.empty:
        return rows
    keys = list(zip(*(rows[c] for c in SETTING), strict=True))
    counts = Counter(keys)
    setting = max(counts, key=lambda k: (counts[k], k[0]))  # first seen among equals
    rows = rows[[k == setting for k in keys]]
    lengths = rows.groupby("strategy", sort=False)["seq_len"].agg(set)
    seen = Counter(s for values in lengths for s in values)
    seq = max(seen, key=lambda s: (seen[s], s))  # the longest that every strategy has, if any
    rows = rows[rows["seq_len"] == seq]
    mixed = sum((rows[a] > 1).astype(int) for a in AXES if a != "dp" and a in rows)
    order = np.argsort(-np.asarray(mixed), kind="stable")
    return rows.iloc[order].drop_duplicates("strategy").sort_index()


def replay(row: pd.Series) -> Timeline:
    """The point's stored trace re-priced on the profile its record names (profile_name)."""
    traces, _ = load_traces(Path(row[RUN_DIR]) / TRACE_FILE)
    return reprice(row, traces, record_profile(row))


# ----------------------------------------------------------------------------- replay -> bars


def layer_window(tl: Timeline, rank: int) -> tuple[str, float, float] | None:
    """(label, begin s, end s) of the layer drawn: the second layer marked, else the first."""
    spans = layer_spans(tl.replay.states[rank])
    first = list(dict.fromkeys(label for label, _, _ in spans))
    if not first:
        return None
    label = first[min(LAYER, len(first) - 1)]
    return next(span for span in spans if span[0] == label)


def compute_bars(tl: Timeline, rank: int, t0: float, t1: float) -> list[Bar]:
    """The kernel ops overlapping [t0, t1): the host's time per op, then the kernel."""
    trace = tl.replay.states[rank].trace
    rows, start, seconds = kernel_ops(tl, rank)
    base, host = tl.replay.base[rank], prices.host_overhead_seconds(tl.replay.costs.hw)
    out = []
    for i in rows[(start[rows] < t1) & (start[rows] + seconds[rows] > t0)]:
        lane = f"compute: {trace.streams[int(trace.events['stream'][i])]}"
        kind = KIND_NAMES.get(int(trace.events["cls"][i]), "element-wise")
        front = seconds[i] * host / base[i] if base[i] > 0 else 0.0
        if front > 0:
            out.append(Bar(lane, "host", start[i] - t0, front))
        out.append(Bar(lane, kind, start[i] + front - t0, seconds[i] - front))
    return out


def collective_bars(tl: Timeline, rank: int, t0: float, t1: float) -> list[Bar]:
    """The rank's collectives whose replayed span overlaps [t0, t1), start to end."""
    colls = {id(c): c for c in tl.replay.states[rank].coll_of.values() if c.scheduled}.values()
    hits = sorted((c for c in colls if c.start < t1 and c.end > t0), key=lambda c: (c.start, c.end, c.op))
    return [Bar(f"link: {c.link}", c.op, c.start - t0, c.end - c.start) for c in hits]


def lanes(tl: Timeline, rank: int) -> list[str]:
    """The rank's compute streams, then the links it uses anywhere in the step."""
    state = tl.replay.states[rank]
    trace = state.trace
    streams = sorted({int(s) for s in trace.events["stream"][kernel_ops(tl, rank)[0]]})
    links = [link for link in LINK_TRACKS if any(c.link == link for c in state.coll_of.values())]
    return [f"compute: {trace.streams[s]}" for s in streams] + [f"link: {link}" for link in links]


def panel(row: pd.Series, tl: Timeline) -> Panel | None:
    """The strategy's panel from its replayed step; None when the trace marks no layer."""
    rank = min(tl.replay.states)
    window = layer_window(tl, rank)
    if window is None:
        return None
    label, t0, t1 = window
    bars = compute_bars(tl, rank, t0, t1) + collective_bars(tl, rank, t0, t1)
    return Panel(str(row["series"]), str(row["run_id"]), label, t1 - t0, lanes(tl, rank), bars)


# ----------------------------------------------------------------------------- drawing


def timeline_gantt(df: pd.DataFrame, ctx: Context) -> Figure | None:
    """One panel per strategy: a layer's forward on rank 0 as the timeline replays the traced
    step; None when no completed point has a trace with layer marks."""
    rows = pick(df)
    panels = []
    for _, row in rows.iterrows():
        try:
            tl = replay(row)
        except DamagedFileError as exc:  # one damaged trace leaves its panel out, not the report
            ctx.damaged.append(str(exc))
            continue
        panels += [p for p in (panel(row, tl),) if p is not None]
    return panels_figure(panels, ctx.noun, title(rows, ctx)) if panels else None


def panels_figure(panels: list[Panel], noun: str, suptitle: str) -> Figure:
    """The panels stacked on one shared ms axis, then a zoomed row for each panel with a
    collective too short to see (``zoom_window``); the ops' legend on the right."""
    right = max(p.seconds for p in panels) * 1e3 * 1.02
    least = MIN_WIDTH * right  # ms: the narrowest bar the overview draws (about 4 px)
    windows = [zoom_window(p, least) for p in panels]
    zooms = [(p, w) for p, w in zip(panels, windows, strict=True) if w is not None]
    rows = [*((p, None) for p in panels), *zooms]
    heights = [0.45 * len(p.lanes) + 0.55 for p, _ in rows]
    fig = st.new_figure(11.0, sum(heights) + 0.35 * len(zooms) + 1.6)
    axes = fig.subplots(len(rows), 1, squeeze=False, height_ratios=heights)[:, 0]
    over = axes[: len(panels)]
    for ax, p, window in zip(over, panels, windows, strict=True):
        draw_panel(ax, p, noun, least)
        if window is not None:
            ax.axvspan(*window, color=ZOOM_COLOR, zorder=0, lw=0)
    for ax, (p, window) in zip(axes[len(panels) :], zooms, strict=True):
        draw_zoom(ax, p, noun, window)
    for ax in over[1:]:
        ax.sharex(over[0])
    for ax in over[:-1]:
        ax.tick_params(labelbottom=False)
    over[0].set_xlim(0, right)
    widened = any(least_widened(p, least) for p in panels)
    notes = ["dashed: its end"]
    notes += [f"outlined: shorter than {least:.2g} ms, drawn {least:.2g} ms wide"] if widened else []
    notes += ["shaded: zoomed below"] if zooms else []
    over[-1].set_xlabel(f"ms from the layer's start ({'; '.join(notes)})")
    handles = legend_handles(panels, least)
    if widened:
        label = f"shorter, drawn {least:.2g} ms"
        handles.append(Patch(facecolor="white", edgecolor=st.CAPACITY_COLOR, label=label))
    fig.legend(handles=handles, loc="outside right center", frameon=False, title="op")
    fig.suptitle(suptitle)
    return fig


def draw_panel(ax: Axes, p: Panel, noun: str, least: float = 0.0) -> None:
    """The panel's lanes top to bottom, one bar collection per lane and kind; a lone short bar on
    a link or side-stream lane (``least_widened``) is drawn ``least`` ms wide and outlined
    (collection gid ``lane|kind|widened``), so that a short transfer shows."""
    colors = kind_colors([b.kind for b in p.bars])
    widened = least_widened(p, least)
    for y, lane in enumerate(p.lanes):
        for kind in dict.fromkeys(b.kind for b in p.bars if b.lane == lane):
            mine = [b for b in p.bars if b.lane == lane and b.kind == kind]
            for wide in (False, True):
                spans = [
                    (b.start * 1e3, least if wide else b.seconds * 1e3)
                    for b in mine
                    if (b in widened) is wide
                ]
                if not spans:
                    continue
                edge = {"edgecolor": st.CAPACITY_COLOR, "linewidth": 0.6} if wide else {"linewidth": 0}
                band = (y - BAR_HEIGHT / 2, BAR_HEIGHT)
                bars = ax.broken_barh(spans, band, facecolors=colors[kind], **edge)
                bars.set_gid(f"{lane}|{kind}" + ("|widened" if wide else ""))
    ax.axvline(p.seconds * 1e3, color=st.CAPACITY_COLOR, ls="--", lw=1.0)
    ax.set_yticks(range(len(p.lanes)), p.lanes)
    ax.set_ylim(len(p.lanes) - 0.5, -0.5)
    ax.grid(axis="y", visible=False)
    ms = f"{p.seconds * 1e3:.3g} ms"
    ax.set_title(f"{p.label}: {p.layer} forward on {noun} 0, {ms} (run {p.run_id})", loc="left")


def draw_zoom(ax: Axes, p: Panel, noun: str, window: tuple[float, float]) -> None:
    """The panel's bars at their true lengths, the x axis cut to ``window`` (ms)."""
    draw_panel(ax, p, noun)
    lo, hi = window
    ax.set_xlim(lo, hi)
    ax.set_xlabel(f"ms from {p.label}'s layer start (zoomed: true lengths)")
    thin = sorted({b.kind for b in p.bars if b.lane.startswith("link") and lo <= b.start * 1e3 < hi})
    what = ", ".join(thin)
    ax.set_title(f"{p.label}, zoomed to {lo:.3g}-{hi:.3g} ms: {what} at their true lengths", loc="left")


def least_widened(p: Panel, least: float) -> set[Bar]:
    """The bars shorter than ``least`` ms that the overview draws ``least`` ms wide: on a link or
    side-stream lane (not the first compute lane, whose ops run back to back: there a bar's width
    is the time the stream is busy), those whose widened span reaches no later bar of their lane."""
    out = set()
    for lane in p.lanes[1:]:
        mine = sorted((b for b in p.bars if b.lane == lane), key=lambda b: (b.start, b.seconds))
        for b, after in zip(mine, [*mine[1:], None][: len(mine)], strict=True):
            if b.seconds * 1e3 < least and (after is None or after.start * 1e3 >= b.start * 1e3 + least):
                out.add(b)
    return out


def zoom_window(p: Panel, least: float) -> tuple[float, float] | None:
    """(start ms, end ms) of the zoomed row for a panel with a collective shorter than ``least``
    ms, else None: from the layer's start to the end of the transfer that follows the second
    call of the shortest such op (one period of it), so both calls show several px wide."""
    colls = sorted((b for b in p.bars if b.lane.startswith("link")), key=lambda b: (b.start, b.seconds))
    thin = [b for b in colls if b.seconds * 1e3 < least]
    if not thin:
        return None
    shortest = min(thin, key=lambda b: b.seconds)
    calls = [b for b in thin if b.kind == shortest.kind]
    last = calls[min(1, len(calls) - 1)]
    after = [b for b in colls if b.start > last.start]
    end = (after[0].start + after[0].seconds if after else last.start + last.seconds) * 1e3
    return 0.0, min(end * 1.03, p.seconds * 1e3)


def kind_colors(kinds: list[str]) -> dict[str, str]:
    """Compute kinds' fixed colors; collectives' as the comm figure has them."""
    ops = sorted(set(kinds) - set(KIND_COLORS))
    return {**KIND_COLORS, **dict(zip(ops, op_colors(ops), strict=True))}


def legend_handles(panels: list[Panel], least: float = 0.0) -> list[Patch]:
    """The kinds that show in any panel (a bar at least a quarter of ``least`` ms, about a pixel,
    or one drawn ``least`` wide): compute kinds first, then collectives in the comm order. The
    host's time per op on a busy GPU-sized step is a few thousandths of a pixel: not listed (#46)."""
    drawn = {
        b.kind for p in panels for b in p.bars if b.seconds * 1e3 >= least / 4 or b in least_widened(p, least)
    }
    ops = [o for o in st.OP_COLORS if o in drawn] + sorted(drawn - set(st.OP_COLORS) - set(KIND_COLORS))
    colors = kind_colors(sorted(drawn))
    return [Patch(color=colors[k], label=k) for k in [*(k for k in KIND_COLORS if k in drawn), *ops]]


def title(rows: pd.DataFrame, ctx: Context) -> str:
    """Experiment, the point's shape, the profile and where the trace came from."""
    first = rows.iloc[0]
    experiment = str(first["experiment"]) if "experiment" in rows else "experiment"
    parts = [model_label(first["model"]) if first["model"] else "", first["mode"], first["dtype"],
             f"seq {st.tokens_label(float(first['seq_len']))}", f"micro-batch {first['batch']}",
             f"{first['world_size']} {ctx.noun}s", f"recompute {first['recompute']}"]  # fmt: skip
    shape = ", ".join(str(part) for part in parts if part)
    profiles = " / ".join(dict.fromkeys(profile_name(r) for _, r in rows.iterrows()))
    sources = " and ".join(
        dict.fromkeys("fake-world trace" if s == "fake" else "measured-run trace" for s in rows["source"])
    )
    what = "one decoder layer's forward per strategy, the timeline's replay of the executed step"
    return f"{experiment}: {what}\n{shape}\nreplayed on the {profiles} profile from the {sources}"
