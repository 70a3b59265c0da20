"""The one look of every report figure: colors, markers, units, tick labels, and byte-stable files.

A strategy keeps its color, marker and dash in every figure (``strategy_style``, legend.LAYOUTS),
so a reader learns them once; several layouts of one strategy in one panel (TP+SP 2x4 and 4x2)
share its marker shape and differ by color (its hue turned and lightened), dash and fill. A point
that runs out of memory is its layout's marker crossed out (``crossed``), so that it is told
apart by shape and fill, not by color alone (#46). Strategies this module does not know (a
third-party plugin) take the next free colors in name order.

Files are byte-identical for identical records: no dates or versions in the metadata, a fixed
SVG hash salt (matplotlib otherwise salts element ids randomly), fixed figure sizes and dpi, and
callers hand over data in a sorted order.
"""

from __future__ import annotations

import colorsys
import io
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib as mpl
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.markers import MarkerStyle
from matplotlib.path import Path as MarkerPath
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

from tspbench.core.files import write_atomic
from tspbench.report.legend import DEFAULT_EXCHANGE, EXCHANGES, LAYOUTS, split_exchange

_CB = sns.color_palette("colorblind").as_hex()
KNOWN_STRATEGIES = tuple(LAYOUTS)  # their colors and markers: the one table, legend.py
STRATEGY_COLORS = {name: _CB[look.color] for name, look in LAYOUTS.items()}
STRATEGY_MARKERS = {name: look.marker for name, look in LAYOUTS.items()}
STRATEGY_DASHES = {name: look.dash for name, look in LAYOUTS.items()}
EXTRA_COLORS = [_CB[i] for i in (1, 6, 8)] + sns.color_palette("dark", 10).as_hex()
EXTRA_MARKERS = ("*", "<", ">", "p", "d", "H", "8")
DASHES = ("", (5, 2), (1.5, 1.5), (6, 1.5, 1.5, 1.5), (3, 1), (8, 2, 2, 2, 2, 2))
FILLS = ("full", "none", "left", "top", "bottom", "right")

# Categories (memory) and collectives (comm) get a palette of their own, distinct from strategies.
CATEGORY_COLORS = dict(
    zip(
        ("parameters", "gradients", "optimizer", "activations", "other", "kv_cache"),
        sns.color_palette("Set2", 8).as_hex()[:6],
        strict=True,
    )
)
OP_COLORS = dict(
    zip(
        ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "broadcast", "reduce", "all_to_all"),
        sns.color_palette("Set2", 8).as_hex()[:7],
        strict=True,
    )
)
CAPACITY_COLOR = "#3a3a3a"
OOM_MARKER = "X"

PNG_DPI = 150
RC = {
    **sns.axes_style("whitegrid"),
    "font.size": 9.5,
    "axes.titlesize": 10,
    "axes.labelsize": 9.5,
    "xtick.labelsize": 8.5,
    "ytick.labelsize": 8.5,
    "legend.fontsize": 8.5,
    "legend.title_fontsize": 9,
    "figure.titlesize": 11.5,
    "lines.linewidth": 1.8,
    "lines.markersize": 6,
    "svg.hashsalt": "tspbench-report",
    "svg.fonttype": "path",
    "figure.dpi": 100,
}


def strategy_style(strategies: Sequence[str]) -> dict[str, tuple[str, str]]:
    """(color, marker) per strategy: fixed for the built-in ones, the next free ones for the rest
    (their dash: STRATEGY_DASHES, solid for the rest)."""
    out = {s: (STRATEGY_COLORS[s], STRATEGY_MARKERS[s]) for s in KNOWN_STRATEGIES}
    extra = sorted(set(strategies) - set(KNOWN_STRATEGIES))
    for i, name in enumerate(extra):
        color = EXTRA_COLORS[i] if i < len(EXTRA_COLORS) else to_hex(sns.husl_palette(len(extra))[i])
        out[name] = (color, EXTRA_MARKERS[i % len(EXTRA_MARKERS)])
    return out


HUE_TURN = 0.16  # of the color circle (58 degrees) over a strategy's layouts, dark to light


def variant_color(color: str, i: int, n: int) -> str:
    """The color of layout ``i`` of ``n`` of one strategy: lightness spread evenly from dark (0.22)
    to light (0.68) and the hue turned by ``HUE_TURN`` in all, so that four layouts of TP+SP are
    four colors (purple to magenta), not four near-identical shades of one (#46)."""
    if n == 1:
        return color
    hue, _, sat = colorsys.rgb_to_hls(*to_rgb(color))
    t = i / (n - 1)
    return to_hex(colorsys.hls_to_rgb((hue + HUE_TURN * (t - 0.5)) % 1.0, 0.22 + 0.46 * t, sat))


