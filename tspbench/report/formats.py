"""How the report's tables and the docs' numbers write a layout, a kind of compute, a share, a
length and a size, so that a table of ``tspbench report`` and a sentence of docs/ print them
one way; and ``Values``, the named values one group of the docs' numbers is (tools/docs_numbers/
computes them and tools/gen_docs.py fills docs/templates/ with them; report.backtest gives one).
"""

from __future__ import annotations

from typing import Any

from tspbench.report.legend import LAYOUTS

GIB, MIB = 2**30, 2**20
LABEL = {name: look.label for name, look in LAYOUTS.items()}  # "TP+SP": the one table, legend.py
KINDS = ("gemm", "attention", "elementwise")

Values = dict[str, Any]  # a str, a tools/docs_numbers Part or None for each name a template quotes


def pct(x: float, signed: bool = True) -> str:
    """'+1.5%' (or '1.5%' unsigned): every share and error, one precision."""
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def tokens(n: int) -> str:
    """'4K' for 4096, '1.5K' for 1536, '512' for 512."""
    return f"{n / 1024:g}K" if n >= 1024 else str(n)
