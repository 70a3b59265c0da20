"""Where the docs' projected speed verdicts flip: break-even values of the MI300X profile's
assumed figures (tspbench.analytic.sensitivity, as `tspbench sensitivity` prints them), so a
sentence that says what a verdict rests on quotes numbers the code gives, never typed ones.

Each verdict is the analytic model's on the paper's 7B (bf16, batch 1); the comparisons are the
ones the docs name: TSP 8 against TP 8 and FSDP+SP 8 on one node, TSP against the fastest TP+SP
of its D at 16K (the ratio that falls with D), and TSP 8 x 128 against TP+SP 2x4 x 128 in the
forward on 1,024 GPUs. The fastest TP+SP of each D is read from the stored records.
"""

from __future__ import annotations

from pathlib import Path

from tools.docs_numbers.stored import at_defaults
from tspbench.report.formats import Values

PROFILE = "mi300x"
RING = "ring_shift_gbs"


def hinges(results: Path) -> Values:
    """The ring shift's break-evens and TSP's ratio by D with every figure moved alone."""
    from tspbench.analytic import sensitivity as sens
    from tspbench.analytic.profile_choice import named_profile
    from tspbench.cli.sensitivity import layout_text
    from tspbench.core.spec import ModelConfig, Workload

    hw = named_profile(PROFILE)
    ring = sens.figure_named(hw, RING)

    def work(seq: int, mode: str = "train") -> Workload:
        recompute = "selective" if mode == "train" else "none"
        return Workload(ModelConfig.preset("7b"), 1, seq, mode, recompute, "bfloat16", "cuda")

    def even(a: str, b: str, w: Workload) -> str:
        (row,) = sens.break_evens(layout_text(a), layout_text(b), w, hw, [ring])
        value = row.value if row.value is not None else row.beyond
        where = "inside" if row.flips else "past"
        span = f"{ring.low:g}-{ring.high:g} GB/s"
        return (
            f"none within 20x its {span} range"
            if value is None
            else f"{value:,.3g} GB/s ({where} its {span} range)"
        )

    rivals = fastest_tp_sp(results)
    w16, w128 = work(16384), work(131072)
    by_d = {d: [sens.speed_ratio(layout_text(f"tsp:{d}"), layout_text(r), w16, h)
                for h in (hw, ring.at(hw, ring.high))] for d, r in rivals.items()}  # fmt: skip
    return {
        "ring": f"{ring.value:g}",
        "fsdp_ratio": f"{sens.speed_ratio(layout_text('tsp:8'), layout_text('fsdp_sp:8'), w128, hw):.3f}",
        "ring_high": f"{ring.high:g}",
        "ring_provenance": ring.provenance,
        "tp_128k": even("tsp:8", "tp:8", work(131072)),
        "tp_16k": even("tsp:8", "tp:8", w16),
        "fsdp_128k": any_flip(hw, "tsp:8", "fsdp_sp:8", work(131072)),
        "scale_128k": even("tsp:8,dp128", "tp_sp:2x4,dp128", work(131072, "infer")),
        "by_d": ", ".join(f"{v[0]:.2f}" for v in by_d.values()),
        "by_d_fast_ring": ", ".join(f"{v[1]:.2f}" for v in by_d.values()),
        "d_list": ", ".join(str(d) for d in by_d),
        "tp_16k_ratio": f"{sens.speed_ratio(layout_text('tsp:8'), layout_text('tp:8'), w16, hw):.2f}",
        "ahead_128k": ahead_at_128k(results),
        "turns": turns_with_d(hw, rivals, w16),
    }


def fastest_tp_sp(results: Path) -> dict[int, str]:
    """The fastest TP+SP layout of each D at 16K in paper_throughput, as 'tp_sp:TxS'."""
    df = at_defaults(results, "paper_throughput", seq_len=16384, strategy="tp_sp")
    best = df.loc[df.groupby("world_size")["tokens_per_s_per_gpu"].idxmax()]
    return {int(r.world_size): f"tp_sp:{int(r.tp)}x{int(r.sp)}" for r in best.itertuples()}


def ahead_at_128k(results: Path) -> str:
    """TSP 8's lead over each TP+SP of D = 8 that fits at 128K (stored records): '+8%, +9%'."""
    df = at_defaults(results, "paper_throughput", seq_len=131072, world_size=8)
    tsp = float(df.loc[df["strategy"] == "tsp", "tokens_per_s_per_gpu"].iloc[0])
    rivals = df[(df["strategy"] == "tp_sp") & (df["tp"] > 1) & (df["sp"] > 1)].sort_values(
        "tp", ascending=False
    )
    return ", ".join(
        f"TP+SP {int(r.tp)}x{int(r.sp)} {tsp / r.tokens_per_s_per_gpu - 1:+.0%}" for r in rivals.itertuples()
    )


def any_flip(hw: object, a: str, b: str, w: object) -> str:
    """Which figures, moved alone over their ranges, change the faster of ``a`` and ``b``, with
    the break-even values; or that none does, and how close ``a`` comes."""
    from tspbench.analytic import sensitivity as sens
    from tspbench.cli.sensitivity import layout_text

    return flip_text(sens.break_evens(layout_text(a), layout_text(b), w, hw))


def flip_text(rows: list) -> str:
    """The break-evens of every figure (``sensitivity.break_evens``) as the docs quote them."""
    flips = [
        f"{r.figure.key} at {r.value:,.3g} {r.figure.unit}".rstrip() for r in rows if r.value is not None
    ]
    if flips:
        return "it flips with " + ", ".join(flips)
    ratios = [x for r in rows for x in (r.ratio, r.ratio_low, r.ratio_high)]
    best = max(ratios) if rows[0].ratio < 1 else min(ratios)
    return f"no figure moved alone over its range flips it, at most {best:.3f}x"


def turns_with_d(hw: object, rivals: dict[int, str], w: object) -> str:
    """Whether any one figure, moved alone to either end of its range, makes TSP's ratio to the
    fastest TP+SP at the largest D at least its ratio at the smallest (the paper's trend)."""
    from tspbench.analytic import sensitivity as sens
    from tspbench.cli.sensitivity import layout_text

    small, large = min(rivals), max(rivals)
    found = []
    for f in sens.figures(hw):
        for v in (f.low, f.high):
            moved = f.at(hw, v)
            r = [
                sens.speed_ratio(layout_text(f"tsp:{d}"), layout_text(rivals[d]), w, moved)
                for d in (small, large)
            ]
            if r[1] >= r[0] and f.key not in found:
                found.append(f.key)
    if not found:
        return "none turns it around"
    return "it turns around with " + ", ".join(found) + " moved alone over its range"
