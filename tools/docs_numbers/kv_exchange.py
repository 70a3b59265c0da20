"""The README's memory finding by K/V exchange (#48): which exchange the sequence-sharded peers of
the paper's memory study ran, and the best of them at 128K once ring attention and Ulysses are
allowed too, all executed in the fake world (results/paper_memory_fake, which ran before the
setting existed, and results/paper_memory_kv_fake, its ring and Ulysses points).

A separate group from studies.memory_128k because it reads a second study: the sentence that
says "TSP needs the least memory" must hold against the peers' best exchange, not only the one
the paper ran.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tools.docs_numbers.stored import completed, named
from tools.docs_numbers.studies import MI300X_USABLE_GIB
from tspbench.report.formats import GIB, Values
from tspbench.report.legend import exchange_of

SEQUENCE_SHARDED = ("sp", "fsdp_sp", "tp_sp")  # the layouts whose sequence axis picks an exchange
EXPERIMENTS = ("paper_memory_fake", "paper_memory_kv_fake")  # the paper's peers; their ring and Ulysses
WORDS = {"allgather": "the all-gather", "ring": "ring attention", "ulysses": "Ulysses"}


def at_128k(results: Path) -> pd.DataFrame:
    """Both studies' completed sequence-sharded points at 128K without recomputation, each with
    its exchange (a record without the field ran the all-gather) and peak in GiB."""
    parts = [completed(results, name, seq_len=131072, recompute="none") for name in EXPERIMENTS]
    df = named(pd.concat(parts, ignore_index=True))
    df = df[df["strategy"].isin(SEQUENCE_SHARDED)]
    return df.assign(exchange=exchanges(df), gib=df["peak_memory_bytes"] / GIB)


def exchanges(df: pd.DataFrame) -> list[str]:
    """Each record's K/V exchange; a record without the field (stored before #48) ran the all-gather."""
    stored = df["kv_exchange"] if "kv_exchange" in df else pd.Series(None, index=df.index, dtype=object)
    return [exchange_of(v) for v in stored]


def words(exchanges: list[str]) -> str:
    """'ring attention or Ulysses': exchanges whose peaks print alike are one finding."""
    return " or ".join(WORDS.get(e, e) for e in sorted(set(exchanges), key=list(WORDS).index))


def lowest(df: pd.DataFrame) -> tuple[str, float]:
    """'FSDP+SP 8 under ring attention or Ulysses' and its peak (GiB): the layout with the lowest
    peak, with every exchange of it whose peak prints alike (ring and Ulysses differ by bytes)."""
    best = df.loc[df["gib"].idxmin()]
    ties = df[(df["layout"] == best["layout"]) & (df["gib"].round(1) == round(best["gib"], 1))]
    return f"{best['layout']} under {words(list(ties['exchange']))}", float(best["gib"])


def kv_memory(results: Path) -> Values:
    """Which exchange each peer ran in the paper's study, the best peer and exchange at 128K (peak
    per GPU without recomputation) against TSP 8, TP+SP's best (its ring and Ulysses projected
    only), and the memory model's worst error on the fake world's ring and Ulysses points."""
    df = at_128k(results)
    paper = df[df["experiment"] == "paper_memory_fake"]
    kv = completed(results, "paper_memory_kv_fake")
    kv = kv[[e != "allgather" for e in exchanges(kv)]]  # its all-gather and TSP points: the paper's again
    tsp = completed(results, "paper_memory_fake", seq_len=131072, recompute="none", strategy="tsp")
    best, best_gib = lowest(df)
    sp, sp_gib = lowest(df[(df["strategy"] == "sp") & (df["exchange"] != "allgather")])
    tp_sp = named(completed(results, "paper_memory_kv", seq_len=131072, recompute="none", strategy="tp_sp"))
    tp_sp_best, tp_sp_gib = lowest(
        tp_sp.assign(gib=tp_sp["peak_memory_bytes"] / GIB, exchange=exchanges(tp_sp))
    )
    return {
        "used": words(list(paper["exchange"])),
        "best": best,
        "best_gib": f"{best_gib:.1f}",
        "best_vs_tsp": f"{best_gib / (float(tsp['peak_memory_bytes'].iloc[0]) / GIB):.2f}",
        "sp": f"{sp} at {sp_gib:.1f}",
        "sp_fits": "within" if sp_gib <= MI300X_USABLE_GIB else "still over",
        "tp_sp": f"{tp_sp_best} at {tp_sp_gib:.1f} GiB",
        "worst": f"{kv['predicted_memory_error'].abs().max():.1%}",
        "points": str(len(kv)),
    }
