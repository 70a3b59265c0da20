"""The README's picture of what each rank holds: weights x tokens, for TP, SP, TP+SP and TSP.

    python -m tools.layouts_diagram docs/layouts.png

Each panel is the (weight shard x token shard) plane of one layer on 4 ranks; a cell is colored
by the rank that holds that piece, or left blank when nobody keeps it. TP splits the
weights and replicates the tokens, SP the reverse, TP+SP a 2 x 2 mesh of both, TSP folds both
onto one axis: rank p holds weight shard p and token shard p, and gets the other weight shards
by broadcast or ring while it computes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

RANKS = 4
COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]


def owners(kind: str, w: int, t: int) -> list[int]:
    """Ranks that hold weight shard w for token shard t, resident in memory."""
    if kind == "TP":
        return [w]  # each rank: weights w, every token
    if kind == "SP":
        return [t]  # each rank: every weight, tokens t
    if kind == "TP+SP":
        return [2 * (t // 2) + w // 2]  # 2 x 2 mesh: halves of weights x halves of tokens
    return [w] if w == t else []  # TSP: weight shard p and token shard p


def draw(ax: plt.Axes, kind: str, subtitle: str) -> None:
    for w in range(RANKS):
        for t in range(RANKS):
            who = owners(kind, w, t)
            color = COLORS[who[0]] if who else "white"
            ax.add_patch(
                Rectangle(
                    (t, RANKS - 1 - w),
                    0.95,
                    0.95,
                    facecolor=color,
                    edgecolor="#999999",
                    lw=0.6,
                    alpha=0.9 if who else 1,
                )
            )
            if who:
                ax.text(
                    t + 0.47,
                    RANKS - 1 - w + 0.47,
                    f"r{who[0]}",
                    ha="center",
                    va="center",
                    color="white",
                    fontsize=9,
                )
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


def make(path: Path) -> None:
    panels = [
        ("TP", "1/4 of weights, all tokens\n2 all-reduces of activations/layer"),
        ("SP", "all weights, 1/4 of tokens\nK/V all-gathered"),
        ("TP+SP", "2 x 2 mesh: 1/2 weights,\n1/2 tokens"),
        ("TSP", "1/4 of weights AND 1/4 of tokens\nweights move, activations stay"),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(12, 3.6))
    for ax, (kind, subtitle) in zip(axes, panels, strict=True):
        draw(ax, kind, subtitle)
    fig.suptitle(
        "What each of four ranks keeps resident, per layer (color = owning rank; blank = "
        "kept by nobody: fetched by the rank that needs it, then dropped)",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    make(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/layouts.png"))