def variant_dash(strategy_dash: tuple[float, ...], i: int) -> tuple[float, ...]:
    """Layout ``i`` of a strategy: the strategy's own dash first, then the others in DASHES' order,
    solid last (the paper's TSP is the solid line)."""
    own = tuple(strategy_dash)
    others = [tuple(d) for d in DASHES if d and tuple(d) != own] + ([()] if own else [])
    return [own, *others][i % (len(others) + 1)]


def crossed(marker: str, fill: str = "full") -> MarkerPath:
    """A layout's marker crossed out, as one path (one scatter draws it): its filled part (the
    whole, half of it, or none: ``fill`` as its line's), then its outline and an X as two-point
    segments, which have no area to fill and are stroked in the edge color. Draw it about 1.5
    times the area of a plain marker: the cross's arms take the path's outer edge."""
    whole = MarkerStyle(marker)
    outline = whole.get_path().transformed(whole.get_transform())
    parts = []
    if fill != "none":
        part = MarkerStyle(marker, fillstyle=fill)
        parts.append(part.get_path().transformed(part.get_transform()))
    for poly in outline.to_polygons(closed_only=False):
        parts += [MarkerPath([a, b]) for a, b in itertools.pairwise(poly)]
    arm = 0.62  # past the marker's edge (0.5): the cross shows across a dark fill too
    parts += [MarkerPath([(-arm, -arm), (arm, arm)]), MarkerPath([(-arm, arm), (arm, -arm)])]
    return MarkerPath.make_compound_path(*parts)


class SeriesStyle:
    """Color, marker, dash and marker fill per series label. Series of one strategy share its
    marker shape and differ by color (``variant_color``), dash (the strategy's first) and fill
    (full, hollow, half).
    Where a series names a K/V exchange ('sp8 (ring)', legend.EXCHANGES), the dash is the
    exchange's in every layout, and lightness and fill tell only the layouts apart (#48)."""

    def __init__(self, series: Sequence[tuple[str, str]], all_strategies: Sequence[str]) -> None:
        """``series`` is (label, strategy) pairs in legend order; ``all_strategies`` fixes colors."""
        base = strategy_style(all_strategies)
        self.labels = [label for label, _ in series]
        self.strategy = dict(series)
        self.color: dict[str, str] = {}
        self.marker: dict[str, str] = {}
        self.variant: dict[str, int] = {}
        self.dash: dict[str, tuple[float, ...]] = {}  # its layout's, or its K/V exchange's where shown
        split = {label: split_exchange(label) for label in self.labels}
        by_exchange = any(exchange != DEFAULT_EXCHANGE for _, exchange in split.values())
        for strategy in dict.fromkeys(s for _, s in series):
            members = [label for label, s in series if s == strategy]
            # with exchanges shown, 'sp8' and 'sp8 (ring)' are one layout: one color, two dashes
            layouts = list(dict.fromkeys(split[m][0] for m in members)) if by_exchange else members
            color, marker = base[strategy]
            for label in members:
                i = layouts.index(split[label][0] if by_exchange else label)
                self.color[label] = variant_color(color, i, len(layouts))
                self.marker[label] = marker
                self.variant[label] = i
                own = variant_dash(STRATEGY_DASHES.get(strategy, ()), i)
                self.dash[label] = EXCHANGES[split[label][1]].dash if by_exchange else own

    def line(self, label: str) -> dict:
        """Keyword arguments for ``Axes.plot`` / ``Line2D`` of this series."""
        i = self.variant[label]
        dash = self.dash[label]
        fill, color = FILLS[i % len(FILLS)], self.color[label]
        return {
            "color": color,
            "marker": self.marker[label],
            "linestyle": "-" if not dash else (0, dash),
            "fillstyle": fill,
            "markerfacecoloralt": "white",
            "markeredgecolor": "white" if fill == "full" else color,
            "markeredgewidth": 0.6 if fill == "full" else 1.2,
            "label": label,
        }

    def oom(self, label: str) -> dict:
        """Keyword arguments for ``Axes.scatter`` of this series' out-of-memory marks: its marker,
        filled as its line's, crossed out (``crossed``): in black across a full marker, in its
        color across a hollow or half one."""
        fill, color = FILLS[self.variant[label] % len(FILLS)], self.color[label]
        edge = "black" if fill == "full" else color
        marker = crossed(self.marker[label], fill)
        return {"marker": marker, "color": color, "edgecolors": edge, "linewidths": 1.0}


# ----------------------------------------------------------------------------- units and ticks


