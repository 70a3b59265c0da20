"""The tornado figure: one bar per figure in the order given (first on top), drawn from the
profile's own time to each end, and a file that is byte-identical when drawn twice."""

from __future__ import annotations

from pathlib import Path

from tspbench.report.style import save
from tspbench.report.tornado import Bar, tornado

BARS = [Bar("ring shift 24-96 GB/s (assumed)", 1.9, 0.8), Bar("GEMM 325-1,300 TFLOP/s (assumed)", 1.2, 1.1)]


def test_bars_start_at_the_profiles_time_and_reach_each_end() -> None:
    fig = tornado(BARS, 1.16, "Step time of TSP 8", "projected on the mi300x profile")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[-1] == BARS[0].label  # widest first: on top
    ends = sorted(round(p.get_x() + p.get_width(), 6) for p in ax.patches)
    assert ends == sorted([0.8, 1.1, 1.2, 1.9])
    assert "projected on the mi300x profile" in fig._suptitle.get_text()


def test_the_same_bars_give_the_same_bytes(tmp_path: Path) -> None:
    a = save(tornado(BARS, 1.16, "t", "s"), tmp_path / "a")
    b = save(tornado(BARS, 1.16, "t", "s"), tmp_path / "b")
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
