"""The numbers docs/time-model.md quotes from the time models' checks at paper scale: the timeline
against the analytic model on the fake world's points, against torch's RuntimeEstimator, and how
much of TSP's weight traffic hides under compute.

Each function takes the results folder and returns a group of named values (tools.docs_numbers
.stored says what a value may be); the wording around them is in docs/templates/. Seconds come
from the price list (tspbench.analytic.prices), as the time models' do.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from tools.docs_numbers.stored import Part, completed, named, stored_json
from tspbench.analytic.prices import kernel_overhead_seconds
from tspbench.analytic.profile_choice import named_profile, record_profile
from tspbench.core.spec import ModelConfig, Workload
from tspbench.core.trace import ATTENTION, COMPUTE, ELEMENTWISE, GEMM, load_traces
from tspbench.costs.kernels import step_kernels
from tspbench.report import tables
from tspbench.report.formats import KINDS, LABEL, MIB, Values, pct, tokens

FAR = 0.10  # timeline / model - 1 beyond which a paper-scale point is explained by name
RECOMPUTATION = {
    "none": "no recomputation",
    "selective": "selective recomputation",
    "full": "full recomputation",
}


# ----------------------------------------------------------------------------- paper scale


@cache
def paper_scale_parts(results: Path) -> pd.DataFrame:
    """Each fake-world point's gap (timeline / model - 1) split into what each compute kind adds
    (timeline seconds less the model's, over the model's step) and the rest: communication,
    waits on peers, compute slowed while a collective shares the device."""
    frames = [
        named(completed(results, experiment)).assign(experiment=experiment.removesuffix("_fake"))
        for experiment in ("paper_throughput_fake", "tsp_vs_fsdp_sp_fake", "paper_scaling_fake")
    ]
    df = pd.concat(frames, ignore_index=True)
    step = df["predicted_step_time_s"]
    df = df.assign(gap=df["timeline_step_time_s"] / step - 1)
    for kind in KINDS:
        df[kind] = (df[f"timeline_{kind}_s"] - df[f"predicted_{kind}_s"]) / step
    return df.assign(rest=df["gap"] - df[list(KINDS)].sum(axis=1))


def kernels(results: Path, experiment: str, row: pd.Series) -> int:
    """Kernels (GEMM, attention, element-wise) of a stored fake-world point's traced rank."""
    ev = load_traces(results / experiment / row["run_id"] / "trace.npz")[0][0].events
    return int(((ev["kind"] == COMPUTE) & np.isin(ev["cls"], (GEMM, ATTENTION, ELEMENTWISE))).sum())


def counted_kernels(row: pd.Series) -> int:
    """Kernels the closed form counts for a stored point's step: the model's own
    (tspbench.costs.kernels), whatever the strategy's code adds left out."""
    workload = Workload(
        ModelConfig.preset(row["model"]), int(row["batch"]), int(row["seq_len"]), row["mode"],
        row["recompute"], row["dtype"], row["device"],
    )  # fmt: skip
    k = step_kernels(workload)
    return k.gemm + k.attention + k.elementwise


def largest_gaps(parts: pd.DataFrame, n: int = 3) -> str:
    """The ``n`` points where the timeline and the model differ most, each with what the gap is
    made of, so the docs name the points a reader would look at first."""
    top = (
        parts.reindex(parts["gap"].abs().sort_values(ascending=False).index).drop_duplicates("run_id").head(n)
    )
    return "; ".join(
        f"{LABEL[r['strategy']]} at D = {r['world_size']}, {r['seq_len'] // 1024}K, "
        f"{RECOMPUTATION[r['recompute']]} {pct(r['gap'])} (element-wise {pct(r['elementwise'])}, "
        f"communication and waits {pct(r['rest'])})"
        for _, r in top.iterrows()
    )


