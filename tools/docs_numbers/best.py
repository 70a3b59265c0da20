"""Each layout at its best setting in the paper's throughput study (tspbench.report.best): the
README's numbers for TSP 8 against its peers at 128K once every layout is tuned alike."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tools.docs_numbers.stored import completed, named, records
from tspbench.report.best import best_rows, winner, with_settings
from tspbench.report.formats import Values


def node_at_128k(results: Path, study: str) -> pd.DataFrame:
    """Each layout's best record at 128K on 8 GPUs in ``study``, by layout, fastest first."""
    rows = named(best_rows(completed(results, study, seq_len=131072, world_size=8))).set_index("layout")
    return rows.sort_values("tokens_per_s_per_gpu", ascending=False)


def best(results: Path) -> Values:
    """At 128K on 8 GPUs (projected for MI300X): each layout's best tokens/s/GPU over the swept
    settings, TSP 8's against the fastest other layout's, and the settings that won it."""
    rows = node_at_128k(results, "paper_throughput")
    tsp, others = rows.loc["TSP 8"], rows.drop(index="TSP 8")
    top = others.iloc[0]
    return {
        "tsp": f"{tsp['tokens_per_s_per_gpu']:,.0f}",
        "tsp_setting": winner(tsp, None),
        "top": str(others.index[0]),
        "top_tput": f"{top['tokens_per_s_per_gpu']:,.0f}",
        "top_setting": winner(top, None),
        "points": f"{len(completed(results, 'paper_throughput')):,}",
    }


def change(before: float, after: float) -> str:
    return f"{after / before - 1:+.0%}".replace("-", "−")


def scaling_train(results: Path) -> Values:
    """The training scaling study (projected for MI300X): each layout at its best setting, its
    tokens/s/GPU at 8 GPUs and at 1,024, and the share of the 1,024-GPU step the inter-node
    traffic takes, at 16K (where the gradient all-reduce bends the curves) and 128K (where the
    step's compute hides it)."""
    df = completed(results, "paper_scaling_train")
    rows = named(best_rows(df))

    def at(seq: int, world: int) -> pd.Series:
        part = rows[(rows["seq_len"] == seq) & (rows["world_size"] == world)]
        return part.set_index("layout")["tokens_per_s_per_gpu"]

    def bends(seq: int) -> str:
        first, last = at(seq, 8), at(seq, 1024)
        order = last.sort_values(ascending=False).index
        return ", ".join(
            f"{name} {first[name]:,.0f} → {last[name]:,.0f} ({change(first[name], last[name])})"
            for name in order if name in first
        )  # fmt: skip

    big = rows[(rows["world_size"] == 1024)].set_index(["seq_len", "layout"])
    tsp16, tsp128 = big.loc[(16384, "TSP 8")], big.loc[(131072, "TSP 8")]
    return {
        "points": f"{len(df):,}",
        "bends_16k": bends(16384),
        "bends_128k": bends(131072),
        "span_128k": span_of(at(131072, 8), at(131072, 1024)),
        "tsp_share_16k": f"{tsp16['internode_share']:.0%}",
        "tsp_share_128k": f"{tsp128['internode_share']:.1%}",
        "grid_8x8": f"{big.loc[(131072, 'TP+SP 8x8')]['tokens_per_s_per_gpu']:,.0f}",
        "grid_8x8_share": f"{big.loc[(131072, 'TP+SP 8x8')]['internode_share']:.0%}",
    }


def span_of(first: pd.Series, last: pd.Series) -> str:
    """'by 0-9% down': how far per-GPU throughput falls between two sizes, over the layouts of both."""
    falls = [(1 - last[name] / first[name]) * 100 for name in first.index if name in last]
    return f"by {min(falls):.0f}-{max(falls):.0f}% down"


def walls(results: Path) -> Values:
    """The micro-batch study's walls (projected for MI300X, 16 GPUs, full recomputation): each
    layout's largest fitting micro-batch at 64K and 128K (at its best setting), and its tokens/s
    per GPU there."""
    df = with_settings(records(results, "paper_microbatch"))
    out: dict[str, str] = {}
    for seq, key in ((65536, "64k"), (131072, "128k")):
        part = named(df[df["seq_len"] == seq])
        fits = part[part["status"] == "completed"]
        best = best_rows(fits) if len(fits) else fits  # keeps the layout column
        largest = best.loc[best.groupby("layout")["batch"].idxmax()].sort_values("batch", ascending=False)
        each = ", ".join(
            f"{r.layout} {int(r.batch)} (at {r.tokens_per_s_per_gpu:,.0f} tokens/s/GPU)"
            for r in largest.itertuples()
        )
        top = int(part["batch"].max())
        everyone = (largest["batch"] == top).all() and len(largest) == part["layout"].nunique()
        out[key] = f"micro-batch {top}, the study's largest, for every layout ({each})" if everyone else each
    return out


def hardware_verdicts(results: Path) -> Values:
    """The 128K verdict on 8 GPUs at best against best, on the MI300X and the H100 profiles."""
    out: dict[str, str] = {}
    for study, key in (("paper_throughput", "mi300x"), ("paper_throughput_h100", "h100")):
        frame = node_at_128k(results, study)
        rows = frame["tokens_per_s_per_gpu"]
        out[f"{key}_tsp"] = f"{rows['TSP 8']:,.0f}"
        out[f"{key}_top"] = f"{rows.index[0]} {rows.iloc[0]:,.0f}"
        out[f"{key}_ratio"] = f"{rows['TSP 8'] / rows.iloc[0]:.2f}"
        out[f"{key}_rank"] = f"{list(rows.index).index('TSP 8') + 1} of {len(rows)}"
        tsp, top = (f"{study}/{frame.loc[name, 'run_id']}" for name in ("TSP 8", rows.index[0]))
        out[f"{key}_flip"] = best_flip(results / tsp, results / top, key)
        # relative to the checkout's root, as every command the docs give
        out[f"{key}_command"] = (
            f"tspbench sensitivity --hardware {key} --layout results/{tsp} --against results/{top}"
        )
    return out


def best_flip(mine: Path, other: Path, profile: str) -> str:
    """Whether one figure of ``profile``, moved alone over its range, changes the faster of two
    stored points, each at its own settings (``tspbench sensitivity`` given their folders)."""
    from tools.docs_numbers.hinges import flip_text
    from tspbench.analytic import sensitivity as sens
    from tspbench.analytic.profile_choice import named_profile
    from tspbench.sweep.points import Point
    from tspbench.sweep.store import read_json

    a, b = (Point.from_json(read_json(folder / "point.json")) for folder in (mine, other))
    return flip_text(sens.break_evens(a.layout, b.layout, a.workload, named_profile(profile), (), b.workload))
