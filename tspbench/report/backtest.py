"""The backtest's tables (CSV and Markdown), figure and the docs' values: predicted vs published
tokens/s/GPU and memory, on three profiles side by side.

Takes the rows tspbench.checks.backtest makes (plain dicts, so the report needs no torch) and
the error summary as dicts (kind, sample, ids, errors); ``doc_values`` reads the same rows back
from the stored backtest.csv for docs/templates. The three profiles: ``shipped`` (the assumed
figures, nothing fitted), ``Hopper-measured`` (figures carried from the H200 measured here,
nothing fitted) and ``calibrated`` (the Hopper-measured one with the element-wise passes fitted
to the calibration entries). The figure says its source in its title: predicted by the model
vs published; a filled marker is the calibrated profile's prediction, a hollow circle the shipped
one's, a hollow square the Hopper-measured one's, and calibration entries are named as such.
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
from tspbench.report.formats import Values

KINDS = {
    "assumed": "shipped",
    "measured": "Hopper-measured",
    "calibrated": "calibrated",
}
SUMMARY_KINDS = {**{k: f"{v} profile" for k, v in KINDS.items()}, "timeline": "timeline, shipped profile"}
TERMS = {"GEMM": "GEMM", "attention": "attention", "element-wise": "elementwise", "launch": "launch",
         "exposed comm": "exposed_comm"}  # fmt: skip
COLORS = {"calibration": "#d55e00", "test": "#0072b2"}
MARKERS = {"assumed": ("o", False), "measured": ("s", False), "calibrated": ("o", True)}  # shape, filled
LABEL_OFFSET = {"calibration": (6, -7), "test": (6, 7)}  # points: the two roles sit close together
SAME_GIB = 0.05  # memory columns closer than this (the tables' precision) are one column


def _pct(x: float | None) -> str:
    return "" if x is None or x != x else f"{x:+.1%}"


def _num(x: float | None, fmt: str = ",.0f") -> str:
    return "" if x is None or x != x else format(x, fmt)


def _predicted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["predicted"]]


def _table(header: list[str], align: list[str], cells: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(align) + "|",
        *("| " + " | ".join(row) + " |" for row in cells),
    ]


def time_table(rows: list[dict[str, Any]]) -> list[str]:
    """Published tokens/s/GPU against each profile's prediction and error; '-' where the
    profile models no such run (torch.compile on the two uncalibrated ones)."""

    def cell(r: dict[str, Any], kind: str) -> str:
        tps = r.get(f"{kind}_tokens_per_s_per_gpu")
        return "-" if tps is None or tps != tps else f"{tps:,.0f} ({_pct(r[f'{kind}_error'])})"

    header = ["entry", "role", "published layout", "tokens/s/GPU published", *KINDS.values()]
    cells = [
        [
            r["id"],
            r["role"],
            f"{r['published_layout']}{' + compile' if r['compile'] else ''}",
            _num(r["published_tokens_per_s_per_gpu"]),
            *(cell(r, kind) for kind in KINDS),
        ]
        for r in _predicted(rows)
    ]
    return _table(header, ["---"] * 3 + ["--:"] * (1 + len(KINDS)), cells)


def memory_same(rows: list[dict[str, Any]]) -> bool:
    """Whether the three profiles give every entry the same memory (to the tables' precision)."""
    return all(
        max(values) - min(values) < SAME_GIB
        for r in _predicted(rows)
        for values in [[r[f"{kind}_predicted_memory_gib"] for kind in KINDS]]
    )


def memory_table(rows: list[dict[str, Any]]) -> list[str]:
    """Published memory against the model's on each profile (one column when they agree) and
    the fake world's executed peak."""
    kinds = ["measured"] if memory_same(rows) else list(KINDS)
    names = ["model, all three profiles"] if len(kinds) == 1 else [f"model, {KINDS[k]}" for k in kinds]

    def cell(r: dict[str, Any], kind: str) -> str:
        notes = [] if r[f"{kind}_memory_error"] is None else [_pct(r[f"{kind}_memory_error"])]
        notes += [] if r[f"{kind}_fits"] else ["over capacity"]
        return f"{r[f'{kind}_predicted_memory_gib']:.1f}" + (f" ({', '.join(notes)})" if notes else "")

    header = ["entry", "published GiB", *names, "fake world, allocated"]
    cells = []
    for r in _predicted(rows):
        published = _num(r["published_memory_gib"], ".1f")
        cells.append(
            [
                r["id"],
                f"{published} {r['published_memory_kind']}" if published else "not published",
                *(cell(r, k) for k in kinds),
                _num(r["fake_allocated_gib"], ".1f") or "not executed",
            ]
        )
    return _table(header, ["---"] + ["--:"] * (2 + len(kinds)), cells)


def terms_table(rows: list[dict[str, Any]]) -> list[str]:
    """Each profile's predicted step by term, seconds (they add up to the step)."""
    cells = [
        [
            r["id"],
            KINDS[kind],
            *(f"{r[f'{kind}_{s}_s']:.3f}" for s in TERMS.values()),
            f"{r[f'{kind}_step_s']:.3f}",
        ]
        for r in _predicted(rows)
        for kind in KINDS
        if r.get(f"{kind}_step_s") is not None and r[f"{kind}_step_s"] == r[f"{kind}_step_s"]
    ]
    return _table(["entry", "profile", *TERMS, "step"], ["---"] * 2 + ["--:"] * (len(TERMS) + 1), cells)


def differ_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per entry both the Hopper-measured and the calibrated profile predict: how far
    apart they are (flagged beyond 10%) and which terms of the calibrated step differ."""
    out = []
    for r in _predicted(rows):
        if r.get("terms_differ"):
            flag = ", more than 10% apart" if r["disagree"] else ""
            passes = (r["calibrated_train_passes"], r["measured_train_passes"])
            why = "" if passes[0] == passes[1] else f"; {passes[0]:g} element-wise passes, not {passes[1]:g}"
            out.append(
                f"- {r['id']}: calibrated {_num(r['calibrated_tokens_per_s_per_gpu'])} against "
                f"Hopper-measured {_num(r['measured_tokens_per_s_per_gpu'])} tokens/s/GPU "
                f"({_pct(r['calibrated_vs_measured'])}{flag}); the calibrated step differs in "
                f"{r['terms_differ']}{why}"
            )
    return out


def disagreeing(rows: list[dict[str, Any]]) -> list[str]:
    """The entries whose Hopper-measured and calibrated predictions are more than 10% apart."""
    return [r["id"] for r in _predicted(rows) if r.get("disagree")]


MEMORY_INTRO = (
    "The model's peak (allocated) plus what each profile assumes the caching allocator reserves on "
    "top, against the published figure (torchtitan publishes reserved); the fake world's executed "
    "peak beside it (a compiled run shares its eager run's record: the project executes no "
    "compiled program)."
)
SAME_MEMORY = (
    " The three profiles give the same memory: it depends on a profile only through its "
    "allocator overhead, 0 in all three."
)
TERMS_INTRO = (
    "Launch: every kernel's fixed cost and the host's time where it is behind; exposed comm: "
    "the collectives on the critical path and what the overlap leaves exposed."
)


def markdown(rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> str:
    """The backtest as Markdown: three profiles side by side for time and memory, each profile's
    terms, where two disagree, the errors by sample, the entries listed only."""
    lines = [
        *_time_section(rows),
        *_memory_section(rows),
        *_terms_sections(rows),
        *summary_table(summary),
        *listed_table(rows),
        "",
        "Sources:",
        "",
        *(f"- {r['id']}: {r['source']}" for r in rows),
    ]
    return "\n".join(lines) + "\n"


def _time_section(rows: list[dict[str, Any]]) -> list[str]:
    """The title, what was predicted on which profiles, and the tokens/s table."""
    first = next((r for r in rows if r["predicted"]), {})
    profiles = ", ".join(f"{label} `{first.get(f'{kind}_profile') or '-'}`" for kind, label in KINDS.items())
    return [
        "# Backtest: published GPU runs predicted by the model",
        "",
        "Predicted by the model (tspbench/analytic/predict.py) on three profiles of the published "
        f"hardware ({profiles}; the calibrated one under torch.compile: `-calibrated-compile`) vs "
        "published; error = predicted / published - 1. The shipped and the Hopper-measured profiles "
        "fit nothing and model no torch.compile: '-' where they predict no time.",
        "",
        "## Tokens/s per GPU",
        "",
        *time_table(rows),
    ]


def _memory_section(rows: list[dict[str, Any]]) -> list[str]:
    """What the memory columns compare, and the table (one model column when the profiles agree)."""
    intro = MEMORY_INTRO + (SAME_MEMORY if memory_same(rows) else "")
    return _section("Memory", intro, memory_table(rows))


def _terms_sections(rows: list[dict[str, Any]]) -> list[str]:
    """Each profile's step by term, then where the Hopper-measured and the calibrated one differ."""
    differ = (
        "Where both predict an entry (the calibrated profile differs only in its fitted figures), "
        "the terms whose seconds differ by more than half a percent of the step; "
        f"more than 10% apart: {', '.join(disagreeing(rows)) or 'none'}."
    )
    return [
        *_section("The predicted step by term (seconds)", TERMS_INTRO, terms_table(rows)),
        *_section(
            "The Hopper-measured and the calibrated profile, term by term",
            differ,
            differ_lines(rows) or ["No entry is predicted by both."],
        ),
    ]


def _section(title: str, intro: str, body: list[str]) -> list[str]:
    """A section of the page: its title, a paragraph that says what it holds, then its table."""
    return ["", f"## {title}", "", intro, "", *body]


def summary_table(summary: list[dict[str, Any]]) -> list[str]:
    """The throughput errors by profile and sample (in sample: the entries a profile was fitted to)."""
    rows = [
        f"| {SUMMARY_KINDS[s['kind']]} | {s['sample']} | {', '.join(s['ids']) or 'none'} "
        f"| {_num(s['median_abs'], '.1%')} | {_pct(s['worst'])} |"
        for s in summary
    ]
    head = ["| profile | sample | entries | median abs. error | worst |", "|---|---|---|--:|--:|"]
    return ["", "## Throughput error by sample", "", *head, *rows]


def listed_table(rows: list[dict[str, Any]]) -> list[str]:
    """The entries listed but not predicted, and why not."""
    listed = [
        f"| {r['id']} | {r['published_layout']} at {st.tokens_label(r['seq_len'])} "
        f"| {_num(r['published_tokens_per_s_per_gpu'])} | {r['not_predicted']} |"
        for r in rows
        if not r["predicted"]
    ]
    head = ["| entry | published layout | tokens/s/GPU | why not |", "|---|---|--:|---|"]
    return ["", "## Listed, not predicted", "", *head, *listed]


def parity_figure(rows: list[dict[str, Any]]) -> Figure | None:
    """Predicted (x) vs published (y) tokens/s/GPU, a point per entry and profile, each entry
    labelled once, right of its points."""
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
    rightmost = {r["id"]: max(p for q, _, p in points if q["id"] == r["id"]) for r, _, _ in points}
    for r, kind, predicted in points:
        color = COLORS[r["role"]]
        marker, filled = MARKERS[kind]
        face = color if filled else "white"
        ax.plot(
            predicted, r["published_tokens_per_s_per_gpu"], marker, color=color, mfc=face, ms=7.5, zorder=4
        )
        if predicted != rightmost[r["id"]]:
            continue  # one label per entry, right of its points: its profiles share its row
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
    """The profile by marker (filled: calibrated; hollow circle: shipped; hollow square:
    Hopper-measured), the role by color."""
    grey = "#555555"
    kinds = [
        Line2D(
            [], [], ls="", marker=m, color=grey, mfc=grey if filled else "white", label=f"{KINDS[k]} profile"
        )
        for k, (m, filled) in MARKERS.items()
    ]
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


# ----------------------------------------------------------------------------- the docs' values


def stored_rows(results: Path) -> list[dict[str, Any]]:
    """The rows of results/published/backtest.csv, missing cells as None."""
    df = pd.read_csv(results / "published" / "backtest.csv")
    return df.astype(object).where(df.notna(), None).to_dict("records")


def doc_values(results: Path) -> Values:
    """The backtest's three profiles side by side for docs/templates (``{{backtest.<key>}}``):
    the time, memory and term tables, the median errors, the entries where the Hopper-measured
    and the calibrated profile are more than 10% apart, and where both predict an entry, which
    terms differ and by how much (one line each; None where no entry has both)."""
    rows = stored_rows(results)
    predicted = _predicted(rows)

    def median(kind: str, role: str | None = None) -> str:
        errors = [
            abs(r[f"{kind}_error"])
            for r in predicted
            if r[f"{kind}_error"] is not None and role in (None, r["role"])
        ]
        return f"{pd.Series(errors).median():.1%}" if errors else "-"

    differ = differ_lines(rows)
    memory = [r["measured_memory_error"] for r in predicted if r.get("measured_memory_error") is not None]
    return {
        "memory_range": f"{min(memory):+.1%} to {max(memory):+.1%}" if memory else "-",
        "memory_count": str(len(memory)),
        "time_table": "\n".join(time_table(rows)),
        "memory_table": "\n".join(memory_table(rows)),
        "terms_table": "\n".join(terms_table(rows)),
        "memory_same": (
            "The three profiles give every entry the same memory (a profile changes it only through "
            "its allocator overhead, 0 in all three), so the table has one model column."
            if memory_same(rows)
            else "The profiles' allocator overheads differ, so each has its own column."
        ),
        "shipped_median": median("assumed"),
        "measured_median": median("measured"),
        "calibrated_test_median": median("calibrated", "test"),
        "measured_count": str(sum(r["measured_error"] is not None for r in predicted)),
        "disagree": ", ".join(disagreeing(rows)) or "none",
        "differ": None
        if not differ
        else "Where both predict a run, the terms of the calibrated step that differ from the "
        "Hopper-measured one by more than half a percent of the step, and by how much:\n\n"
        + "\n".join(differ),
    }
