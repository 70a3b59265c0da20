"""The paper's memory claims, (a)-(c), judged from the memory study's records (paper_memory,
or paper_memory_fake where its fake-world steps are the stronger evidence)."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from tspbench.report.claims import (
    EQUAL,
    FAR,
    PAPER_LAYOUTS,
    Claim,
    evidence,
    fits,
    gib,
    label,
    only_where,
    tokens,
)
from tspbench.report.claims import strongest as _strongest

STUDIES = ("paper_memory", "paper_memory_fake")
NOT_RUN = "not testable here: no paper_memory study is stored"
EXPLAIN = (
    "the paper's recomputation mode (here none, selective: the attention core, or full), its "
    "vocabulary (not stated; 32,000 here), allocated against reserved memory (the fake world and "
    "the model count live tensors), and whether a number is of the whole model or of one layer"
)
PAPER_128K = "8 MI300X at 128K: TSP 38.8 GB, TP 70.0 GB, TP+SP 85.0-140.0 GB"


def _memory(studies: Mapping[str, pd.DataFrame]) -> pd.DataFrame | None:
    df = _strongest(studies, STUDIES)
    return None if df is None else df[df["strategy"].isin((*PAPER_LAYOUTS, "fsdp_sp"))]


def lowest_memory(studies: Mapping[str, pd.DataFrame]) -> Claim:
    """(a) TSP has the lowest peak memory at every length, against the paper's layouts."""
    claim = "lowest peak memory per GPU at every length 16K-128K"
    df = _memory(studies)
    if df is None:
        return Claim("a", claim, NOT_RUN, "-", "-")
    good, bad, cells = [], [], []
    for (recompute, seq), group in df.groupby(["recompute", "seq_len"], sort=True):
        paper = group[group["strategy"].isin(PAPER_LAYOUTS)]
        tsp = paper[paper["strategy"] == "tsp"]
        others = paper[paper["strategy"] != "tsp"]
        if tsp.empty or others.empty:
            continue
        where = f"{tokens(seq)} {recompute}"
        low = others.loc[others["peak_memory_bytes"].idxmin()]
        (good if tsp["peak_memory_bytes"].min() < low["peak_memory_bytes"] else bad).append(where)
        if seq == df["seq_len"].max():
            cells.append(f"{where}: TSP {gib(tsp['peak_memory_bytes'].min())}, next {label(low)} "
                         f"{gib(low['peak_memory_bytes'])}")  # fmt: skip
    peer = _fsdp_note(df)
    return Claim("a", claim, only_where(good, bad), evidence(df, speed=False), "; ".join(cells) + peer,
                 paper=PAPER_128K, explain=EXPLAIN)  # fmt: skip


def _fsdp_note(df: pd.DataFrame) -> str:
    """Where FSDP+SP (not in the paper) goes below TSP."""
    pivot = df[df["strategy"].isin(("tsp", "fsdp_sp"))].pivot_table(
        index=["recompute", "seq_len"], columns="strategy", values="peak_memory_bytes", aggfunc="min"
    )
    if not {"tsp", "fsdp_sp"} <= set(pivot.columns):
        return ""
    below = [f"{tokens(s)} {r}" for (r, s), row in pivot.iterrows() if row["fsdp_sp"] < row["tsp"]]
    return (
        f". FSDP+SP (not in the paper) is below TSP at {', '.join(below)}"
        if below
        else ". FSDP+SP (not in the paper) stays above TSP everywhere"
    )


def equal_short(studies: Mapping[str, pd.DataFrame]) -> Claim:
    """(b) about equal to TP at the shortest length (within EQUAL)."""
    claim = "about equal to TP at short context"
    df = _memory(studies)
    if df is None:
        return Claim("b", claim, NOT_RUN, "-", "-")
    short = df[df["seq_len"] == df["seq_len"].min()]
    ratios = {}
    for recompute, group in short.groupby("recompute", sort=True):
        tsp, tp = (group[group["strategy"] == s]["peak_memory_bytes"] for s in ("tsp", "tp"))
        if len(tsp) and len(tp):
            ratios[recompute] = (tsp.min(), tp.min())
    near = [r for r, (a, b) in ratios.items() if abs(a / b - 1) <= EQUAL]
    far = [r for r in ratios if r not in near]
    verdict = only_where(near, far)
    if far and not near:
        lower = all(a < b for a, b in ratios.values())
        verdict = f"does not hold: TSP is {'below' if lower else 'above'} TP, not equal to it"
    numbers = "; ".join(f"{tokens(int(short['seq_len'].min()))} {r}: TSP {gib(a)}, TP {gib(b)} ({a / b:.2f}x)"
                        for r, (a, b) in ratios.items())  # fmt: skip
    return Claim("b", claim, verdict, evidence(df, speed=False), numbers,
                 paper="8 MI300X at 16K: TSP about 31.0 GB, TP about 31.5 GB", explain=EXPLAIN)  # fmt: skip


def far_below_long(studies: Mapping[str, pd.DataFrame]) -> Claim:
    """(c) far below TP and TP+SP at the longest length (at most FAR of the lowest of them),
    fitting where they do not."""
    claim = "far below TP and TP+SP at long context, fitting where they run out of memory"
    df = _memory(studies)
    if df is None:
        return Claim("c", claim, NOT_RUN, "-", "-")
    long = df[df["seq_len"] == df["seq_len"].max()]
    good, bad, cells = [], [], []
    for recompute, group in long.groupby("recompute", sort=True):
        tsp = group[group["strategy"] == "tsp"]
        base = group[group["strategy"].isin(("tp", "tp_sp"))]
        if tsp.empty or base.empty:
            continue
        ratio = tsp["peak_memory_bytes"].min() / base["peak_memory_bytes"].min()
        out = [label(r) for _, r in base[~fits(base)].iterrows()]
        ok = ratio <= FAR and bool(fits(tsp).all())
        (good if ok else bad).append(recompute)
        oom = f", out of memory: {', '.join(out)}" if out else ", all fit"
        cells.append(f"{recompute}: TSP {ratio:.2f}x the lowest of TP and TP+SP"
                     f"{'' if fits(tsp).all() else ' (TSP does not fit)'}{oom}")  # fmt: skip
    where = f"at {tokens(int(long['seq_len'].max()))}: "
    return Claim("c", claim, only_where(good, bad), evidence(df, speed=False), where + "; ".join(cells),
                 paper=PAPER_128K, explain=EXPLAIN)  # fmt: skip


MEMORY_JUDGES = (lowest_memory, equal_short, far_below_long)
