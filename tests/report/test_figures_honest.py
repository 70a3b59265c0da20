"""Figures that cannot mislead (#36): the report's figures drawn from the stored results, checked
against values read here straight from the files (result.json, the hardware profile YAML, the
experiment YAML), never from the plotting code.

- memory over sequence length, projected or executed in a fake world: the device's usable
  memory drawn as a named dashed line in every panel, and every peak that does not fit (an
  OOM point's prediction, a fake-world peak over the usable memory) marked with an X, inside
  the axes;
- a measured CPU sweep whose predictions run far over the capacity: every OOM X inside the axes;
- throughput over sequence length: one y axis for all panels, the recomputation in the title,
  OOM marks inside the axes and apart, TP+SP layouts in colors told apart, a degenerate TP+SP
  layout named for what it runs;
- the layouts diagram: an FSDP+SP panel beside TSP's;
- decode TPOT over batch, projected for MI300X and H100 or measured on CPU: the source and the
  device in the title, every point that does not fit an X inside the axes at its batch in its
  layout's row and color, below every TPOT drawn, none hiding another, no such point on a line.
"""

from __future__ import annotations

import colorsys
import json
from functools import cache
from pathlib import Path

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pytest
import yaml
from matplotlib.collections import PathCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from tools import layouts_diagram
from tspbench.report import bars, decode, figures
from tspbench.report.build import best_against_best
from tspbench.report.frame import context, prepare
from tspbench.report.style import RC, save
from tspbench.sweep.store import load

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
RESULTS = ROOT / "results"
GiB, MiB = 2.0**30, 2.0**20


# ----------------------------------------------------------------------------- expected values


def profile(name: str) -> tuple[float, float]:
    """(usable, total) bytes of a shipped hardware profile, read from its YAML."""
    data = yaml.safe_load((ROOT / "tspbench" / "analytic" / "profiles" / f"{name}.yaml").read_text())
    return data["memory_bytes"] * data["usable_memory_fraction"], float(data["memory_bytes"])


@cache
def records(experiment: str) -> list[dict]:
    """Every stored point of an experiment: its result.json, with the status."""
    out = []
    for run in sorted((RESULTS / experiment).glob("*/result.json")):
        status = json.loads((run.parent / "status.json").read_text())["status"]
        out.append({**json.loads(run.read_text()), "status": status})
    return out


@cache
def drawn_frame(experiment: str) -> tuple:
    """The rows a report's figures draw and their context: where a speed study swept settings,
    each layout at its best (tspbench.report.build.best_against_best), else every record."""
    df = prepare(load(RESULTS / experiment))
    return best_against_best(df, context(df), Path(experiment))


def drawn(experiment: str, name: str) -> Figure:
    df, ctx = drawn_frame(experiment)
    module = decode if name.startswith("tpot") else figures
    with mpl.rc_context(RC):
        fig = getattr(module, name)(df, ctx)
    fig.draw_without_rendering()  # constrained layout places the axes: display positions hold
    return fig


# ----------------------------------------------------------------------------- reading a figure


def panels(fig: Figure) -> list:
    return [ax for ax in fig.axes if ax.get_visible() and ax.get_title() is not None and ax.lines]


def capacity_lines(ax, value: float) -> list[Line2D]:
    """Dashed horizontal lines across the axes at ``value`` (in the axis' unit)."""
    return [
        line
        for line in ax.lines
        if line.get_linestyle() == "--"
        and len(set(np.round(line.get_ydata(), 6))) == 1
        and line.get_ydata()[0] == pytest.approx(value, rel=1e-6)
    ]


def marks(ax) -> list[tuple[float, float, tuple]]:
    """(x, y, rgb) in display pixels of every scatter mark (the X's) of an axes."""
    out = []
    for coll in ax.collections:
        if not isinstance(coll, PathCollection):
            continue
        xy = coll.get_offset_transform().transform(coll.get_offsets())
        out += [(x, y, tuple(coll.get_facecolor()[0][:3])) for x, y in xy]
    return out


def data_marks(ax) -> set[tuple[int, float]]:
    """(x, y) in data units, y rounded to 0.1, of every scatter mark drawn in data coordinates."""
    return {
        (round(float(x)), round(float(y), 1))
        for coll in ax.collections
        if isinstance(coll, PathCollection) and coll.get_offset_transform() == ax.transData
        for x, y in coll.get_offsets()
    }


