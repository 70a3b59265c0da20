"""What the layout settings do to memory, executed in the fake world (results/
memory_settings_fake): Megatron SP for TP and TP+SP, TSP's MLP exchange and overlap, each beside
its default at 128K without recomputation, and the memory model's worst error over the study.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tools.docs_numbers.stored import completed, named
from tools.docs_numbers.studies import MI300X_USABLE_GIB
from tspbench.report.best import SWITCH_DEFAULTS, with_settings
from tspbench.report.formats import GIB, Values

STUDY = "memory_settings_fake"


def peak(df: pd.DataFrame, layout: str, **setting: object) -> float:
    """The peak (GiB) of ``layout`` at the given switches, every other switch at its default."""
    rows = df[df["layout"] == layout]
    for name, value in {**SWITCH_DEFAULTS, **setting}.items():
        rows = rows[rows[name] == value]
    (value,) = rows["peak_memory_bytes"] / GIB
    return float(value)


def settings_memory(results: Path) -> Values:
    """Per setting at 128K, no recomputation: the default's peak and the setting's (GiB)."""
    every = completed(results, STUDY)
    df = named(with_settings(every[every["seq_len"] == 131072]))
    df = df[df["recompute"] == "none"]
    tp, tp_msp = peak(df, "TP 8"), peak(df, "TP 8", megatron_sp=True)
    grids = {name: (peak(df, name), peak(df, name, megatron_sp=True)) for name in ("TP+SP 2x4", "TP+SP 4x2")}
    tsp = peak(df, "TSP 8")
    broadcast, blocking = peak(df, "TSP 8", mlp_exchange="broadcast"), peak(df, "TSP 8", overlap=False)
    same = f"{tsp:.1f}" == f"{broadcast:.1f}" == f"{blocking:.1f}"
    tsp_words = (
        f"TSP 8's {tsp:.1f} GiB is the same with its MLP shards broadcast and with blocking transfers"
        if same
        else f"TSP 8's {tsp:.1f} GiB is {broadcast:.1f} with its MLP shards broadcast and {blocking:.1f} "
        "with blocking transfers"
    )
    return {
        "points": f"{len(every)}",
        "worst": f"{every['predicted_memory_error'].abs().max():.1%}",
        "tp": f"{tp:.1f}",
        "tp_msp": f"{tp_msp:.1f}",
        "tp_msp_fits": "fits" if tp_msp <= MI300X_USABLE_GIB else "still does not fit",
        "grids": "; ".join(f"{name} {a:.1f} → {b:.1f} GiB" for name, (a, b) in grids.items()),
        "tsp": tsp_words,
    }
