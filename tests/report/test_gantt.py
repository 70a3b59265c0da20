"""The report's Gantt figure (tspbench.report.gantt): one layer's forward per traced strategy.

A temp experiment holds copies of a few measured CPU points of results/cpu_reference with their
trace.npz: TP, SP and TSP at 1K on 4 ranks, TP also at 2K and TSP also on 2 ranks (neither the
common shape). The drawn bars are checked against a replay of the stored trace done here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from tspbench.analytic.hardware import load_hardware
from tspbench.analytic.profile_choice import profile_name
from tspbench.analytic.timeline import Timeline, op_times, timeline
from tspbench.core.trace import COMPUTE, VIEW, load_traces
from tspbench.report import gantt
from tspbench.report.build import report, with_run_dirs
from tspbench.report.frame import context, prepare
from tspbench.report.style import RC, save
from tspbench.sweep.store import load

SOURCE = Path(__file__).resolve().parents[2] / "results" / "cpu_reference"
RUNS = {
    "45c997f1eb": ("tp", 1024, 4),
    "67bfd1ef12": ("sp", 1024, 4),
    "7a61eb7225": ("tsp", 1024, 4),
    "8199dd3ba9": ("tp", 2048, 4),  # traced, but SP and TSP have no 2K point here
    "66fc22c6d5": ("tsp", 1024, 2),  # the less common world size
}
CHOSEN = {"tp4": "45c997f1eb", "sp4": "67bfd1ef12", "tsp4": "7a61eb7225"}
FILES = ("point.json", "status.json", "result.json", "env.json")


def copy_experiment(root: Path, traces: bool, runs: tuple[str, ...] = tuple(RUNS)) -> Path:
    exp = root / "cpu_reference"
    for run in runs:
        (exp / run).mkdir(parents=True)
        for name in (*FILES, "trace.npz") if traces else FILES:
            shutil.copy(SOURCE / run / name, exp / run / name)
    return exp


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_experiment(tmp_path_factory.mktemp("results"), traces=True)


@pytest.fixture(scope="module")
def frame(experiment: Path) -> pd.DataFrame:
    return prepare(with_run_dirs(load(experiment), experiment))


@pytest.fixture(scope="module")
def figure(frame: pd.DataFrame) -> Figure:
    with mpl.rc_context(RC):
        fig = gantt.timeline_gantt(frame, context(frame))
    assert fig is not None
    return fig


def panels(fig: Figure) -> dict[str, object]:
    """Panel axes by series label (the title's head: 'tsp4: layer 1 forward on rank 0, ...')."""
    return {ax.get_title(loc="left").split(":")[0]: ax for ax in fig.axes if ax.get_title(loc="left")}


def drawn(ax: object, lane: str) -> list[tuple[float, float, str]]:
    """(start ms, width ms, kind) of every bar drawn in ``lane``, by start."""
    out = []
    for coll in ax.collections:
        if isinstance(coll, PolyCollection) and (coll.get_gid() or "").startswith(f"{lane}|"):
            kind = coll.get_gid().split("|")[1]
            for path in coll.get_paths():
                x = path.vertices[:, 0]
                out.append((float(x.min()), float(x.max() - x.min()), kind))
    return sorted(out)


def replayed(run: str) -> Timeline:
    traces, meta = load_traces(SOURCE / run / "trace.npz")
    return timeline(traces, load_hardware("cpu"), meta["world_size"])


def second_layer(tl: Timeline) -> tuple[float, float]:
    """Begin and end of 'layer 1''s forward on rank 0, from the replay's marks."""
    marks = [(end, t) for label, end, t in tl.replay.states[0].marks if label == "layer 1"]
    assert [end for end, _ in marks] == [0, 1]
    return marks[0][1], marks[1][1]


def test_pick_takes_one_point_per_strategy_at_the_common_shape(frame: pd.DataFrame) -> None:
    picked = gantt.pick(frame)
    assert list(picked["series"]) == list(CHOSEN)  # one per strategy, in the report's order
    assert list(picked["run_id"]) == list(CHOSEN.values())
    assert set(picked["seq_len"]) == {1024} and set(picked["world_size"]) == {4}
    assert profile_name(picked.iloc[0]) == "cpu"


def test_report_draws_the_figure_lists_it_and_is_byte_stable(
    experiment: Path, figure: Figure, tmp_path: Path
) -> None:
    """report() writes the figure and links it; the same records drawn again give the same bytes."""
    out = report(experiment, tmp_path / "report")
    png, svg = out.figures["timeline_gantt"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "timeline_gantt" not in out.skipped
    assert "(timeline_gantt.png)" in (out.out_dir / "report.md").read_text()
    with mpl.rc_context(RC):
        again = save(figure, tmp_path / "timeline_gantt")
    assert [p.read_bytes() for p in again] == [png.read_bytes(), svg.read_bytes()]


def test_one_panel_per_traced_strategy_with_title(figure: Figure) -> None:
    assert list(panels(figure)) == list(CHOSEN)
    title = figure.get_suptitle()
    assert "cpu_reference" in title and "seq 1K" in title and "4 ranks" in title
    assert "cpu profile" in title and "measured-run trace" in title and "replay of the executed step" in title
    lanes = [t.get_text() for t in panels(figure)["tsp4"].get_yticklabels()]
    assert lanes == ["compute: default", "link: node"]


def test_collective_bars_are_the_replayed_collectives_of_the_layer(figure: Figure) -> None:
    for label, run in CHOSEN.items():
        tl = replayed(run)
        t0, t1 = second_layer(tl)
        colls = {id(c): c for c in tl.replay.states[0].coll_of.values()}.values()
        inside = [c for c in colls if c.start < t1 and c.end > t0]
        expected = sorted(((c.start - t0) * 1e3, (c.end - c.start) * 1e3, c.op) for c in inside)
        bars = drawn(panels(figure)[label], "link: node")
        assert len(bars) == len(expected), label
        least = gantt.MIN_WIDTH * panels(figure)[label].get_xlim()[1]  # a shorter one is drawn this wide
        for got, want in zip(bars, expected, strict=True):
            assert got[0] == pytest.approx(want[0], abs=1e-9) and got[2] == want[2], label
            widened = want[1] < least and got[1] == pytest.approx(least, abs=1e-9)
            assert got[1] == pytest.approx(want[1], abs=1e-9) or widened, label
    assert len(drawn(panels(figure)["tsp4"], "link: node")) > 0  # TSP communicates in the forward


def test_compute_bars_are_the_replayed_ops_of_the_layer(figure: Figure) -> None:
    """Every kernel op overlapping the layer is drawn whole (host time, then kernel): the lane's
    bars start where the first op starts and add up to the ops' replayed seconds."""
    tl = replayed(CHOSEN["tsp4"])
    t0, t1 = second_layer(tl)
    ev = tl.replay.states[0].trace.events
    start, seconds = op_times(tl.replay, 0)
    ops = (ev["kind"] == COMPUTE) & (ev["cls"] != VIEW) & (start < t1) & (start + seconds > t0)
    bars = drawn(panels(figure)["tsp4"], "compute: default")
    assert bars[0][0] == pytest.approx((start[ops].min() - t0) * 1e3, abs=1e-9)
    assert sum(w for _, w, _ in bars) == pytest.approx(seconds[ops].sum() * 1e3, rel=1e-9)
    kinds = {k for _, _, k in bars}
    assert {"GEMM", "attention", "element-wise", "host"} <= kinds  # the CPU profile has host time
    host = np.array([w for _, w, k in bars if k == "host"])
    assert len(host) == ops.sum()  # one host slice per op


def test_experiment_without_traces_skips_the_figure(tmp_path: Path) -> None:
    exp = copy_experiment(tmp_path / "results", traces=False, runs=tuple(CHOSEN.values()))
    out = report(exp, tmp_path / "report")
    assert "timeline_gantt" not in out.figures
    assert "trace" in out.skipped["timeline_gantt"]
    assert not (out.out_dir / "timeline_gantt.png").exists()
    assert "- timeline_gantt: " in (out.out_dir / "report.md").read_text()


# ----------------------------------------------------------------------------- the paper's figure

PAPER = SOURCE.parent / "paper_throughput_fake"
MIN_PX = 3.0  # a bar narrower than this on a 150-dpi PNG cannot be told from a grid line


@pytest.fixture(scope="module")
def paper() -> Figure:
    """The figure docs/time-model.md shows: paper_throughput_fake at 128K on 8 GPUs."""
    df = prepare(with_run_dirs(load(PAPER), PAPER))
    with mpl.rc_context(RC):
        fig = gantt.timeline_gantt(df, context(df))
    assert fig is not None
    fig.set_dpi(150)  # the saved PNG's pixels
    fig.draw_without_rendering()
    return fig


def layout(run: str) -> dict:
    """A stored point's layout (strategy and degrees), read from its point.json."""
    return json.loads((PAPER / run / "point.json").read_text())["config"]["layout"]


def px(ax: object, start: float, width: float) -> float:
    """Width in display pixels of a bar [start, start + width] ms drawn in ``ax``."""
    (x0, _), (x1, _) = ax.transData.transform([(start, 0), (start + width, 0)])
    return x1 - x0


def test_the_tp_sp_panel_is_a_real_tp_sp_layout(paper: Figure) -> None:
    """The doc calls the panel TP+SP: tensor and sequence parallel both above 1, not tp8 x sp1."""
    heads = {ax.get_title(loc="left").split(":")[0]: ax for ax in paper.axes}
    (label,) = [h for h in heads if h.startswith("tp_sp")]
    run = heads[label].get_title(loc="left").split("(run ")[1].rstrip(")")
    found = layout(run)
    assert found["strategy"] == "tp_sp" and found["tp"] > 1 and found["sp"] > 1, found
    assert "(=" not in label  # not a degenerate layout named for what it runs


def test_every_broadcast_shows_wide_enough_or_at_its_true_length_in_the_zoom(paper: Figure) -> None:
    """TSP's weight broadcasts last ~1 px on the layer's scale: each overview bar is at least
    MIN_PX wide (outlined when widened, its true length shorter), and the zoomed row draws the
    first two at their true replayed lengths, each at least MIN_PX wide."""
    axes = [ax for ax in paper.axes if ax.get_title(loc="left")]
    zooms = [ax for ax in axes if "zoomed" in ax.get_title(loc="left")]
    over = {ax.get_title(loc="left").split(":")[0]: ax for ax in axes if ax not in zooms}
    assert list(over) == ["tp_sp tp4 x sp2", "fsdp_sp sp8", "tsp8"]
    assert len(zooms) == 1 and zooms[0].get_title(loc="left").startswith("tsp8, zoomed")

    run = over["tsp8"].get_title(loc="left").split("(run ")[1].rstrip(")")
    assert layout(run)["strategy"] == "tsp"
    traces, meta = load_traces(PAPER / run / "trace.npz")
    tl = timeline(traces, load_hardware("mi300x"), meta["world_size"])  # the profile the title names
    assert "mi300x profile" in paper.get_suptitle()
    _, t0, t1 = gantt.layer_window(tl, 0)
    colls = {id(c): c for c in tl.replay.states[0].coll_of.values() if c.scheduled}.values()
    true = sorted(((c.start - t0) * 1e3, (c.end - c.start) * 1e3) for c in colls
                  if c.op == "broadcast" and c.start < t1 and c.end > t0)  # fmt: skip
    assert len(true) >= 2 and all(px(over["tsp8"], 0, w) < MIN_PX for _, w in true)  # too thin unaided

    bars = [b for b in drawn(over["tsp8"], "link: node") if b[2] == "broadcast"]
    assert [round(s, 9) for s, _, _ in bars] == [round(s, 9) for s, _ in true]
    assert all(px(over["tsp8"], s, w) >= MIN_PX for s, w, _ in bars)
    widened = [c for c in over["tsp8"].collections if (c.get_gid() or "").endswith("broadcast|widened")]
    assert widened and all(c.get_linewidth()[0] > 0 for c in widened)  # outlined: not its length
    assert any("drawn" in t and "ms" in t for t in legend_texts(paper))

    zoom = zooms[0]
    lo, hi = zoom.get_xlim()
    shown = [(s, w) for s, w in true if lo <= s and s + w <= hi]
    assert len(shown) >= 2
    got = [(s, w) for s, w, k in drawn(zoom, "link: node") if k == "broadcast" and lo <= s and s + w <= hi]
    assert np.allclose(got, shown, rtol=0, atol=1e-9)  # true lengths, not widened
    assert all(px(zoom, s, w) >= MIN_PX for s, w in got)


def legend_texts(fig: Figure) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]
