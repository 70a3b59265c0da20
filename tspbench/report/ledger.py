"""The paper's claims, each judged from the stored records of the paper studies (a ledger).

Every verdict is computed from records by their columns (strategy, degrees, seq_len, batch,
status, peak memory, tokens/s, source), never from numbers written here, so a user who re-runs
the studies on a cluster (``tspbench run experiments/paper_*.yaml``) gets the ledger recomputed
from measured records with no change of code; the evidence class comes from the records'
``source`` (measured; fake: executed in a fake world, its time replayed on a profile; predicted:
projected on a profile). Where two studies answer a claim (paper_memory and paper_memory_fake),
the one with the stronger evidence is used.

A projected speed verdict also names the figures it hinges on: a ``HingeFinder`` (given by the
command line, which may import the model: this layer needs no torch) returns each figure's
break-even value for a comparison (tspbench.analytic.sensitivity). The paper's own numbers stand
beside the project's, labelled second-hand: its figures were only partly readable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pandas as pd

from tspbench.core.files import write_atomic
from tspbench.report.claims import Claim, Comparison, Hinge
from tspbench.report.claims_memory import MEMORY_JUDGES
from tspbench.report.claims_speed import SPEED_JUDGES

__all__ = [
    "Claim",
    "Comparison",
    "Hinge",
    "HingeFinder",
    "hinge_text",
    "ledger",
    "markdown",
    "verdict_table",
    "write_ledger",
]


HingeFinder = Callable[[Comparison], list[Hinge]]


def ledger(studies: Mapping[str, pd.DataFrame], hinges: HingeFinder | None = None) -> list[Claim]:
    """The claims (a)-(i), judged from the records of ``studies`` (experiment name -> records);
    with ``hinges``, each projected comparison's figures and break-even values."""
    rows = sorted((judge(studies) for judge in (*MEMORY_JUDGES, *SPEED_JUDGES)), key=lambda c: c.key)
    if hinges is not None:
        for row in rows:
            row.hinges = [(c, hinges(c)) for c in row.comparisons]
    return rows


def markdown(rows: Sequence[Claim]) -> str:
    """The ledger as a Markdown page: one table of verdicts, then each claim's numbers beside the
    paper's, and the figures each projected verdict hinges on."""
    lines = [
        "# The paper's claims, judged from the stored records",
        "",
        "Each verdict is computed by `tspbench report` from the records of the paper studies "
        "(tspbench/report/claims_memory.py, claims_speed.py); re-run the studies on a cluster and the "
        "ledger follows the measured records. The paper's numbers are second-hand: its figures were "
        "only partly readable.",
        "",
        verdict_table(rows),
        "",
    ]
    for r in rows:
        lines += [
            f"## ({r.key}) {r.claim}",
            "",
            f"**{r.verdict}** ({r.evidence}).",
            "",
            f"This project: {r.numbers}",
        ]
        if r.paper:
            lines += ["", f"The paper (second-hand): {r.paper}"]
        if r.explain:
            lines += ["", f"What could explain a difference: {r.explain}"]
        for comparison, found in r.hinges:
            lines += ["", hinge_text(comparison, found)]
        lines.append("")
    return "\n".join(lines)


def verdict_table(rows: Sequence[Claim]) -> str:
    """One Markdown row per claim: its verdict and the evidence class (the docs quote it)."""
    lines = ["| claim | verdict | evidence |", "|---|---|---|"]
    return "\n".join([*lines, *(f"| ({r.key}) {r.claim} | {r.verdict} | {r.evidence} |" for r in rows)])


def hinge_text(c: Comparison, found: Sequence[Hinge]) -> str:
    """'Hinges on (TSP 8 vs TP+SP 2x4 at 128K, projected on mi300x): ring shift ... flips at ...'."""
    where = f"{c.layout} vs {c.against} at {c.seq_len:,} tokens, {c.mode}, batch {c.batch}, on {c.hardware}"
    flips = [f"{h.figure} ({h.provenance} {fmt(h.value)} {h.unit}) flips it at {fmt(h.break_even)} {h.unit}"
             for h in found if h.break_even is not None]  # fmt: skip
    past = [
        f"{h.figure} only past its range, at {fmt(h.beyond)} {h.unit}" for h in found if h.beyond is not None
    ]
    text = "; ".join(flips) or "no figure flips it within its range"
    return f"Hinges on ({where}): {text}" + (f"; {'; '.join(past)}" if past else "") + "."


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"


def write_ledger(
    studies: Mapping[str, pd.DataFrame], out_dir: Path, hinges: HingeFinder | None = None
) -> Path:
    """ledger.md in ``out_dir`` from the paper studies among ``studies``; returns its path."""
    path = out_dir / "ledger.md"
    write_atomic(path, markdown(ledger(studies, hinges)))
    return path
