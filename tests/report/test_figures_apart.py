"""Figures whose marks are told apart without color, and that list only what they draw (#46):
read back from the drawn figures (paths, dash patterns, pixel widths, text boxes) and from the
stored records, never from the style tables that drew them."""

from __future__ import annotations

import colorsys
import json
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from tspbench.report import bars, figures, gantt
from tspbench.report.build import best_against_best, with_run_dirs
from tspbench.report.frame import context, prepare
from tspbench.report.style import RC, SeriesStyle
from tspbench.sweep.store import load

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
RESULTS = ROOT / "results"


def drawn(experiment: str, module, name: str) -> Figure:
    runs = RESULTS / experiment
    df = prepare(with_run_dirs(load(runs), runs))
    rows, ctx = best_against_best(df, context(df), Path(experiment))
    with mpl.rc_context(RC):
        fig = getattr(module, name)(rows, ctx)
    fig.draw_without_rendering()
    return fig


def records(experiment: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((RESULTS / experiment).glob("*/result.json"))]


def grey(color: str) -> float:
    r, g, b = to_rgb(color)
    return 0.299 * r + 0.587 * g + 0.114 * b


def test_layouts_of_one_strategy_differ_in_hue_and_in_grey_and_every_line_by_marker_or_dash() -> None:
    names = ["tp_sp tp8 x sp1", "tp_sp tp4 x sp2", "tp_sp tp2 x sp4", "tp_sp tp1 x sp8"]
    series = [(n, "tp_sp") for n in names] + [
        ("tp8", "tp"),
        ("sp8", "sp"),
        ("fsdp_sp sp8", "fsdp_sp"),
        ("tsp8", "tsp"),
    ]
    style = SeriesStyle(series, ["tp", "sp", "tp_sp", "fsdp_sp", "tsp"])
    hues = [colorsys.rgb_to_hls(*to_rgb(style.color[n]))[0] * 360 for n in names]
    assert max(hues) - min(hues) >= 45  # four colors, not four shades of one purple
    greys = sorted(grey(style.color[n]) for n in names)
    assert min(np.diff(greys)) >= 0.05  # and still apart printed in grey
    looks = {
        (line["marker"], str(line["linestyle"]), line["fillstyle"]) for line in map(style.line, style.labels)
    }
    assert len(looks) == len(style.labels)  # no two lines alike once color is gone
    dashes = {str(style.line(n)["linestyle"]) for n in ("tp8", "sp8", "fsdp_sp sp8", "tsp8", names[0])}
    assert len(dashes) == 5  # each strategy a line style of its own


def strip_marks(ax) -> list[tuple]:
    """(row y, the mark's path vertices) of each out-of-memory mark drawn in axes coordinates."""
    out = []
    for coll in ax.collections:
        if isinstance(coll, PathCollection) and coll.get_offset_transform() != ax.transData:
            vertices = np.round(coll.get_paths()[0].vertices, 4).tobytes()
            out += [(round(float(y), 4), vertices) for _, y in coll.get_offsets()]
    return out


def test_out_of_memory_marks_of_different_layouts_differ_in_shape_or_fill() -> None:
    fig = drawn("paper_microbatch", figures, "microbatch")
    rows_seen = 0
    for ax in fig.axes:
        rows: dict[float, set[bytes]] = {}
        for y, path in strip_marks(ax):
            rows.setdefault(y, set()).add(path)
        assert all(len(paths) == 1 for paths in rows.values())  # one mark per layout's row
        paths = [next(iter(p)) for p in rows.values()]
        assert len(set(paths)) == len(paths)  # ...and no two rows alike without color
        rows_seen += len(rows)
    assert rows_seen >= 2


def test_memory_bars_list_only_what_they_draw_name_each_peaks_phase_and_keep_notes_off_the_line() -> None:
    recs = records("paper_memory_fake")
    fig = drawn("paper_memory_fake", bars, "memory_breakdown")
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "kv_cache" not in legend and all(r["peak_memory_kv_cache_bytes"] == 0 for r in recs)
    widths = [p for ax in fig.axes for p in ax.patches if isinstance(p, Rectangle) and p.get_width() > 0]
    colors = {tuple(np.round(p.get_facecolor()[:3], 3)) for p in widths}
    for patch, label in zip(fig.legends[0].get_patches(), legend, strict=False):
        assert tuple(np.round(patch.get_facecolor()[:3], 3)) in colors, label  # a category listed is drawn
    assert "phase" in fig.get_suptitle()

    assert len({r["predicted_hardware"] for r in recs}) == 1  # one device: one capacity line a panel
    renderer = fig._get_renderer()  # matplotlib has no public one outside pyplot
    notes = 0
    for ax in [a for a in fig.axes if a.get_visible()]:
        (line,) = [ln for ln in ax.lines if ln.get_linestyle() == "--"]
        cap_x = ax.transData.transform((line.get_xdata()[0], 0))[0]
        seq = int(ax.get_title().removeprefix("seq ").removesuffix("K")) * 1024
        layouts = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            assert not box.x0 < cap_x < box.x1, text.get_text()  # never across the capacity line
            assert box.x1 <= ax.bbox.x1 + 1, text.get_text()  # nor past the panel's edge
            layout = layouts[round(text.get_position()[1])]
            phase = phase_of(recs, layout, seq)
            assert text.get_text().split("\n")[1].split(",")[0] == phase, (layout, seq, phase)
            notes += 1
    assert notes >= 20


def phase_of(recs: list[dict], layout: str, seq: int) -> str:
    """The coarse phase (forward, backward, ...) of the recompute-none peak of ``layout`` at ``seq``."""
    for r in recs:
        axes = {"tp_sp": f"tp{r['tp']} x sp{r['sp']}", "fsdp_sp": f"sp{r['sp']}"}.get(r["strategy"])
        name = f"{r['strategy']} {axes}" if axes else f"{r['strategy']}{r[r['strategy']]}"
        if name == layout and r["seq_len"] == seq and r["recompute"] == "none":
            return next(w for w in ("backward", "forward", "optimizer") if w in r["peak_memory_phase"])
    raise AssertionError(f"no record of {layout} at {seq}")


@pytest.mark.parametrize("experiment", ["cpu_reference", "paper_memory_fake"])
def test_gantt_legend_lists_only_kinds_that_show(experiment: str) -> None:
    fig = drawn(experiment, gantt, "timeline_gantt")
    legend = {t.get_text() for t in fig.legends[0].get_texts()}
    widest: dict[str, float] = {}
    for ax in fig.axes:
        for coll in ax.collections:
            if not coll.get_gid():
                continue
            kind = coll.get_gid().split("|")[1]
            for path in coll.get_paths():
                xs = ax.transData.transform(np.c_[path.vertices[:, 0], np.zeros(len(path.vertices))])[:, 0]
                widest[kind] = max(widest.get(kind, 0.0), float(xs.max() - xs.min()))
    shows = {kind for kind, px in widest.items() if px >= 1.0}
    assert {k for k in legend if not k.startswith("shorter")} == shows


def test_forward_only_scaling_says_why_it_is_flat_and_where_training_scales() -> None:
    assert {r["mode"] for r in records("paper_scaling")} == {"infer"}  # no gradients to all-reduce
    title = drawn("paper_scaling", figures, "scaling").get_suptitle()
    assert "flat" in title and "no data-parallel all-reduce" in title and "paper_scaling_train" in title
