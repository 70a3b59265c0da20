"""What the scaling and micro-batch figures say besides their lines, and the tables under them in
report.md: why a scaling study's per-GPU throughput is flat or what bends it, and where each
layout's micro-batch runs out of memory (its wall) and what it reaches before.

Scaling. A forward-only study (the paper's Fig. 12) has no gradients: more data-parallel
replicas add GPUs and nothing to move, so per-GPU throughput is flat by construction, and the
figure says so rather than let flat lines pass for a finding. A training study all-reduces the
gradients over dp every step; with ranks placed model-parallel innermost, the dp groups cross
nodes as soon as there are two replicas of a node each, and that traffic on the NICs is what
bends the curves: the records' ``internode_share`` (tspbench.analytic.internode) is drawn beside.

Micro-batch. A layout's wall is the smallest micro-batch run that does not fit; its largest
fitting micro-batch and its best tokens/s (often at that micro-batch, not always) are what
'less memory allows larger micro-batches' is judged on.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.transforms import blended_transform_factory

from tspbench.analytic.profile_choice import named_profile
from tspbench.core.errors import HardwareError
from tspbench.report.style import SeriesStyle, tokens_label
from tspbench.report.tables import grid

TRAINING_SCALING = "results/report/paper_scaling_train"  # the study a forward-only scaling figure points at
WALL_KEYS = ("seq_len", "recompute", "world_size")  # a micro-batch sweep's setting, as its panels


# ----------------------------------------------------------------------------- scaling


def trains(df: pd.DataFrame) -> bool:
    return bool(len(df)) and (df["mode"] == "train").all()


def nic_words(df: pd.DataFrame) -> str:
    """' (NIC 45 GB/s per GPU on the mi300x profile)' for projected records, else ''."""
    names = set(df.get("hardware", pd.Series(dtype=object)).dropna())
    if len(names) != 1:
        return ""
    name = str(names.pop())
    try:
        gbs = named_profile(name).inter_node_bandwidth_gbs
    except HardwareError:
        return ""
    return f" (NIC {gbs:g} GB/s per GPU on the {name} profile)"


def scaling_note(df: pd.DataFrame) -> str:
    """One line under a scaling figure's title: why its per-GPU curves are flat (forward only), or
    what bends them (training: the data-parallel all-reduce across nodes); '' otherwise."""
    if len(df) and (df["mode"] == "infer").all():
        return (
            "Forward only (as the paper's): no gradients, so no data-parallel all-reduce - more "
            "replicas add GPUs and nothing to move, and per-GPU throughput is flat by construction; "
            f"training, whose all-reduce bends the curves: {TRAINING_SCALING}"
        )
    if not trains(df) or column(df, "internode_share").isna().all():
        return ""
    return (
        "Training: every step all-reduces the gradients over dp, whose groups cross nodes from two "
        f"nodes on; that traffic on the inter-node links{nic_words(df)} bends per-GPU throughput "
        "(right: its share of the step, hidden under compute or not)"
    )


def column(df: pd.DataFrame, name: str) -> pd.Series:
    if name not in df:
        return pd.Series(np.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[name], errors="coerce").astype(float)


def scaling_table(df: pd.DataFrame) -> str:
    """Per setting and layout: tokens/s per GPU at its smallest and largest world, their ratio, the
    axes that cross nodes and the inter-node share at the largest (completed points only)."""
    ok = df[(df["status"] == "completed") & df["tput"].notna()]
    keys = [k for k in ("seq_len", "recompute") if k in ok and ok[k].nunique() > 1]
    ok = ok.sort_values(keys, kind="stable")  # a setting's layouts together, in the frame's order
    head = [*(k.replace("_", " ") for k in keys), "layout", "from GPUs", "tokens/s/GPU", "to GPUs",
            "tokens/s/GPU there", "ratio", "crossing nodes there", "inter-node share there"]  # fmt: skip
    rows = []
    for key, g in ok.groupby([*keys, "series_mp"], sort=False):
        g = g.sort_values("world_size")
        lo, hi = g.iloc[[0, -1]].to_dict("records")
        share, cross = column(g, "internode_share").iloc[-1], hi.get("crossing_axes")
        rows.append([
            *(tokens_label(v) if k == "seq_len" else v for k, v in zip(keys, key[:-1], strict=True)),
            key[-1], f"{lo['world_size']:,}", f"{lo['tput']:,.0f}", f"{hi['world_size']:,}",
            f"{hi['tput']:,.0f}", f"{hi['tput'] / lo['tput']:.3f}",
            cross if isinstance(cross, str) and cross else "none", "" if np.isnan(share) else f"{share:.1%}",
        ])  # fmt: skip
    return grid(head, rows) + "\n"


# ----------------------------------------------------------------------------- micro-batch walls


def walls(df: pd.DataFrame) -> pd.DataFrame:
    """Per setting and layout (``series``): the wall (the smallest micro-batch run that does not
    fit; NaN: none did not), the largest fitting micro-batch below it with its tokens/s, and the
    best tokens/s with its micro-batch. Reads ``series``, ``batch``, ``status``, ``tput``."""
    keys = [k for k in WALL_KEYS if k in df]
    rows = []
    for key, g in df.groupby([*keys, "series"], sort=False):
        oom = g.loc[g["status"] == "oom", "batch"]
        wall = float(oom.min()) if len(oom) else np.nan
        fit = g[(g["status"] == "completed") & g["tput"].notna()]
        fit = fit[fit["batch"] < wall] if len(oom) else fit
        largest = fit.loc[fit["batch"].idxmax()] if len(fit) else None
        best = fit.loc[fit["tput"].idxmax()] if len(fit) else None
        rows.append({
            **dict(zip([*keys, "series"], key, strict=True)),
            "wall": wall,
            "largest": float(largest["batch"]) if largest is not None else np.nan,
            "tput_at_largest": float(largest["tput"]) if largest is not None else np.nan,
            "best_batch": float(best["batch"]) if best is not None else np.nan,
            "best_tput": float(best["tput"]) if best is not None else np.nan,
        })  # fmt: skip
    return pd.DataFrame(rows)


def walls_table(df: pd.DataFrame) -> str:
    """report.md's table of ``walls``: a row per setting and layout."""
    table = walls(df)
    keys = [k for k in WALL_KEYS if k in table and table[k].nunique() > 1]
    table = table.sort_values(keys, kind="stable")  # a setting's layouts together
    top = int(df["batch"].max()) if len(df) else 0
    head = [*(k.replace("_", " ") for k in keys), "layout", "wall (first micro-batch that does not fit)",
            "largest fitting", "tokens/s/GPU there", "best tokens/s/GPU", "at micro-batch"]  # fmt: skip
    rows = []
    for _, r in table.iterrows():
        fixed = [tokens_label(r[k]) if k == "seq_len" else str(r[k]) for k in keys]
        wall = f"{int(r['wall'])}" if pd.notna(r["wall"]) else f"none (fits {top})"
        nums = ["none fits", "", "", ""]
        if pd.notna(r["largest"]):
            at, best = f"{r['tput_at_largest']:,.0f}", f"{r['best_tput']:,.0f}"
            nums = [int(r["largest"]), at, best, int(r["best_batch"])]
        rows.append([*fixed, r["series"], wall, *nums])
    return grid(head, rows) + "\n"


