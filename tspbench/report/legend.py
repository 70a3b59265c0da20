"""The one table of the built-in layouts: how a table or a docs sentence writes each, how a figure
draws it, where it sorts, and the axes whose degrees give its size in prose.

Every reader takes it from here (formats.LABEL for tables and the docs' numbers, style.py for a
figure's color and marker, frame.sort for the order), so a built-in strategy is one row, and a
reader cannot know a strategy another has never heard of. A strategy not in it (a third-party
plugin) sorts after these and draws in the next free color and marker (style.strategy_style).
This module imports nothing heavy: the docs' renderer reads labels without loading matplotlib.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Look:
    """How the report shows one layout."""

    label: str  # in tables and docs: "TP+SP"
    color: int  # index into seaborn's "colorblind" palette (style.py resolves it)
    marker: str  # matplotlib's marker code
    axes: tuple[str, ...]  # whose degrees name its size in prose: "TSP 8", "TP+SP 2x4"


# In the report's order (frame.sort): data parallel first, then the model-parallel layouts,
# the composite ones after their parts, and the paper's TSP last.
LAYOUTS: dict[str, Look] = {
    "dp": Look("DP", 7, "v", ("dp",)),
    "fsdp": Look("FSDP", 5, "h", ("fsdp",)),
    "tp": Look("TP", 0, "s", ("tp",)),
    "sp": Look("SP", 2, "^", ("sp",)),
    "tp_sp": Look("TP+SP", 4, "D", ("tp", "sp")),
    "fsdp_sp": Look("FSDP+SP", 9, "P", ("sp",)),
    "tsp": Look("TSP", 3, "o", ("tsp",)),
}
