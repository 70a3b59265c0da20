"""The numbers the README and docs/ quote from the stored studies: memory measured and in the fake
world, projected throughput, the published-run backtest, TSP against FSDP+SP, decode, the fake
world's own cost, and how long this host takes to set up and test.

Each function takes the results folder and returns a group of named values (tools.docs_numbers
.stored says what a value may be); the wording around them is in docs/templates/.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd

from tools.docs_numbers.stored import (
    Part,
    at_default_switches,
    at_defaults,
    completed,
    layout_name,
    named,
    records,
    stored_json,
)
from tspbench.core.spec import ModelConfig
from tspbench.costs.flops import attention_flops_per_layer, forward_flops_per_sequence
from tspbench.report import tables
from tspbench.report.formats import GIB, MIB, Values, pct, tokens
from tspbench.report.provenance import wall_time

MI300X_USABLE_GIB = 192 * 0.95


def minutes(seconds: float) -> str:
    """'1 min 30 s', '39 s': a host timing as a reader compares it with their own."""
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60} s" if whole >= 60 else f"{whole} s"


def timings(results: Path) -> Values:
    """tools/time_fresh_clone.py's record of this host: setup, make demo, make test, make check."""
    path = results / "host_timings.json"
    if not path.is_file():
        return dict.fromkeys(("setup", "demo", "test", "check"), Part("not_measured"))
    t = stored_json(results, "host_timings.json")
    return {
        "setup": minutes(t["setup_s"]),
        "demo": minutes(t["make_demo_s"]),
        "test": f"{minutes(t['make_test_s'])} ({t['tests']:,} tests)",
        "check": f"{minutes(t['make_check_s'])} ({t['check_tests']:,} tests)",
    }


def cpu_memory(results: Path) -> Values:
    """Measured peak memory per rank at 4K and 8K tokens (results/cpu_reference) and the model's error."""
    df = records(results, "cpu_reference")
    at4k = df[df["seq_len"] == 4096]
    fits = named(at4k[at4k["status"] == "completed"]).sort_values("peak_memory_bytes", ascending=False)
    oom = ", ".join(sorted(at4k[at4k["status"] == "oom"].apply(layout_name, axis=1)))
    at8k = named(df[(df["seq_len"] == 8192) & (df["status"] == "completed")])
    errors = completed(results, "cpu_reference")["predicted_memory_error"].abs()
    return {
        "at_4k": ", ".join(f"{r.layout} {r.peak_memory_bytes / MIB:.1f}" for r in fits.itertuples()),
        "oom_4k": oom or "none",
        "fit_8k": ", ".join(at8k["layout"]),
        "fit_8k_mib": ", ".join(f"{v / MIB:.1f}" for v in at8k["peak_memory_bytes"]),
        "worst": f"{errors.max():.1%}",
        "median": f"{errors.median():.1%}",
    }


def memory_128k(results: Path) -> Values:
    """The paper's memory study in the fake world: 128K tables and the model's error over all points."""
    at128k = named(completed(results, "paper_memory_fake", seq_len=131072))
    at128k = at128k.assign(err=at128k["predicted_memory_error"])
    df = completed(results, "paper_memory_fake")
    errors = df["predicted_memory_error"].abs()
    worst = df.loc[errors.idxmax()]
    none = at128k[at128k["recompute"] == "none"]
    return {
        "short": tables.memory_error_table(at128k),
        "table": tables.memory_pair_table(at128k),
        "points": str(len(df)),
        "worst": f"{errors.max():.1%}",
        "median": f"{errors.median():.2%}",
        "worst_layout": layout_name(worst),
        "worst_recompute": worst["recompute"],
        "worst_tokens": tokens(int(worst["seq_len"])),
        "fitting": ", ".join(none[none["peak_memory_bytes"] / GIB <= MI300X_USABLE_GIB]["layout"]),
    }


def projected(results: Path) -> Values:
    """Projected throughput at 128K: one node training, 1,024 GPUs forward (the analytic model)."""
    df = named(at_defaults(results, "paper_throughput", seq_len=131072))
    node = df[df["world_size"] == 8]
    scale = named(at_defaults(results, "paper_scaling", world_size=1024))  # the paper's settings
    top = scale[scale["strategy"] == "tsp"].iloc[0]
    ranked = df.sort_values("tokens_per_s_per_gpu", ascending=False)
    micro = named(at_default_switches(results, "paper_microbatch", seq_len=16384))  # the paper's points
    lead = micro.loc[micro.groupby("batch")["tokens_per_s_per_gpu"].idxmax()]
    return {
        "tsp": f"{node[node['strategy'] == 'tsp']['tokens_per_s_per_gpu'].iloc[0]:,.0f}",
        "others": ", ".join(
            f"{r.layout} {r.tokens_per_s_per_gpu:,.0f}" for r in node[node["strategy"] != "tsp"].itertuples()
        ),
        "scale_tsp": f"{top['tokens_per_s_per_gpu']:,.0f}",
        "scale_mfu": f"{top['mfu']:.1%}",
        "scale_others": ", ".join(
            f"{r.layout} x {int(r.dp)} {r.tokens_per_s_per_gpu:,.0f}"
            for r in scale[scale["strategy"] != "tsp"].itertuples()
        ),
        "ranked": ", ".join(f"{r.layout} {r.tokens_per_s_per_gpu:,.0f}" for r in ranked.itertuples()),
        "microbatch_leaders": ", ".join(f"{int(r.batch)}: {r.layout}" for r in lead.itertuples()),
    }