def paper_scale(results: Path) -> Values:
    """The timeline against the analytic model on the paper-scale fake-world points."""
    parts = paper_scale_parts(results)
    far = parts[parts["gap"].abs() > FAR]
    tsp8 = completed(results, "paper_throughput_fake", strategy="tsp", tsp=8, seq_len=16384).iloc[0]
    mi300x = record_profile(tsp8)  # the profile the paper-scale points are replayed and predicted on
    fsdp8 = completed(results, "paper_throughput_fake", strategy="fsdp_sp", sp=8, seq_len=16384).iloc[0]
    n_tsp = kernels(results, "paper_throughput_fake", tsp8)
    launch = kernel_overhead_seconds(mi300x, n_tsp)
    ratio = (parts["timeline_elementwise_s"] / parts["predicted_elementwise_s"]).describe()
    return {
        "table": tables.paper_scale_table(parts, FAR),
        "far": tables.far_points_table(far) if len(far) else Part("no_far_points"),
        "kernels_part": pct(parts[["gemm", "attention"]].abs().max().max(), False),
        "op_overhead_us": f"{mi300x.op_overhead_us:g}",
        "ratio_min": f"{ratio['min']:.2f}",
        "ratio_max": f"{ratio['max']:.2f}",
        "ratio_median": f"{ratio['50%']:.2f}",
        "tsp_kernels": f"{n_tsp:,}",
        "model_kernels": f"{counted_kernels(tsp8):,}",
        "tsp_recompute": RECOMPUTATION[tsp8["recompute"]],
        "launch_ms": f"{launch * 1e3:.0f}",
        "launch_share": pct(launch / tsp8["timeline_step_time_s"], False),
        "fsdp_kernels": f"{kernels(results, 'paper_throughput_fake', fsdp8):,}",
        "largest": largest_gaps(parts),
    }


# ----------------------------------------------------------------------------- torch, overlap


def kind_of(source: str) -> str:
    """A profile figure's provenance up to its detail: 'carried from the H200 measurement'."""
    return re.split(r" \(|:", source)[0]


def torch_estimator(results: Path) -> Values:
    """The timeline against torch's RuntimeEstimator on the same fake step."""
    d = stored_json(results, "timeline_check/torch_estimator.json")
    device = d["largest_gaps_s"]["device"]["torch"]
    rest = d["torch_s"]["elementwise"] - device
    hw = named_profile(d["hardware"])
    gemm_key = "step_gemm_tflops" if hw.step_gemm_tflops else "gemm_tflops"
    return {
        "profile": d["hardware"],
        "gemm_tflops": f"{hw.step_gemm_rate:.0f}",
        "gemm_source": kind_of(hw.source_of(gemm_key)),
        "attention_source": kind_of(hw.source_of("attention_by_size")),
        "table": tables.torch_estimator_table(d),
        "device_share": pct(device / d["torch_s"]["elementwise"], False),
        "elementwise_gap": pct(abs(d["timeline_s"]["elementwise"] / rest - 1), False),
    }


def overlap(results: Path) -> Values:
    """How much of TSP's weight traffic hides under compute at D = 8, by length, and what the
    prefetch of each pass's first broadcast changed (results/timeline_check/tsp_prefetch)."""
    df = completed(results, "tsp_vs_fsdp_sp_fake", strategy="tsp", tsp=8).sort_values(
        ["recompute", "seq_len"]
    )
    none = df[df["recompute"] == "none"].set_index("seq_len")
    weights = none["timeline_weights_hidden_fraction"]
    below = [int(s) for s, f in weights.items() if f < 0.5]
    casts, ring = df["timeline_hidden_fraction_broadcast"], none["timeline_hidden_fraction_send_recv"]
    ahead = none.index[ring > none["timeline_hidden_fraction_broadcast"]]
    shortest, longest = none.index.min(), none.index.max()
    before, after = (
        stored_json(results, f"timeline_check/tsp_prefetch/{s}/result.json") for s in ("before", "after")
    )
    exposed = [r["timeline_exposed_broadcast_s"] * 1e3 for r in (before, after)]
    step = [r["timeline_step_time_s"] for r in (before, after)]
    all_ring = df["timeline_hidden_fraction_send_recv"]
    return {
        "table": tables.overlap_table(df),
        "half_from": tokens(int(min(weights[weights >= 0.5].index))),
        "edge": tokens(max(below)) if below else Part("no_length"),
        "casts": f"{casts.min():.0%}-{casts.max():.0%}",
        "ring": f"{all_ring.min():.0%}-{all_ring.max():.0%}",
        "ring_shortest": f"{ring.loc[shortest]:.0%}",
        "shortest": tokens(int(shortest)),
        "ring_longest": f"{ring.loc[longest]:.0%}",
        "longest": tokens(int(longest)),
        "ahead": Part("ring_ahead", {"from": tokens(int(ahead.min()))}) if len(ahead) else None,
        "prefetch_tokens": tokens(int(after["seq_len"])),
        "prefetch_recompute": after["recompute"],
        "prefetch_ranks": str(len(after["fake_ranks"])),
        "exposed_before": f"{exposed[0]:.2f}",
        "exposed_after": f"{exposed[1]:.2f}",
        "step_before": f"{step[0]:.3f}",
        "step_after": f"{step[1]:.3f}",
        "step_change": pct(step[1] / step[0] - 1),
        "held_mib": f"{(after['peak_memory_bytes'] - before['peak_memory_bytes']) / MIB:.0f}",
        "exposed_send_recv": f"{after['timeline_exposed_send_recv_s']:.2f}",
    }