def inside(ax, points: list[tuple[float, float, tuple]]) -> bool:
    box = ax.bbox
    return all(box.x0 - 0.5 <= x <= box.x1 + 0.5 and box.y0 - 0.5 <= y <= box.y1 + 0.5 for x, y, _ in points)


def legend_texts(fig: Figure) -> list[str]:
    return [t.get_text() for legend in [*fig.legends, *(ax.get_legend() for ax in fig.axes)] if legend
            for t in legend.get_texts()]  # fmt: skip


def test_the_capacity_check_fails_on_a_figure_without_the_line() -> None:
    """The helpers above must be able to fail: a memory plot with no capacity line has none."""
    fig = Figure()
    ax = fig.subplots()
    ax.plot([1, 2], [100, 200], "-o")
    assert capacity_lines(ax, 182.4) == []
    ax.axhline(182.4, ls="--")
    assert len(capacity_lines(ax, 182.4)) == 1


# ----------------------------------------------------------------------------- memory


@pytest.mark.parametrize("experiment", ["paper_memory_fake", "paper_memory"])
def test_memory_figures_draw_the_devices_capacity_and_mark_what_does_not_fit(experiment: str) -> None:
    """Projected (analytic) and fake-world (executed) memory on MI300X: TP 8 at 214.6 GiB and SP 8
    at 261.6 GiB (128K, no recomputation) must not look as if they fit in 192 GiB."""
    recs = records(experiment)
    hardware = {r.get("hardware") or r.get("predicted_hardware") for r in recs}
    assert hardware == {"mi300x"}
    usable, total = profile("mi300x")
    fig = drawn(experiment, "memory_vs_seq")
    axes = panels(fig)
    modes = [m for m in ("none", "selective", "op", "full") if any(r["recompute"] == m for r in recs)]
    assert [ax.get_title() for ax in axes] == [f"recompute {m}" for m in modes]
    for ax in axes:
        line = capacity_lines(ax, usable / GiB)
        assert len(line) == 1, ax.get_title()
        assert "MI300X" in line[0].get_label()
        assert ax.get_ylim()[1] > usable / GiB  # the line shows
    assert f"MI300X usable memory ({usable / GiB:.0f} GiB of {total / GiB:.0f} GiB)" in legend_texts(fig)

    for ax in axes:
        setting = ax.get_title().removeprefix("recompute ")
        rows = lowest_per_layout([r for r in recs if r["recompute"] == setting])
        over = [r for r in rows if r["status"] == "completed" and r["peak_memory_bytes"] > usable]
        oom = [r for r in rows if r["status"] == "oom"]
        expected = {(r["seq_len"], round(r["peak_memory_bytes"] / GiB, 1)) for r in over}
        expected |= {(r["seq_len"], round(predicted_peak(r) / GiB, 1)) for r in oom}
        got = {(closest_seq(x, rows), y) for x, y in data_marks(ax)}
        assert got == expected, setting
        assert inside(ax, marks(ax)), setting
    none = [r for r in recs if r["recompute"] == "none" and r["seq_len"] == 131072 and at_defaults(r)]
    big = {r["strategy"]: r.get("peak_memory_bytes") or r["predicted_peak_memory_bytes"] for r in none}
    assert big["tp"] > usable and big["sp"] > usable  # the two points: both marked above


def lowest_per_layout(rows: list[dict]) -> list[dict]:
    """Per layout and length, the record a memory figure draws where a study swept settings: the
    lowest completed peak, or where none completed, the layout's default point (out of memory)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((series_of(r), r["seq_len"]), []).append(r)
    out = []
    for group in groups.values():
        done = [r for r in group if r["status"] == "completed"]
        out.append(min(done, key=lambda r: r["peak_memory_bytes"]) if done else
                   next(r for r in group if at_defaults(r)))  # fmt: skip
    return out


def at_defaults(record: dict) -> bool:
    """A layout's paper point: no switch set (records omit a switch left at its default)."""
    return (
        not record.get("megatron_sp")
        and record.get("overlap", True)
        and record.get("kv_exchange", "allgather") == "allgather"
        and record.get("mlp_exchange", "ring") == "ring"
    )


def predicted_peak(record: dict) -> float:
    """An OOM point's predicted peak: beside a measurement, or the analytic record's own peak."""
    return record.get("predicted_peak_memory_bytes") or record["peak_memory_bytes"]