def byte_unit(values: Sequence[float]) -> tuple[str, float]:
    """GiB, MiB or KiB, whichever reads best for the typical (median) value: (name, divisor).
    The median, not the maximum: one predicted 1.1 GiB must not turn 60 MiB peaks into 0.06."""
    finite = sorted(abs(v) for v in values if v == v)
    typical = finite[len(finite) // 2] if finite else 0.0
    for name, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if typical >= scale:
            return name, float(scale)
    return "KiB", float(2**10)


def unit_name(scale: float) -> str:
    """The name of a ``byte_unit`` divisor: 2**30 -> 'GiB'."""
    return {2.0**30: "GiB", 2.0**20: "MiB", 2.0**10: "KiB"}.get(float(scale), "bytes")


def tokens_label(n: float) -> str:
    """4096 -> '4K', 131072 -> '128K', 1048576 -> '1M' (powers of two: that is how sequences grow);
    1536 -> '1.5K', so that 1536 and 3072 on one axis read '1.5K' and '3K', not '1536' and '3K'."""
    if n >= 2**20 and n % 2**20 == 0:
        return f"{int(n) // 2**20}M"
    if n >= 2**10 and n % 2**9 == 0:
        return f"{n / 2**10:g}K"
    return f"{n:g}"


def count_label(x: float, _pos: int | None = None) -> str:
    """1234 -> '1,234'; 0.25 -> '0.25' (no scientific notation on an axis)."""
    return f"{x:,.0f}" if abs(x) >= 10 or x == int(x) else f"{x:.3g}"


def count_formatter(axis: Axis) -> FuncFormatter:
    """Plain numbers, in K or M when the axis reaches 20,000 or 2,000,000: decided by the axis
    range at draw time, so every tick of one axis uses the same style."""

    def label(x: float, _pos: int | None = None) -> str:
        top = max(abs(v) for v in axis.get_view_interval())
        for div, suffix in ((1e6, "M"), (1e3, "K")):
            if top >= 2 * div and x != 0:
                return f"{x / div:,.3g}{suffix}"
        return count_label(x)

    return FuncFormatter(label)


def log2_axis(ax: Axes, values: Sequence[float], label: Callable[[float], str] = tokens_label) -> None:
    """Log2 x axis with a tick at each value swept (and only those), labelled in words."""
    ticks = sorted({float(v) for v in values})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: label(x)))
    if len(ticks) == 1:
        ax.set_xlim(ticks[0] / 1.5, ticks[0] * 1.5)
    else:
        ax.set_xlim(ticks[0] / 2**0.3, ticks[-1] * 2**0.3)


def plain_y(ax: Axes, log: bool = False) -> None:
    """Plain y tick labels; on a log axis ticks at 1, 2 and 5 per decade, none unlabelled."""
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(count_formatter(ax.yaxis))


# ----------------------------------------------------------------------------- figures and files


def new_figure(width: float, height: float) -> Figure:
    """A figure outside pyplot (no global state, nothing to close) with constrained layout."""
    return Figure(figsize=(round(width, 2), round(height, 2)), layout="constrained")


def fit_suptitle(fig: Figure) -> None:
    """Wrap each line of the figure's title that is wider than the figure (a one-panel bar chart
    is narrow, and its last line, the source, must not be cut off), at the last ' - ' that fits
    past a third of the line, else the last ', ', else the last space."""
    title = fig._suptitle  # matplotlib keeps no public handle on the Text
    if title is None or not title.get_text():
        return
    longest = max(title.get_text().split("\n"), key=len)
    width = title.get_window_extent(fig._get_renderer()).width
    fits = max(int(fig.bbox.width * 0.96 / (width / max(len(longest), 1))), 20)
    lines = []
    for line in title.get_text().split("\n"):
        while len(line) > fits:
            cut = next((c for sep in (" - ", ", ", " ") if (c := line.rfind(sep, 0, fits)) > fits // 3), -1)
            cut = cut if cut > 0 else fits
            lines.append(line[:cut].rstrip(" ,") + ("," if line[cut : cut + 2] == ", " else ""))
            line = line[cut:].lstrip(" ,-")
        lines.append(line)
    title.set_text("\n".join(lines))


def save(fig: Figure, base: Path) -> list[Path]:
    """Write ``base``.png and .svg, byte-identical for identical figures (the title wrapped to
    the figure's width: ``fit_suptitle``); returns both paths."""
    fit_suptitle(fig)
    out = []
    for ext, meta in (("png", {"Software": None}), ("svg", {"Date": None, "Creator": None})):
        buf = io.BytesIO()
        with mpl.rc_context({"svg.hashsalt": RC["svg.hashsalt"], "svg.fonttype": "path"}):
            fig.savefig(buf, format=ext, dpi=PNG_DPI, metadata=meta)
        path = base.with_suffix(f".{ext}")
        write_atomic(path, buf.getvalue())
        out.append(path)
    return out
