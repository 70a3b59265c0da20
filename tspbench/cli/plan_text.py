"""A plan as a user reads it: the answers first (the fastest layouts that fit, the longest
sequence each layout fits, where TSP starts moving fewer bytes than TP), every rejected layout
after them, grouped by why; and the JSON of the same. ``plan-decode`` shares the ranking's
tail and the rejections."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tspbench.core.spec import Layout, Workload, switch_words
from tspbench.core.units import format_bytes

if TYPE_CHECKING:
    from tspbench.analytic.planner import PlanResult


class Rejected(Protocol):
    """A layout a planner could not rank (tspbench.analytic.planner's candidates)."""

    layout: Layout
    reason: str | None


def print_plan(result: PlanResult, workload: Workload, top: int, tuned: bool = False) -> None:
    """The ranking, the memory frontier and the crossover, each naming the run mode and the
    recomputation it holds for; then the rejected layouts (up to dozens of lines). Tuned, each
    ranked layout names the setting that won it."""
    setting = f"{workload.mode}, recompute {workload.recompute}"
    ranked_at = f"{workload.mode}, each layout at its best setting" if tuned else setting
    print(f"fastest layouts that fit ({ranked_at}, projected):")
    won = "  setting" if tuned else ""
    print(f"{'rank':>4}  {'layout':<28} {'tokens/s/GPU':>13} {'MFU':>6} {'peak/GPU':>10} {'step s':>8}{won}")
    for i, c in enumerate(result.ranked[:top], 1):
        p = c.prediction
        won = f"  {setting_text(c.workload)}" if tuned and c.workload else ""
        print(
            f"{i:>4}  {c.layout.describe():<28} {p.tokens_per_s_per_gpu:>13,.0f} {p.mfu:>6.1%} "
            f"{format_bytes(p.memory.peak_bytes):>10} {p.step_time_s:>8.3f}{won}"
        )
    print_left_out(len(result.ranked), top)
    print_frontier(result, setting, workload.batch)
    print(
        f"crossover ({setting}: tokens per micro-batch above which TSP moves fewer bytes than TP at "
        "the same degree):"
    )
    for d, tokens in result.crossover_tokens.items():
        print(f"  D={d}: {tokens:,.0f} tokens" if math.isfinite(tokens) else f"  D={d}: never")
    print_rejected(result.rejected, 28)


def setting_text(w: Workload) -> str:
    """'recompute none, megatron_sp, kv ulysses': the recomputation (training) and every switch
    away from its default, as a sweep's point labels name them."""
    words = [f"recompute {w.recompute}"] if w.mode == "train" else []
    return ", ".join(words + switch_words(vars(w))) or "defaults"


def print_frontier(result: PlanResult, setting: str, batch: int) -> None:
    """Per layout and degree the longest sequence that fits one replica; a layout that fits not
    even 1,024 tokens 'does not fit', and one that fits the model's max_seq_len says so (the
    search stops there: the model serves no more positions)."""
    cap = result.frontier_cap
    print(
        f"memory frontier ({setting}, micro-batch {batch}: longest sequence that fits one replica; "
        f"capped at the model's max_seq_len, {cap:,}):"
    )
    width = max((len(name) for name in result.frontier), default=0)
    for name, by_degree in result.frontier.items():
        cells = "  ".join(f"{d}: {_frontier_cell(s, cap)}" for d, s in by_degree.items())
        print(f"  {name:<{width}} {cells}")


def _frontier_cell(tokens: int, cap: int) -> str:
    if tokens == 0:
        return "does not fit"
    return f"{tokens:,} (max_seq_len)" if tokens >= cap else f"{tokens:,}"


def print_left_out(ranked: int, top: int) -> None:
    """Below a ranking of ``ranked`` layouts cut at ``top`` rows: that none fits, or how many it cut."""
    if not ranked:
        print("  no layout fits")
    elif ranked > top:
        print(f"  ... {ranked - top} more that fit (--top {ranked} lists them)")


def print_rejected(rejected: Sequence[Rejected], width: int) -> None:
    """Every rejected layout, grouped by the kind of reason ('out of memory', 'crosses nodes',
    'indivisible'), one line each with the rest of its reason."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for c in rejected:
        kind, _, detail = (c.reason or "").partition(": ")
        groups.setdefault(kind, []).append((c.layout.describe(), detail))
    print(f"rejected: {len(rejected)}" + (", by reason:" if groups else ""))
    for kind, rows in groups.items():
        hint = "; --allow-cross-node ranks them" if kind == "crosses nodes" else ""
        print(f"  {kind} ({len(rows)}{hint}):")
        for layout, detail in rows:
            print(f"    {layout:<{width}} {detail}")


def ranked_json(
    ranked: Sequence[Any], record: Callable[[Any], dict], rejected: Sequence[Rejected]
) -> dict[str, list[dict]]:
    """A plan's ranking (each row its layout and ``record`` of its prediction) and its rejections."""
    return {
        "ranked": [{"layout": c.layout.to_dict(), **setting(c), **record(c.prediction)} for c in ranked],
        "rejected": [{"layout": c.layout.to_dict(), **setting(c), "reason": c.reason} for c in rejected],
    }


def setting(candidate: Any) -> dict[str, object]:
    """The setting a plan priced a layout at (a tuned plan's winner), as the records name it."""
    w = getattr(candidate, "workload", None)
    if w is None:
        return {}
    keys = ("recompute", "megatron_sp", "kv_exchange", "mlp_exchange", "overlap")
    return {"setting": {k: getattr(w, k) for k in keys}}


def plan_json(result: PlanResult) -> dict[str, object]:
    """The whole plan; a frontier of 0 fits not even 1,024 tokens, one of ``frontier_cap`` (the
    model's max_seq_len) fits at least that."""
    return {
        **ranked_json(result.ranked, lambda p: p.to_json(), result.rejected),
        "crossover_tokens": {str(d): t for d, t in result.crossover_tokens.items()},
        "frontier": {k: {str(d): s for d, s in v.items()} for k, v in result.frontier.items()},
        "frontier_cap": result.frontier_cap,
    }
