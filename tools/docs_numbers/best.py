"""Each layout at its best setting in the paper's throughput study (tspbench.report.best): the
README's numbers for TSP 8 against its peers at 128K once every layout is tuned alike."""

from __future__ import annotations

from pathlib import Path

from tools.docs_numbers.stored import completed, named
from tspbench.report.best import best_rows, winner
from tspbench.report.formats import Values


def best(results: Path) -> Values:
    """At 128K on 8 GPUs (projected for MI300X): each layout's best tokens/s/GPU over the swept
    settings, TSP 8's against the fastest other layout's, and the settings that won it."""
    df = completed(results, "paper_throughput", seq_len=131072, world_size=8)
    rows = named(best_rows(df)).set_index("layout")
    tsp = rows.loc["TSP 8"]
    others = rows.drop(index="TSP 8").sort_values("tokens_per_s_per_gpu", ascending=False)
    top = others.iloc[0]
    return {
        "tsp": f"{tsp['tokens_per_s_per_gpu']:,.0f}",
        "tsp_setting": winner(tsp, None),
        "top": str(others.index[0]),
        "top_tput": f"{top['tokens_per_s_per_gpu']:,.0f}",
        "top_setting": winner(top, None),
        "ratio": f"{tsp['tokens_per_s_per_gpu'] / top['tokens_per_s_per_gpu']:.2f}",
        "points": f"{len(completed(results, 'paper_throughput')):,}",
    }