def backtest(results: Path) -> Values:
    """The analytic model against published runs (results/published/backtest.csv)."""
    df = pd.read_csv(results / "published" / "backtest.csv")
    test = df[(df["role"] == "test") & df["calibrated_error"].notna()]
    fitted = df[(df["role"] == "calibration") & df["calibrated_error"].notna()]
    return {
        "table": tables.backtest_table(df),
        "count": str(int(df["assumed_error"].notna().sum())),
        "assumed": pct(df["assumed_error"].dropna().abs().median(), False),
        "test_median": f"{test['calibrated_error'].abs().median():.1%}",
        "tests": str(len(test)),
        "fitted": str(len(fitted)),
        "fitted_median": f"{fitted['calibrated_error'].abs().median():.1%}",
        "listed": str(int((~df["predicted"]).sum())),
    }


def tsp_fsdp(results: Path) -> Values:
    """TSP against FSDP+SP: projected at D = 8 (MI300X) and measured on 4 CPU ranks."""
    df = named(completed(results, "tsp_vs_fsdp_sp"))
    g = df[(df["world_size"] == 8) & (df["seq_len"] == 131072) & (df["recompute"] == "none")]
    t, f = g[g["strategy"] == "tsp"].iloc[0], g[g["strategy"] == "fsdp_sp"].iloc[0]
    cpu = completed(results, "tsp_vs_fsdp_sp_cpu")
    ct, cf = (cpu[cpu["strategy"] == s].set_index("seq_len") for s in ("tsp", "fsdp_sp"))
    memory = cf["peak_memory_bytes"] / ct["peak_memory_bytes"]
    fewer = 1 - cf["comm_bytes_per_step"] / ct["comm_bytes_per_step"]
    slower = cf["step_time_s"] / ct["step_time_s"]
    return {
        "table": tables.tsp_fsdp_table(df),
        "tsp_gib": f"{t['peak_memory_bytes'] / GIB:.1f}",
        "fsdp_gib": f"{f['peak_memory_bytes'] / GIB:.1f}",
        "tsp_tput": f"{t['tokens_per_s_per_gpu']:,.0f}",
        "fsdp_tput": f"{f['tokens_per_s_per_gpu']:,.0f}",
        "cpu_memory": f"{memory.min():.1f}-{memory.max():.1f}",
        "cpu_fewer_bytes": f"{fewer.min():.0%}-{fewer.max():.0%}",
        "cpu_step": f"{slower.min():.2f}-{slower.max():.2f}",
    }


def decode(results: Path) -> Values:
    """Decode: projected TPOT (MI300X, H100), TSP's break-even batch, measured TPOT on CPU."""
    tsp = completed(results, "paper_decode", strategy="tsp")["break_even_batch"].dropna()
    cpu = named(completed(results, "cpu_decode"))
    error = cpu["predicted_tpot_p50_s_error"].dropna()
    return {
        "projected_table": tables.decode_projected_table(
            named(records(results, "paper_decode")), named(records(results, "paper_decode_h100"))
        ),
        "notes": Part("decode_tsp", {"batch": f"{int(tsp.iloc[0]):,}"}) if len(tsp) else Part("decode_tp"),
        "measured_table": tables.decode_measured_table(cpu),
        "tpot_error_min": pct(error.min()),
        "tpot_error_max": pct(error.max()),
    }


def fake_cost(results: Path) -> Values:
    """What executing and tracing one fake-world rank costs here (timeline_check/trace_cost.json)."""
    c = stored_json(results, "timeline_check/trace_cost.json")
    return {
        "rank_seconds": f"{statistics.median(c['rank_untraced_s']):.0f}",
        "rank_traced_seconds": f"{statistics.median(c['rank_traced_s']):.0f}",
        "rank_trace_mb": f"{c['rank_trace_bytes'] / 1e6:.2f}",
        "group_trace_mb": f"{c['group_trace_bytes'] / 1e6:.2f}",
        "group_replay_seconds": f"{max(c['replay_seconds'].values()):.1f}",
    }


def mfu_convention(results: Path) -> Values:
    """How much higher MFU reads when causal attention counts the whole S x S square (torchtitan)
    instead of half (this project, Megatron-LM): the 7B at 32K tokens."""
    cfg, seq = ModelConfig.preset("7b"), 32768
    half = forward_flops_per_sequence(cfg, seq)
    return {"whole_square_ratio": f"{(half + cfg.n_layers * attention_flops_per_layer(cfg, seq)) / half:.2f}"}


