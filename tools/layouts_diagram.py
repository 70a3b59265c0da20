"""The README's picture of what each rank holds: weights x tokens, for TP, SP, TP+SP, FSDP+SP, TSP.

    python -m tools.layouts_diagram docs/layouts.png

Each panel is the (weight shard x token shard) plane of one layer on 4 ranks; a cell is colored
by the rank that keeps that piece resident, or left blank when nobody keeps it. TP splits the
weights and replicates the tokens, SP the reverse, TP+SP a 2 x 2 mesh of both. FSDP+SP (TSP's
peer: FSDP over the same ranks that shard the tokens) and TSP keep the same diagonal, rank p
weight shard p and token shard p; they differ in what they fetch while a layer computes
(hatched): FSDP+SP all-gathers the layer's whole weights onto every rank, TSP passes one shard
at a time around the ring (tspbench/strategies/tsp_ring.py: at ring step 1, rank p holds the
shard of rank p - 1) while its tokens stay put.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

RANKS = 4
COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
PANELS = (
    ("TP", "1/4 of weights, all tokens\n2 all-reduces of activations/layer"),
    ("SP", "all weights, 1/4 of tokens\nK/V all-gathered"),
    ("TP+SP", "2 x 2 mesh: 1/2 weights,\n1/2 tokens"),
    ("FSDP+SP", "1/4 of weights AND 1/4 of tokens\nthe whole layer's weights\nall-gathered, then dropped"),
    (
        "TSP",
        "1/4 of weights AND 1/4 of tokens\nweight shards pass one at a time\n(one ring step); tokens stay",
    ),
)


def owners(kind: str, w: int, t: int) -> list[int]:
    """Ranks that hold weight shard w for token shard t, resident in memory."""
    if kind == "TP":
        return [w]  # each rank: weights w, every token
    if kind == "SP":
        return [t]  # each rank: every weight, tokens t
    if kind == "TP+SP":
        return [2 * (t // 2) + w // 2]  # 2 x 2 mesh: halves of weights x halves of tokens
    return [w] if w == t else []  # FSDP+SP and TSP: weight shard p and token shard p


def fetched(kind: str, w: int, t: int) -> list[int]:
    """Ranks that hold weight shard w for token shard t only while a layer computes (hatched)."""
    if kind == "FSDP+SP" and w != t:
        return [t]  # the layer's weights all-gathered: every shard, on every rank, at once
    if kind == "TSP" and w == (t - 1) % RANKS:
        return [t]  # one ring step: rank t holds the shard of rank t - 1
    return []


def draw(ax: plt.Axes, kind: str, subtitle: str) -> None:
    for w in range(RANKS):
        for t in range(RANKS):
            who, moving = owners(kind, w, t), fetched(kind, w, t)
            xy = (t, RANKS - 1 - w)
            if who:
                ax.add_patch(Rectangle(xy, 0.95, 0.95, facecolor=COLORS[who[0]], edgecolor="#999999",
                                       lw=0.6, alpha=0.9))  # fmt: skip
                ax.text(t + 0.47, RANKS - 1 - w + 0.47, f"r{who[0]}", ha="center", va="center",
                        color="white", fontsize=9)  # fmt: skip
            elif moving:
                ax.add_patch(Rectangle(xy, 0.95, 0.95, facecolor="white", edgecolor=COLORS[moving[0]],
                                       hatch="////", lw=1.0))  # fmt: skip
            else:
                ax.add_patch(Rectangle(xy, 0.95, 0.95, facecolor="white", edgecolor="#999999", lw=0.6))
    ax.set_xlim(0, RANKS)
    ax.set_ylim(0, RANKS)
    ax.set_aspect("equal")
    ax.set_xticks([i + 0.47 for i in range(RANKS)], [f"t{i}" for i in range(RANKS)], fontsize=8)
    ax.set_yticks([i + 0.47 for i in range(RANKS)], [f"W{RANKS - 1 - i}" for i in range(RANKS)], fontsize=8)
    ax.set_xlabel("token shard", fontsize=9)
    ax.set_ylabel("weight shard", fontsize=9)
    ax.set_title(f"{kind}\n{subtitle}", fontsize=10)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)


def figure() -> Figure:
    """The five panels side by side, the key to solid, hatched and blank cells below them."""
    fig, axes = plt.subplots(1, len(PANELS), figsize=(15, 4.3))
    for ax, (kind, subtitle) in zip(axes, PANELS, strict=True):
        draw(ax, kind, subtitle)
    fetched_key = "held only while the layer computes (fetched, then dropped)"
    key = [
        Patch(facecolor=COLORS[0], edgecolor="#999999", label="resident on the rank of its color"),
        Patch(facecolor="white", edgecolor=COLORS[0], hatch="////", label=fetched_key),
        Patch(facecolor="white", edgecolor="#999999", label="blank: held by nobody (at that moment)"),
    ]
    fig.legend(handles=key, loc="lower center", ncol=3, frameon=False, fontsize=9)
    fig.suptitle("What each of four ranks keeps, per layer: FSDP+SP and TSP keep the same diagonal and "
                 "differ in what they fetch", fontsize=11)  # fmt: skip
    fig.tight_layout(rect=(0, 0.07, 1, 0.98))
    return fig


def make(path: Path) -> None:
    fig = figure()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    make(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/layouts.png"))
