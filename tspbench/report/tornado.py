"""The tornado figure of a sensitivity study (tspbench.analytic.sensitivity): one bar per profile
figure, from the step time with that figure at the low end of its range to the time at the high
end, the rest held, widest on top; a line at the profile's own time.

It shows at a glance which of a projection's figures its number rests on: a long bar is a figure
that must be measured before the number can be trusted; a bar of no width is one that does not
matter at this point. The bars come in as plain rows, so drawing needs no model (and no torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib as mpl
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from tspbench.report.style import RC, new_figure

LOW_COLOR, HIGH_COLOR, BASE_COLOR = "#4c72b0", "#dd8452", "#3a3a3a"


@dataclass(frozen=True)
class Bar:
    """One figure's row: its name with its range, and the step time at each end of it."""

    label: str  # 'ring shift bandwidth 24-96 GB/s (assumed)'
    low_s: float  # the step time with the figure at the low end of its range
    high_s: float  # at the high end


def tornado(bars: Sequence[Bar], base_s: float, title: str, source: str) -> Figure:
    """Horizontal bars of ``bars`` (drawn in the order given, first on top) around ``base_s``;
    ``source`` is the figure's last title line (what the numbers are: projected, on which
    profile)."""
    with mpl.rc_context(RC):
        fig = new_figure(7.5, 1.2 + 0.32 * max(len(bars), 1))
        ax = fig.add_subplot()
        for i, bar in enumerate(reversed(bars)):
            for end, color in ((bar.low_s, LOW_COLOR), (bar.high_s, HIGH_COLOR)):
                ax.barh(i, end - base_s, left=base_s, color=color, height=0.6)
        ax.axvline(base_s, color=BASE_COLOR, linewidth=1)
        ax.set_yticks(range(len(bars)), [b.label for b in reversed(bars)])
        ax.set_xlabel("step time (s)")
        ax.legend(
            handles=[Patch(color=LOW_COLOR, label="figure at the low end"),
                     Patch(color=HIGH_COLOR, label="figure at the high end")],
            loc="lower right",
        )  # fmt: skip
        fig.suptitle(f"{title}\n{source}")
    return fig