def gpu_scores(results: Path) -> Values:
    """The GPU test set (results/h200/scores.csv, ``tspbench check gpu-points``): the steps measured
    with the attention kernel the h200 profile names, and the CUDA-graphed decode's TPOT."""
    df = pd.read_csv(results / "h200" / "scores.csv")
    steps = df[(df["what"] == "step") & (df["attention_kernel"] == "cudnn")]
    tpot = df[(df["what"] == "tpot") & df["point"].isin(["decode probe", "gpu-check decode/tpot"])]

    def span(column: pd.Series) -> str:
        return f"{pct(column.min())} to {pct(column.max())}"

    steady = df[df["memory_steady"].eq(True)]
    return {
        "table": (results / "h200" / "scores.md").read_text().rstrip("\n"),
        "memory": span(steady["memory_model_error"]),
        "memory_steps": str(len(steady)),
        "steps": str(len(steps)),
        "timeline": span(steps["timeline_shipped_error"]),
        "model": span(steps["model_shipped_error"]),
        "timeline_same_run": span(steps["timeline_same_run_error"].dropna()),
        "tpot_runs": str(len(tpot)),
        "tpot": span(tpot["model_shipped_error"]),
    }


def gpu_op_scores(results: Path) -> Values:
    """The op-level test set (results/h200/op_scores.csv, ``tspbench check gpu-points``): each
    kind's replayed seconds against the device time the H200 probe measured, and where the
    element-wise miss sits: the copy ops' priced rate against the rate their kernels ran at."""
    h200 = results / "h200"
    df = pd.read_csv(h200 / "op_scores.csv")
    ops = pd.read_csv(h200 / "op_scores_elementwise.csv")
    run = df["run"].iloc[-1]
    probe = json.loads((h200 / run / "probes" / "op_kinds.json").read_text())[0]
    copies = ops[
        (ops["run"] == run) & (ops["strategy"] == probe["strategy"]) & ops["op"].isin(["copy_", "_to_copy"])
    ]
    kernels = sum(s for name, s in probe["top_kernels_s"].items() if "copy_kernel" in name)

    def span(kind: str, label: str) -> str:
        errors = df.loc[df["kind"] == kind, f"{label}_error"]
        return f"{pct(errors.min())} to {pct(errors.max())}"

    copy = copies[copies["op"] == "copy_"].iloc[0]
    parts_8k = json.loads((h200 / "2026-12-04_149a5a5" / "probes" / "calibrate_parts_8k.json").read_text())
    calibrated_8k = parts_8k["timeline_costs"]["result"]["elementwise_by_op"]
    return {
        "table": (h200 / "op_scores.md").read_text().rstrip("\n"),
        "strategies": ", ".join(dict.fromkeys(df["strategy"])),
        **{
            f"{kind}_{label}": span(kind, label)
            for kind in ("gemm", "attention", "elementwise")
            for label in ("shipped", "same_run")
        },
        "copy_priced_gbs": f"{copy['priced_gbs']:,.0f}",
        "copy_gb": f"{copy['bytes'] / 1e9:.1f}",
        "copy_replayed_ms": f"{copy['replayed_s'] * 1e3:.1f}",
        "copies_gb": f"{copies['bytes'].sum() / 1e9:.1f}",
        "copies_replayed_ms": f"{copies['replayed_s'].sum() * 1e3:.1f}",
        "copy_kernels_ms": f"{kernels * 1e3:.1f}",
        "copy_over_kernels_gbs": f"{copy['bytes'] / kernels / 1e9:,.0f}",
        "copy_8k_gbs": f"{calibrated_8k['copy_']:,.0f}",
        "strategy": probe["strategy"],
    }


def headline(results: Path) -> Values:
    """TSP against its peer at the paper's point (the 7B on 8 GPUs, 128K tokens): peak memory per
    GPU executed in the fake world, by recomputation, and training throughput projected for MI300X
    with selective recomputation (the analytic model)."""
    fake_all = completed(results, "paper_memory_fake")
    fake = named(fake_all[fake_all["seq_len"] == 131072])

    def gib(layout: str, recompute: str) -> str:
        row = fake[(fake["layout"] == layout) & (fake["recompute"] == recompute)]
        return f"{row['peak_memory_bytes'].iloc[0] / GIB:.1f}"

    none = fake[fake["recompute"] == "none"]
    over = none[none["peak_memory_bytes"] / GIB > MI300X_USABLE_GIB]
    node = named(at_defaults(results, "paper_throughput", seq_len=131072))
    node = node[node["world_size"] == 8].set_index("layout")["tokens_per_s_per_gpu"]
    return {
        "tsp_none": gib("TSP 8", "none"),
        "fsdp_none": gib("FSDP+SP 8", "none"),
        "fsdp_selective": gib("FSDP+SP 8", "selective"),
        "tsp_full": gib("TSP 8", "full"),
        "over": ", ".join(f"{r.layout} ({r.peak_memory_bytes / GIB:.1f} GiB)" for r in over.itertuples()),
        "usable": f"{MI300X_USABLE_GIB:.1f}",
        "tsp_tput": f"{node['TSP 8']:,.0f}",
        "fsdp_tput": f"{node['FSDP+SP 8']:,.0f}",
        "fake_points": f"{len(fake_all):,}",
        "fake_run": wall_time(fake_all),
    }