def draw_walls(ax: Axes, df: pd.DataFrame, style: SeriesStyle, label: bool) -> None:
    """Each layout's wall in one panel: a dotted vertical line in its color at the first
    micro-batch that does not fit, and with ``label`` its name there, stacked from the top."""
    table = walls(df)
    hit = table[table["wall"].notna()]
    where = blended_transform_factory(ax.transData, ax.transAxes)
    for k, (_, r) in enumerate(hit.iterrows()):
        color = style.color.get(r["series"], "black")
        ax.axvline(r["wall"], color=color, ls=":", lw=1.4, zorder=2)
        if label:
            ax.text(r["wall"], 0.97 - 0.075 * k, f"{r['series']}: wall {int(r['wall'])} ", transform=where,
                    ha="right", va="top", fontsize=7, color=color, zorder=6,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.4, "alpha": 0.8})  # fmt: skip


# ----------------------------------------------------------------------------- report.md


def caption(figure: str, df: pd.DataFrame) -> str:
    """Markdown under a figure in report.md: the scaling note and table, the micro-batch walls;
    '' for other figures."""
    if figure == "scaling":
        note = scaling_note(df)
        return (f"{note}.\n\n" if note else "") + scaling_table(df)
    if figure == "microbatch":
        words = ("A dotted line marks each layout's wall: the first micro-batch run that does not fit "
                 "(its crossed marker in the out-of-memory strip).")  # fmt: skip
        return f"{words}\n\n{walls_table(df)}"
    return ""
