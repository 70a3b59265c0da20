"""The stored results as the docs quote them: records read once per experiment, each point's
layout named as the docs name it.

The functions of tools.docs_numbers (studies, time_checks, paper_checks) take the results folder
and return a group of named values (``Values``, tspbench.report.formats), each a formatted string,
a markdown table, a ``Part`` (a fragment of docs/templates/parts/ filled with its own values: the
docs' wording where a sentence depends on the data) or None (a conditional sentence that does not
apply). tools/gen_docs.py fills the templates' ``{{group.name}}`` placeholders from them. Numbers
are formatted as the report formats them (tspbench.report.formats), so a table and a sentence agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from tspbench.report.best import SWITCH_DEFAULTS, is_default, with_settings
from tspbench.report.legend import LAYOUTS
from tspbench.sweep.store import load


@dataclass
class Part:
    """docs/templates/parts/<name>.md, its ``{{key}}`` placeholders filled from ``values``."""

    name: str
    values: dict[str, Any] = field(default_factory=dict)


@cache
def records(results: Path, experiment: str) -> pd.DataFrame:
    """Every stored record of one experiment (read once per run of the renderer)."""
    return load(results / experiment)


@cache
def stored_json(results: Path, relative: str) -> Any:
    """A check's stored JSON under ``results`` (read once per run of the renderer)."""
    return json.loads((results / relative).read_text())


def layout_name(row: pd.Series) -> str:
    """'TSP 8', 'TP+SP 2x4': the strategy's label and its degrees on the axes it shards (legend.py)."""
    look = LAYOUTS[row["strategy"]]
    return f"{look.label} {'x'.join(str(int(row[axis])) for axis in look.axes)}"


def named(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with a ``layout`` column."""
    return df.assign(layout=df.apply(layout_name, axis=1))


def completed(results: Path, experiment: str, **where: object) -> pd.DataFrame:
    """The completed points of an experiment whose columns equal ``where``."""
    df = records(results, experiment)
    df = df[df["status"] == "completed"]
    for key, value in where.items():
        df = df[df[key] == value]
    return df


def at_defaults(results: Path, experiment: str, **where: object) -> pd.DataFrame:
    """``completed``'s points whose settings are at the paper's defaults (tspbench.report.best:
    recompute selective in training, every switch at its default): what a sentence means by
    "the layout" in a study that also sweeps settings (paper_throughput)."""
    df = with_settings(completed(results, experiment, **where))
    return df[is_default(df)] if len(df) else df


def at_default_switches(results: Path, experiment: str, **where: object) -> pd.DataFrame:
    """``completed``'s points whose layout switches are at their defaults, whatever their
    recomputation (paper_microbatch recomputes fully throughout, as the paper's)."""
    df = with_settings(completed(results, experiment, **where))
    keep = pd.Series(True, index=df.index)
    for name, default in SWITCH_DEFAULTS.items():
        keep &= df[name] == default
    return df[keep]


def span(values: list[float], spec: str) -> str:
    """'lo-hi' of ``values`` formatted by ``spec``, one value where they print alike."""
    lo, hi = format(min(values), spec), format(max(values), spec)
    return lo if lo == hi else f"{lo}-{hi}"