def closest_seq(x: float, rows: list[dict]) -> int:
    """The swept length an X belongs to (marks at one length sit side by side: x times 2^±0.3)."""
    seqs = sorted({r["seq_len"] for r in rows})
    return min(seqs, key=lambda s: abs(np.log2(x / s)))


def test_cpu_oom_predictions_far_over_capacity_stay_inside_the_axes() -> None:
    """cpu_reference: dp4 completes at 1K and runs out at 2K, 4K and 8K, predicted at up to four
    times the capacity; all three X's inside the axes, at their values."""
    recs = records("cpu_reference")
    capacity = {r["capacity_bytes"] for r in recs}
    assert len(capacity) == 1
    fig = drawn("cpu_reference", "memory_vs_seq")
    (ax,) = panels(fig)
    assert len(capacity_lines(ax, capacity.pop() / MiB)) == 1
    dp = [r for r in recs if r["strategy"] == "dp" and r["status"] == "oom"]
    assert sorted(r["seq_len"] for r in dp) == [2048, 4096, 8192]
    expected = {(r["seq_len"], round(predicted_peak(r) / MiB, 1)) for r in dp}
    got = {(closest_seq(x, recs), y) for x, y in data_marks(ax)}
    assert expected <= got
    assert inside(ax, marks(ax))
    low, high = ax.get_ylim()
    assert low < min(y for _, y in got) and max(y for _, y in got) < high


# ----------------------------------------------------------------------------- throughput


def test_throughput_figure_shares_its_axis_names_the_recomputation_and_keeps_marks_apart() -> None:
    recs = drawn_frame("paper_throughput")[0].to_dict("records")  # each layout at its best setting
    fig = drawn("paper_throughput", "throughput_vs_seq")
    assert "each layout at its best setting" in fig.get_suptitle()  # its recomputation varies by layout
    axes = panels(fig)
    assert [ax.get_title() for ax in axes] == ["2 GPUs", "4 GPUs", "8 GPUs"]
    for ax in axes[1:]:
        assert axes[0].get_shared_y_axes().joined(axes[0], ax)
        assert ax.get_ylim() == axes[0].get_ylim()

    pixels = fig.dpi / 72
    for ax, world in zip(axes, (2, 4, 8), strict=True):
        oom = [r for r in recs if r["world_size"] == world and r["status"] == "oom"]
        xs = marks(ax)
        assert len(xs) == len(oom) and inside(ax, xs), world
        for i, a in enumerate(xs):  # no X hides another
            for b in xs[i + 1 :]:
                assert np.hypot(a[0] - b[0], a[1] - b[1]) > 5 * pixels, (world, a, b)

    labels = legend_texts(fig)
    assert "tp_sp tp8 x sp1 (= tp8)" in labels and "tp_sp tp1 x sp8 (= sp8)" in labels
    eight = axes[2].get_legend()
    colors = {
        t.get_text(): h.get_color() for t, h in zip(eight.get_texts(), eight.legend_handles, strict=True)
    }
    tp_sp = [to_rgb(c) for label, c in colors.items() if label.startswith("tp_sp")]
    assert len(tp_sp) == 4
    light = sorted(colorsys.rgb_to_hls(*c)[1] for c in tp_sp)
    assert min(np.diff(light)) >= 0.12  # four steps of lightness apart, not near-identical shades


# ----------------------------------------------------------------------------- the layouts diagram


def test_layouts_diagram_has_fsdp_sp_beside_tsp() -> None:
    fig = layouts_diagram.figure()
    kinds = [ax.get_title().split("\n")[0] for ax in fig.axes]
    assert kinds == ["TP", "SP", "TP+SP", "FSDP+SP", "TSP"]
    cells = [(w, t) for w in range(4) for t in range(4)]
    assert all(layouts_diagram.owners("FSDP+SP", *c) == layouts_diagram.owners("TSP", *c) for c in cells)
    fsdp = sum(bool(layouts_diagram.fetched("FSDP+SP", *c)) for c in cells)
    tsp = sum(bool(layouts_diagram.fetched("TSP", *c)) for c in cells)
    assert (fsdp, tsp) == (12, 4)  # the whole layer gathered vs one ring shard per rank
    plt.close(fig)


