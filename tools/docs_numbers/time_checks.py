"""The numbers docs/time-model.md and the README quote from the time models' checks.

Each function takes the results folder and returns a group of named values (tools.docs_numbers
.stored says what a value may be); the wording around them is in docs/templates/. The checks
are issue #21's: the op-level check (results/timeline_check/ops.json) and the step-level ones
(results/cpu_reference, cpu_out_of_sample); tools.docs_numbers.paper_checks has those at paper
scale.
"""

from __future__ import annotations

import statistics
from functools import cache
from pathlib import Path

import pandas as pd

from tools.docs_numbers.paper_checks import FAR, paper_scale_parts
from tools.docs_numbers.stored import Part, completed, named, span, stored_json
from tspbench.analytic.profile_choice import named_profile
from tspbench.report import tables
from tspbench.report.formats import KINDS, Values, pct, tokens
from tspbench.report.tables import KIND_NAMES, oncore_worst


def by_kind(values: dict[str, float], signed: bool = False) -> Values:
    """One share per compute kind, keyed as the templates quote them (``{{group.gemm}}`` ...)."""
    return {k: pct(values[k], signed) for k in KINDS}


# ----------------------------------------------------------------------------- op level


def launch_spread(rows: list[dict]) -> dict[str, float]:
    """By kind, the most one layout's profiled launches differed (empty where a row kept one)."""
    if not all("repeat_spread" in r for r in rows):
        return {}
    return {k: max(r["repeat_spread"][k] for r in rows) for k in KINDS}


def oncore_split(rows: list[dict], lead: str) -> Part | None:
    """What the on-core split says, by kind: the replay's price of an op on a core against its
    measured on-core time (median over layouts), and the wall over on-core measured and replayed."""
    if not all("oncore_s" in r for r in rows):
        return None
    values: Values = {"lead": lead}
    for k in KINDS:
        values[f"{k}_core"] = pct(
            statistics.median(r["replayed_alone_s"][k] / r["oncore_s"][k] - 1 for r in rows)
        )
        values[f"{k}_measured"] = span([r["clocked_wall_s"][k] / r["oncore_s"][k] for r in rows], ".2f")
        values[f"{k}_replayed"] = span([r["replayed_s"][k] / r["replayed_alone_s"][k] for r in rows], ".2f")
    return Part("oncore_split", values)


def ops_notes(rows: list[dict]) -> Part | None:
    """DP's row is calibrate's own measurement repeated; where the replay's compute is high, its
    ranks sleep less than the measured ones."""
    named_rows = {r["layout"].split("(")[0]: r for r in rows}
    dp = named_rows["dp"]
    high = [r for r in rows if "schedule" in r and max(r["error"]["gemm"], r["error"]["attention"]) > 0.10]
    if not high:
        return oncore_split(rows, "")
    short = sorted(
        1 - r["schedule"]["replayed"]["blocked_s"] / r["schedule"]["measured"]["blocked_s"] for r in high
    )
    return Part(
        "ops_notes",
        {
            "runs": " and ".join(f"{p['elementwise']:.2f}" for p in dp["profiled_runs_s"]),
            "replayed": f"{dp['replayed_s']['elementwise']:.2f}",
            "names": ", ".join(r["layout"].split("(")[0] for r in high),
            "short": span(short, ".0%"),
            "split": oncore_split(rows, " "),
        },
    )


def timer_gap(rows: list[dict]) -> Part | None:
    """How far torch.profiler's self time and OpClock's wall clock of the same ops, in the same
    launches, are apart by kind (largest over layouts): what the op-level check can resolve here."""
    if not all("clocked_wall_s" in r for r in rows):
        return None
    gap = {k: max(abs(r["clocked_wall_s"][k] / r["profiled_s"][k] - 1) for r in rows) for k in KINDS}
    spread = launch_spread(rows)
    return Part(
        "timer_gap", {**by_kind(gap), "launches": Part("launch_pairs", by_kind(spread)) if spread else None}
    )


