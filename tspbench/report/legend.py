"""The one table of the built-in layouts: how a table or a docs sentence writes each, how a figure
draws it, where it sorts, and the axes whose degrees give its size in prose.

Every reader takes it from here (formats.LABEL for tables and the docs' numbers, style.py for a
figure's color, marker and dash, frame.sort for the order), so a built-in strategy is one row, and a
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
    dash: tuple[float, ...] = ()  # its line's dash (on, off, ... in line widths); () is solid


# In the report's order (frame.sort): data parallel first, then the model-parallel layouts,
# the composite ones after their parts, and the paper's TSP last. Each has a color, a marker and
# a dash of its own, so that a figure printed in grey (or read by a colour-blind reader) still
# tells them apart by marker and line (#46); the paper's TSP is the one solid line.
LAYOUTS: dict[str, Look] = {
    "dp": Look("DP", 7, "v", ("dp",), (6, 1.5, 1.5, 1.5)),
    "fsdp": Look("FSDP", 5, "h", ("fsdp",), (3, 1, 1, 1)),
    "tp": Look("TP", 0, "s", ("tp",), (5, 2)),
    "sp": Look("SP", 2, "^", ("sp",), (1.5, 1.5)),
    "tp_sp": Look("TP+SP", 4, "D", ("tp", "sp"), (8, 2, 2, 2, 2, 2)),
    "fsdp_sp": Look("FSDP+SP", 9, "P", ("sp",), (3, 1)),
    "tsp": Look("TSP", 3, "o", ("tsp",), ()),
}


@dataclass(frozen=True)
class Exchange:
    """How the report tells the sequence axis's K/V exchanges apart (#48): SP 8 under ring
    attention holds a different peak than SP 8 under the all-gather, so a table or legend that
    wrote both "sp8" would show two points as one layout. The default writes nothing."""

    suffix: str  # after the layout's label: "sp8 (ring)"; "" for the default
    dash: tuple[float, ...]  # its line's dash in a figure that shows exchanges: () is solid


DEFAULT_EXCHANGE = "allgather"  # what a record without the field ran (stored before #48)
EXCHANGES: dict[str, Exchange] = {
    "allgather": Exchange("", ()),
    "ring": Exchange("ring", (5, 2)),
    "ulysses": Exchange("Ulysses", (1.5, 1.5)),
}


def exchange_of(value: object) -> str:
    """A record's ``kv_exchange``: the default where it is missing, empty or NaN (older records)."""
    return value if isinstance(value, str) and value else DEFAULT_EXCHANGE


def with_exchange(label: str, exchange: str) -> str:
    """'sp8 (ring)' for ring, 'sp8' for the all-gather; an exchange this table does not know is
    written as stored, so a new one still reads apart."""
    look = EXCHANGES.get(exchange)
    suffix = look.suffix if look else exchange
    return f"{label} ({suffix})" if suffix else label


def split_exchange(label: str) -> tuple[str, str]:
    """The inverse of ``with_exchange``: ('sp8', 'ring') for 'sp8 (ring)', (label, default) else."""
    for name, look in EXCHANGES.items():
        if look.suffix and label.endswith(f" ({look.suffix})"):
            return label.removesuffix(f" ({look.suffix})"), name
    return label, DEFAULT_EXCHANGE