# ----------------------------------------------------------------------------- decode

DECODE_SOURCES = {  # what each study's records are, read from the experiment's name and records
    "paper_decode": "projected for MI300X",
    "paper_decode_h100": "projected for H100",
    "cpu_decode": "measured on CPU",
}


def oom_marks(ax) -> list[tuple[float, float, float, tuple]]:
    """(batch, x px, y px, rgb) of every X drawn in an axes: data x, display position."""
    out = []
    for coll in ax.collections:
        if isinstance(coll, PathCollection):
            xy = coll.get_offset_transform().transform(coll.get_offsets())
            color = tuple(np.round(coll.get_facecolor()[0][:3], 4))
            out += [(float(b), x, y, color) for b, (x, y) in zip(coll.get_offsets()[:, 0], xy, strict=True)]
    return out


@pytest.mark.parametrize("name", ["tpot_vs_batch", "tpot_tails"])
@pytest.mark.parametrize("experiment", list(DECODE_SOURCES))
def test_decode_figures_mark_every_point_that_does_not_fit(experiment: str, name: str) -> None:
    recs = [r for r in records(experiment) if r["mode"] == "decode"]
    hardware = {r.get("hardware") or r.get("predicted_hardware") or r.get("device") for r in recs}
    source = {r["source"] for r in recs}
    expected_where = DECODE_SOURCES[experiment]
    assert source == ({"predicted"} if expected_where.startswith("projected") else {"measured"})
    assert expected_where.split()[-1].lower() in {str(h).lower() for h in hardware}
    fig = drawn(experiment, name)
    assert expected_where in fig.get_suptitle()

    (ax,) = [a for a in fig.axes if a.get_visible() and a.lines]
    oom = nowhere_fits(recs)
    xs = oom_marks(ax)
    assert sorted(b for b, *_ in xs) == sorted(float(r["batch"]) for r in oom)  # each one, once
    assert inside(ax, [(x, y, c) for _, x, y, c in xs])
    lines = {line.get_label(): line for line in ax.lines if not line.get_label().startswith("_")}
    colors = {label: tuple(np.round(to_rgb(line.get_color()), 4)) for label, line in lines.items()}
    rows: dict[tuple, float] = {}
    for r in oom:  # the X at the point's batch in its layout's color, one row per layout
        label = series_of(r)
        hits = [(x, y) for b, x, y, c in xs if b == r["batch"] and c == colors[label]]
        assert len(hits) == 1, (label, r["batch"])
        assert rows.setdefault(colors[label], hits[0][1]) == pytest.approx(hits[0][1]), label
        line = lines[label]
        assert r["batch"] not in set(line.get_xdata()), (label, r["batch"])  # no TPOT drawn for it

    values = [ax.transData.transform((x, y))[1] for line in ax.lines for x, y in line.get_xydata()]
    if xs:
        assert max(y for *_, y, _ in xs) < min(values) - 5  # below every TPOT: not read as a value
        assert any("does not fit" in t for t in legend_texts(fig))
    pixels = fig.dpi / 72
    for i, a in enumerate(xs):  # no X hides another
        for b in xs[i + 1 :]:
            assert np.hypot(a[1] - b[1], a[2] - b[2]) > 5 * pixels, (a, b)


def nowhere_fits(recs: list[dict]) -> list[dict]:
    """One record per (layout, batch) whose every setting ran out of memory: a study that sweeps
    settings draws each layout at its best, so a point is out of memory only where none fits."""
    groups: dict[tuple, list[dict]] = {}
    for r in recs:
        groups.setdefault((series_of(r), r["batch"]), []).append(r)
    return [rows[0] for rows in groups.values() if all(r["status"] == "oom" for r in rows)]


def series_of(record: dict) -> str:
    """The legend label of a record's layout, spelled from its degrees: 'tp8', 'tp_sp tp4 x sp2'."""
    axes = {"tp_sp": ("tp", "sp"), "fsdp_sp": ("sp",)}.get(record["strategy"])
    if axes is None:
        name = record["strategy"]
        return f"{name}{record[name] if name in record else record['world_size']}"
    return f"{record['strategy']} " + " x ".join(f"{a}{record[a]}" for a in axes)