def op_check(results: Path) -> Values:
    """The op-level check: replayed compute by kind against torch.profiler, its on-core split and
    where each rank's step went."""
    rows = stored_json(results, "timeline_check/ops.json")["rows"]
    spread = launch_spread(rows)
    worst = {k: max(abs(r["error"][k]) for r in rows) for k in KINDS}
    return {
        "table": tables.kinds_table(rows),
        **by_kind(worst),
        "launches": Part("op_launches", {"runs": len(rows[0]["profiled_runs_s"]), **by_kind(spread)})
        if spread
        else None,
        "oncore": Part("op_oncore", {"table": tables.oncore_table(rows)})
        if all("oncore_s" in r for r in rows)
        else None,
        "schedule": Part("op_schedule", {"table": tables.schedule_table(rows)})
        if all("schedule" in r for r in rows)
        else None,
        "notes": ops_notes(rows),
        "timer_gap": timer_gap(rows),
    }


# ----------------------------------------------------------------------------- step level


@cache
def step_errors(results: Path, experiment: str) -> pd.DataFrame:
    """Completed measured points with the timeline's and the analytic model's relative error."""
    df = named(completed(results, experiment))
    return df.assign(
        timeline=df["timeline_step_time_s"] / df["step_time_s"] - 1,
        analytic=df["predicted_step_time_s"] / df["step_time_s"] - 1,
    )


def ordered_pairs(df: pd.DataFrame, column: str) -> tuple[int, int]:
    """(pairs ordered right, pairs) among points of one length measured more than 15% apart."""
    right = total = 0
    for _, group in df.groupby("seq_len"):
        rows = list(group.itertuples())
        for i, a in enumerate(rows):
            for b in rows[i + 1 :]:
                if max(a.step_time_s, b.step_time_s) / min(a.step_time_s, b.step_time_s) <= 1.15:
                    continue
                total += 1
                right += (getattr(a, column) < getattr(b, column)) == (a.step_time_s < b.step_time_s)
    return right, total


def step_summary(df: pd.DataFrame, which: str, limit: float) -> Part:
    """One time model's sentence on a step-level study (``which``: its error column): median and
    worst error, the points within ``limit``, and the pairs of points it orders right."""
    errors = df[which].abs()
    right, total = ordered_pairs(
        df, "timeline_step_time_s" if which == "timeline" else "predicted_step_time_s"
    )
    return Part(
        "step_summary",
        {
            "median": f"{statistics.median(errors):.1%}",
            "worst": pct(df[which].loc[errors.idxmax()]),
            "within": int((errors <= limit).sum()),
            "points": len(df),
            "limit": f"{limit:.0%}",
            "right": right,
            "pairs": total,
        },
    )


def steps(results: Path) -> Values:
    """Both CPU studies against the two time models, and the timeline's worst point."""
    ref, oos = step_errors(results, "cpu_reference"), step_errors(results, "cpu_out_of_sample")
    table = {"ref_points": len(ref), "oos_points": len(oos)}
    for key, df, limit in (("ref", ref, 0.20), ("oos", oos, 0.25)):
        table |= {f"{key}_{m}": step_summary(df, m, limit) for m in ("timeline", "analytic")}
    both = pd.concat([ref, oos], ignore_index=True)
    worst = both.loc[both["timeline"].abs().idxmax()]
    return {
        "table": Part("step_table", table),
        "out_of_sample_points": str(len(oos)),
        "worst_layout": worst["layout"],
        "worst_tokens": tokens(int(worst["seq_len"])),
        "worst_measured": f"{worst['step_time_s']:.3f}",
        "worst_replayed": f"{worst['timeline_step_time_s']:.3f}",
        "analytic_median": pct(both["analytic"].median()),
        "timeline_median": pct(both["timeline"].median()),
    }


def cpu_profile(results: Path) -> Values:
    """The CPU profile's figures the docs quote (GB/s, GFLOP/s)."""
    cpu = named_profile("cpu")
    return {
        "step_gemm_gflops": f"{cpu.step_gemm_rate * 1e3:.1f}",
        "gemm_gflops": f"{cpu.gemm_tflops * 1e3:.1f}",
        "memory_gbs": f"{cpu.hbm_bandwidth_gbs:.0f}",
        "overlap_efficiency": f"{cpu.overlap_efficiency:.0%}",  # a ring shift hidden under GEMMs
        # ops whose work torch.profiler books to an op they call, which the trace never records:
        # nll_loss_backward zeroes its output in a fill_ (tests/calibrate/test_opclock.py), rsub
        # subtracts in a sub
        **{op: f"{cpu.elementwise_by_op[op]:,.0f}" for op in ("nll_loss_backward", "rsub")},
    }


