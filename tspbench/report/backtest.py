"""The backtest's table (CSV and Markdown) and figure: predicted vs published tokens/s/GPU.

Takes the rows tspbench.checks.backtest makes (plain dicts, so the report needs no torch) and
the error summary as dicts (kind, sample, ids, errors). The figure says its source in its
title: predicted by the model vs published; a filled marker is the calibrated profile's
prediction, a hollow one the assumed profile's, and calibration entries are named as such.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from tspbench.core.files import write_atomic
from tspbench.report import style as st
from tspbench.report.bars import parity_axes

KINDS = {
    "assumed": "assumed profile (nothing fitted)",
    "calibrated": "calibrated profile",
    "timeline": "timeline, assumed profile",
}
COLORS = {"calibration": "#d55e00", "test": "#0072b2"}
FILLS = {"calibrated": "#555555", "assumed": "white"}
LABEL_OFFSET = {"calibration": (6, -7), "test": (6, 7)}  # points: the two kinds sit close together


def _pct(x: float | None) -> str:
    return "" if x is None or x != x else f"{x:+.1%}"


def _num(x: float | None, fmt: str = ",.0f") -> str:
    return "" if x is None or x != x else format(x, fmt)


def markdown(rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> str:
    """The backtest as Markdown: predicted entries, the errors by sample, the entries listed only."""
    lines = [
        "# Backtest: published GPU runs predicted by the model",
        "",
        "Predicted by the model (tspbench/analytic/predict.py) and by the timeline (the fake world's "
        "traced step replayed, tspbench/analytic/timeline.py) vs published; error = predicted / "
        "published - 1. Memory: the fake world's executed peak (allocated), and the reserved memory "
        "the profile assumes on top of it; torchtitan publishes reserved. A compiled run shares its eager "
        "run's record: the project executes no compiled program.",
        "",
        "| entry | role | published layout | as | tokens/s/GPU published | assumed | error | timeline "
        "(assumed) | error | calibrated | error | dominant terms (calibrated) | memory GiB published "
        "| fake allocated | predicted reserved | error |",
        "|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|--:|--:|",
    ]
    for r in (r for r in rows if r["predicted"]):
        mem = f"{_num(r['published_memory_gib'], '.1f')} {r['published_memory_kind'] or ''}".strip()
        lines.append(
            f"| {r['id']} | {r['role']} | {r['published_layout']}{' + compile' if r['compile'] else ''} "
            f"| {r['expressed_as']}, recompute {r['recompute']} "
            f"| {_num(r['published_tokens_per_s_per_gpu'])} "
            f"| {_num(r['assumed_tokens_per_s_per_gpu'])} | {_pct(r['assumed_error'])} "
            f"| {_num(r.get('assumed_timeline_tokens_per_s_per_gpu'))} "
            f"| {_pct(r.get('assumed_timeline_error'))} "
            f"| {_num(r['calibrated_tokens_per_s_per_gpu'])} | {_pct(r['calibrated_error'])} "
            f"| {r.get('calibrated_dominant') or ''} | {mem or 'not published'} "
            f"| {_num(r['fake_allocated_gib'], '.1f') or 'not executed'} "
            f"| {_num(r['predicted_reserved_gib'], '.1f')}{'' if r['fits'] else ' (over capacity)'} "
            f"| {_pct(r['memory_error'])} |"
        )
    lines += [
        "",
        "## Throughput error by sample",
        "",
        "| profile | sample | entries | median abs. error | worst |",
        "|---|---|---|--:|--:|",
    ]
    for s in summary:
        ids = ", ".join(s["ids"]) or "none"
        lines.append(
            f"| {KINDS[s['kind']]} | {s['sample']} | {ids} | {_num(s['median_abs'], '.1%')} "
            f"| {_pct(s['worst'])} |"
        )
    lines += [
        "",
        "## Listed, not predicted",
        "",
        "| entry | published layout | tokens/s/GPU | why not |",
        "|---|---|--:|---|",
    ]
    for r in (r for r in rows if not r["predicted"]):
        lines.append(
            f"| {r['id']} | {r['published_layout']} at {st.tokens_label(r['seq_len'])} "
            f"| {_num(r['published_tokens_per_s_per_gpu'])} | {r['not_predicted']} |"
        )
    lines += ["", "Sources:", ""]
    lines += [f"- {r['id']}: {r['source']}" for r in rows]
    return "\n".join(lines) + "\n"


def parity_figure(rows: list[dict[str, Any]]) -> Figure | None:
    """Predicted (x) vs published (y) tokens/s/GPU, one labelled point per entry and profile."""
    points = [
        (r, kind, r[f"{kind}_tokens_per_s_per_gpu"])
        for r in rows if r["predicted"] for kind in KINDS if r.get(f"{kind}_tokens_per_s_per_gpu")
    ]  # fmt: skip
    if not points:
        return None
    fig = st.new_figure(8.0, 5.6)
    ax = fig.subplots()
    values = [p for _, _, p in points] + [r["published_tokens_per_s_per_gpu"] for r, _, _ in points]
    keys = parity_axes(ax, values, band=0.25)
    for r, kind, predicted in points:
        color = COLORS[r["role"]]
        face = color if kind == "calibrated" else "white"
        ax.plot(predicted, r["published_tokens_per_s_per_gpu"], "o", color=color, mfc=face, ms=7.5, zorder=4)
        ax.annotate(r["id"], (predicted, r["published_tokens_per_s_per_gpu"]), fontsize=7, color=color,
                    xytext=LABEL_OFFSET[r["role"]], textcoords="offset points", va="center")  # fmt: skip
    fig.legend(handles=[*keys, *legend_markers()], loc="outside right center", frameon=False)
    ax.set_xlabel("predicted tokens/s per GPU (model)")
    ax.set_ylabel("published tokens/s per GPU")
    entries = len({r["id"] for r, _, _ in points})
    fig.suptitle(
        f"Predicted by the model vs published: tokens/s per GPU\n{entries} published runs, ±25% band"
    )
    return fig


def legend_markers() -> list[Line2D]:
    """Filled: the calibrated profile's prediction, hollow: the assumed one's; color: the role."""
    grey = "#555555"
    kinds = [Line2D([], [], ls="", marker="o", color=grey, mfc=f, label=KINDS[k]) for k, f in FILLS.items()]
    roles = [Line2D([], [], ls="", marker="o", color=c, label=f"{role} entry") for role, c in COLORS.items()]
    return kinds + roles


def write_backtest(rows: list[dict[str, Any]], summary: list[dict[str, Any]], out: Path) -> list[Path]:
    """backtest.csv, backtest.md and backtest.png/.svg in ``out``; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "backtest.csv", out / "backtest.md"]
    write_atomic(written[0], pd.DataFrame(rows).to_csv(index=False, float_format="%.6g"))
    write_atomic(written[1], markdown(rows, summary))
    fig = parity_figure(rows)
    if fig is not None:
        written += st.save(fig, out / "backtest")
    return written