def test_decode_oom_check_sees_a_mark_piled_on_the_axis() -> None:
    """The checks above can fail: an X clipped outside the axes (the old floor, clip_on=False)."""
    fig = Figure(dpi=150)
    ax = fig.subplots()
    ax.plot([1, 2], [10, 20])
    ax.set_ylim(5, 25)
    ax.scatter([2], [1], clip_on=False)
    fig.draw_without_rendering()
    assert not inside(ax, [(x, y, c) for _, x, y, c in oom_marks(ax)])


# ----------------------------------------------------------------------------- memory bars


def test_memory_bars_are_as_long_as_the_peak_or_run_off_the_edge_with_it_written() -> None:
    """paper_decode breaks its projected peaks down into parameters and KV cache only: each bar
    must still end at the peak in result.json (the rest drawn as 'not broken down'), and a peak
    far over the rest (dp8's 5 TiB) runs off the axis' right edge with its value written inside."""
    df = prepare(load(RESULTS / "paper_decode"))
    with mpl.rc_context(RC):
        fig = bars.memory_breakdown(df, context(df))
    fig.draw_without_rendering()
    recs = records("paper_decode")
    assert any(r["peak_memory_bytes"] > 1.01 * category_sum(r) for r in recs)  # the case at hand
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
    labels = [t.get_text() for t in axes[0].get_yticklabels()]
    assert "not broken down\n(peak minus the categories)" in legend_texts(fig)
    for ax in axes:
        batch = int(ax.get_title().removeprefix("micro-batch "))
        right = ax.get_xlim()[1]
        for r in (r for r in recs if r["batch"] == batch):
            y = labels.index(series_of(r))
            peak = r["peak_memory_bytes"] / GiB
            ends = [
                p.get_x() + p.get_width()
                for p in ax.patches
                if abs(p.get_y() + p.get_height() / 2 - y) < 0.01
            ]
            texts = [t.get_text() for t in ax.texts if abs(t.get_position()[1] - y) < 0.01]
            assert any(f"{peak:,.1f}" in t for t in texts), (batch, series_of(r), texts)
            if peak < right:
                assert max(ends) == pytest.approx(peak, rel=1e-6), (batch, series_of(r))
            else:  # off the edge: the written value stays inside the axes
                (t,) = [t for t in ax.texts if abs(t.get_position()[1] - y) < 0.01]
                assert t.get_position()[0] <= right and "->" in t.get_text()
    plt.close(fig)


def category_sum(record: dict) -> float:
    """What a record breaks its peak down into, summed (absent categories count 0)."""
    cats = ("parameters", "gradients", "optimizer", "activations", "other", "kv_cache")
    return sum(record.get(f"peak_memory_{c}_bytes") or 0 for c in cats)


# ----------------------------------------------------------------------------- nothing cut off


@pytest.mark.parametrize(
    ("experiment", "module", "name"),
    [
        ("paper_scaling_fake", bars, "memory_parity"),  # 28 layouts: dp1 to dp128 of four
        ("paper_scaling_fake", bars, "comm_by_op"),  # one narrow panel, a long source line
        ("paper_decode", decode, "tpot_vs_batch"),
    ],
)
def test_title_and_legends_lie_inside_the_saved_figure(
    experiment: str, module, name: str, tmp_path: Path
) -> None:
    """The source line of the title and every legend entry must be on the page, not cut off."""
    df = prepare(load(RESULTS / experiment))
    with mpl.rc_context(RC):
        fig = getattr(module, name)(df, context(df))
        save(fig, tmp_path / name)
    renderer = fig._get_renderer()
    page = fig.bbox
    title = fig._suptitle
    box = title.get_window_extent(renderer)
    assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1 and box.y1 <= page.y1 + 1, title.get_text()
    source = context(df).where
    assert " ".join(source.split()) in " ".join(title.get_text().split())  # wrapped, not cut
    for legend in fig.legends:
        box = legend.get_window_extent(renderer)
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1, name
        assert page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1, name
    plt.close(fig)


def test_a_length_between_powers_of_two_reads_in_k_like_its_neighbours() -> None:
    """cpu_out_of_sample runs 1536 and 3072 tokens: the axis reads 1.5K and 3K, not 1536 and 3K."""
    assert {r["seq_len"] for r in records("cpu_out_of_sample")} == {1536, 3072}
    fig = drawn("cpu_out_of_sample", "memory_vs_seq")
    (ax,) = panels(fig)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1.5K", "3K"]