def host_drift(results: Path) -> Values:
    """How much slower or faster this run of the CPU studies was than the one before it, for the
    strategies whose code did not change between them (results/timeline_check/host_drift.json)."""
    d = stored_json(results, "timeline_check/host_drift.json")
    previous = d["previous_profile_errors"]
    return {
        "strategies": " and ".join(x.upper() for x in d["strategies"]),
        "ratio": f"{d['median_ratio']:.2f}",
        "points": str(d["points"]),
        "timeline": pct(previous["timeline"], False),
        "analytic": pct(previous["analytic"], False),
        "timeline_signed": pct(previous["timeline_signed"]),
        "analytic_signed": pct(previous["analytic_signed"]),
    }


def repeat_spread(results: Path) -> Values:
    """How far apart two measurements of the same point are on this host: TSP 4 in cpu_reference
    and in tsp_vs_fsdp_sp_cpu (the same settings, measured in separate runs)."""
    keys = ["strategy", "tsp", "seq_len"]
    a = completed(results, "cpu_reference", strategy="tsp", tsp=4).set_index(keys)["step_time_s"]
    b = completed(results, "tsp_vs_fsdp_sp_cpu", strategy="tsp", tsp=4).set_index(keys)["step_time_s"]
    ratio = (b / a).dropna()
    slower = ratio.where(ratio >= 1, 1 / ratio) - 1
    return {"points": str(len(ratio)), "low": f"{slower.min():.0%}", "high": f"{slower.max():.0%}"}


def split(results: Path) -> Values:
    """Where the measured CPU points' steps went (busy, blocked) against the replay's split."""
    df = pd.concat(
        [step_errors(results, "cpu_reference"), step_errors(results, "cpu_out_of_sample")], ignore_index=True
    )
    df = df.dropna(subset=["cpu_busy_s", "timeline_busy_s"]).sort_values(["world_size", "seq_len"])
    busy = (df["timeline_busy_s"] / df["cpu_busy_s"] - 1).median()
    blocked = (df["timeline_blocked_s"] / df["cpu_blocked_s"] - 1).median()
    multi = df[df["world_size"] > 1]
    return {
        "table": tables.step_split_table(df),
        "sentence": Part(
            "split_sentence",
            {
                "points": str(len(df)),
                "busy": pct(busy),
                "blocked": pct(blocked),
                "larger": Part("split_blocked" if abs(blocked) > abs(busy) else "split_busy"),
            },
        ),
        "gloo_share": f"{(multi['cpu_comm_threads_s'] / multi['step_time_s']).median():.0%}",
    }


def timeline_checks(results: Path) -> Values:
    """Issue #21's four checks of the timeline: what each found and whether it holds."""
    rows = stored_json(results, "timeline_check/ops.json")["rows"]
    worst = {k: max(abs(r["error"][k]) for r in rows) for k in KINDS}
    spread = launch_spread(rows)
    ref, oos = step_errors(results, "cpu_reference"), step_errors(results, "cpu_out_of_sample")
    right, total = ordered_pairs(ref, "timeline_step_time_s")
    within = int((ref["timeline"].abs() <= 0.20).sum())
    ref_holds = within == len(ref) and ref["timeline"].abs().median() <= ref["analytic"].abs().median()
    oos_within = int((oos["timeline"].abs() <= 0.25).sum())
    parts = paper_scale_parts(results)
    far = int((parts["gap"].abs() > FAR).sum())
    top = max(spread, key=spread.__getitem__) if spread else None
    return {
        **by_kind(worst),
        "spread_note": Part("spread_note", {"spread": pct(spread[top], False), "kind": KIND_NAMES[top]})
        if top
        else None,
        "oncore_note": Part("oncore_note", by_kind(oncore_worst(rows)))
        if all("oncore_s" in r for r in rows)
        else None,
        "op_holds": holds(max(worst.values()) <= 0.15),
        "within": str(within),
        "points": str(len(ref)),
        "median": f"{ref['timeline'].abs().median():.1%}",
        "analytic_median": f"{ref['analytic'].abs().median():.1%}",
        "pairs": f"{right} of {total}",
        "step_holds": holds(ref_holds and right == total),
        "oos": f"{oos_within} of {len(oos)}",
        "oos_holds": holds(oos_within == len(oos)),
        "paper_points": str(len(parts)),
        "far": str(far),
        "largest": pct(parts.loc[parts["gap"].abs().idxmax()]["gap"]),
        "paper_holds": holds(far == 0),
    }


def holds(ok: bool) -> str:
    return "yes" if ok else "**no**"
