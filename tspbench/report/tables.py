"""The summary table of a report: one row per point, in CSV and GitHub Markdown."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from tspbench.report.best import SWITCH_DEFAULTS, with_settings
from tspbench.report.costs import cost_columns
from tspbench.report.formats import GIB, KINDS, LABEL, pct, tokens
from tspbench.report.style import byte_unit

IDENTITY = ("strategy", "degrees", "world_size", "seq_len", "batch", "mode", "recompute", "status", "source")


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per point; a metric column appears only when some point has it, and so does each
    layout setting (the K/V exchange where some point ran ring or Ulysses, #48; Megatron SP,
    overlap and the MLP exchange where some point set them, #43). Memory columns
    share one unit (GiB or MiB, whichever suits the largest value) so they compare by eye."""
    noun = "GPU" if (df["device"] == "cuda").any() else "rank"
    mem_unit, mem_scale = byte_unit([*df["measured_peak"].dropna(), *df["pred_peak"].dropna()])
    comm_unit, comm_scale = byte_unit(list(df["comm"].dropna()))
    executed = df[df["source"] != "predicted"]
    word = "fake world" if len(executed) and (executed["source"] == "fake").all() else "measured"
    metrics = {
        f"peak {word} ({mem_unit})": (df["measured_peak"] / mem_scale).round(2),
        f"peak predicted ({mem_unit})": (df["pred_peak"] / mem_scale).round(2),
        "prediction error (%)": df["error_pct"].round(1) + 0.0,  # + 0.0: no "-0.0"
        "step measured (ms)": (df["measured_time"] * 1e3).round(1),
        "step predicted (ms)": (df["pred_time"] * 1e3).round(1),
        "step error (%)": ((df["pred_time"] / df["measured_time"] - 1) * 100).round(1) + 0.0,
        f"tokens/s per {noun}": df["tput"].round(1),
        f"TFLOP/s per {noun}": df["tflops"].apply(lambda v: float(f"{v:.4g}") if v == v else v),
        "MFU (%)": df["mfu_pct"].round(1),
        f"comm per step ({comm_unit})": (df["comm"] / comm_scale).round(2),
    }
    table = df[list(IDENTITY)].copy()
    settings = with_settings(df)  # a switch left at its default is missing from older records
    for name, default in reversed(SWITCH_DEFAULTS.items()):  # sp8 ring vs sp8 (#48), tp8 with Megatron SP
        if (settings[name].astype(str) != str(default)).any():  # vs without (#43): a column where it varies
            table.insert(table.columns.get_loc("degrees") + 1, name, settings[name])
    for name, values in metrics.items():
        if values.notna().any():
            table[name] = values
    for name, values in cost_columns(df, noun).items():  # always: blank says no time (#43)
        table[name] = values
    return table


FORMATS = {"peak": "{:,.2f}", "prediction error": "{:+.1f}", "step error": "{:+.1f}", "step": "{:,.1f}",
           "tokens/s": "{:,.1f}", "TFLOP/s": "{:.4g}", "MFU": "{:.1f}", "comm": "{:,.2f}"}  # fmt: skip


def markdown(table: pd.DataFrame) -> str:
    """A GitHub Markdown table: numbers right-aligned with one format per column, blanks for none."""
    formats = [next((f for k, f in FORMATS.items() if c.startswith(k)), "{}") for c in table.columns]
    numeric = [pd.api.types.is_numeric_dtype(table[c]) for c in table.columns]
    rule = "|" + "|".join("---:" if n else "---" for n in numeric) + "|"
    lines = ["| " + " | ".join(table.columns) + " |", rule]
    for row in table.itertuples(index=False):
        cells = ["" if pd.isna(v) else f.format(v) for v, f in zip(row, formats, strict=True)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def grid(header: list[str], rows: list[list[object]]) -> str:
    """A GitHub Markdown table of ready-made cells, every column left-aligned."""
    lines = ["| " + " | ".join(map(str, r)) + " |" for r in (header, *rows)]
    return "\n".join([lines[0], "|" + "---|" * len(header), *lines[1:]])


def schedule_table(rows: list[dict]) -> str:
    """Where each rank's step went, measured and replayed, as GitHub Markdown: one row per
    ``{"layout": ..., "schedule": {"measured": ..., "replayed": ...}}`` (the op-level check's
    rows; seconds, mean over ranks; measured by tspbench.measure.schedstat)."""
    out = []
    for r in rows:
        m, p = r["schedule"]["measured"], r["schedule"]["replayed"]
        cells = [
            f"{m[k]:.2f} / {p[k]:.2f} s ({p[k] / m[k] - 1:+.0%})" for k in ("step_s", "busy_s", "blocked_s")
        ]
        out.append([r["layout"], *cells, f"{m['runqueue_s']:.2f} s", f"{m['comm_threads_cpu_s']:.2f} s"])
    return grid(["layout", *SCHEDULE_COLUMNS], out)


SCHEDULE_COLUMNS = [
    "step: measured / replayed", "busy", "blocked", "waiting for a core (measured)",
    "gloo threads' CPU (measured)",
]  # fmt: skip


KIND_NAMES = {"gemm": "GEMM", "attention": "attention", "elementwise": "element-wise"}


def oncore_table(rows: list[dict]) -> str:
    """Each kind's seconds on a core and its wait for one, as GitHub Markdown: one row per layout
    and kind of the op-level check's rows (seconds summed over ranks). On a core: the replay's
    price of each op on a device of its own against the ops' measured on-core time
    (tspbench.calibrate.opclock); wall over on-core: measured (the same ops' wall clock) and
    replayed (the share of the host the replay gave the kind)."""
    out = []
    for r in rows:
        for kind, name in KIND_NAMES.items():
            alone, oncore = r["replayed_alone_s"][kind], r["oncore_s"][kind]
            waits = f"{r['clocked_wall_s'][kind] / oncore:.2f}x, {r['replayed_s'][kind] / alone:.2f}x"
            out.append([r["layout"], name, f"{alone:.3f} / {oncore:.3f} ({alone / oncore - 1:+.1%})", waits])
    header = [
        "layout",
        "kind",
        "on a core: replayed alone / measured s (error)",
        "wall / on-core: measured, replayed",
    ]
    return grid(header, out)


def oncore_worst(rows: list[dict]) -> dict[str, float]:
    """By kind, the largest |error| on a core over the op-level check's rows."""
    return {k: max(abs(r["replayed_alone_s"][k] / r["oncore_s"][k] - 1) for r in rows) for k in KIND_NAMES}


# ----------------------------------------------------------------------------- the time models' checks


def kinds_table(rows: list[dict]) -> str:
    """The op-level check by layout: replayed / profiled seconds of each kind (error)."""
    cells = [
        [
            r["layout"],
            *(f"{r['replayed_s'][k]:.2f} / {r['profiled_s'][k]:.2f} s ({pct(r['error'][k])})" for k in KINDS),
        ]
        for r in rows
    ]
    return grid(["layout", *KIND_NAMES.values()], cells)


SPLIT_COLUMNS = (
    ("step_time_s", "timeline_step_time_s"),
    ("cpu_busy_s", "timeline_busy_s"),
    ("cpu_blocked_s", "timeline_blocked_s"),
)


def step_split_table(df: pd.DataFrame) -> str:
    """Per measured CPU point: where each rank's step went (Linux schedstat, mean over ranks)
    against the replay's mean compute and idle time."""
    out = []
    for _, r in df.iterrows():
        cells = [f"{r[m]:.2f} / {r[t]:.2f} s ({pct(r[t] / r[m] - 1)})" for m, t in SPLIT_COLUMNS]
        out.append([r["layout"], tokens(int(r["seq_len"])), *cells, f"{r['cpu_runqueue_s']:.2f} s",
                    f"{r['cpu_comm_threads_s']:.2f} s"])  # fmt: skip
    return grid(["layout", "tokens", *SCHEDULE_COLUMNS], out)


def paper_scale_table(parts: pd.DataFrame, far: float) -> str:
    """By study: the paper-scale points, the median timeline / model gap, and how many are far apart."""
    out = [
        [
            f"{experiment} (MI300X)",
            len(g),
            f"{g['gap'].abs().median():.1%}",
            int((g["gap"].abs() > far).sum()),
        ]
        for experiment, g in parts.groupby("experiment")
    ]
    return grid(["study", "points", "timeline vs model: median gap", "more than 10% apart"], out)


def far_points_table(far: pd.DataFrame) -> str:
    """By strategy, the far-apart points' median gap and what each compute kind and the rest add."""
    columns = [*KINDS, "rest"]
    names = [f"{KIND_NAMES.get(c, 'communication and waits')}: median part" for c in columns]
    out = [
        [LABEL[strategy], len(g), pct(g["gap"].median()), *(pct(g[c].median()) for c in columns)]
        for strategy, g in far.groupby("strategy")
    ]
    return grid(["strategy", "points more than 10% apart", "median gap", *names], out)


def torch_estimator_table(d: dict) -> str:
    """By kind: torch's RuntimeEstimator, the timeline and their ratio (torch_estimator.json)."""
    out = [[k, f"{d['torch_s'][k]:.4f}", f"{d['timeline_s'][k]:.4f}", f"{d['ratio'][k]:.2f}"] for k in KINDS]
    return grid(["kind", "torch's estimator (s)", "timeline (s)", "timeline / torch"], out)


def overlap_table(df: pd.DataFrame) -> str:
    """TSP's weight traffic hidden under compute, by length and recomputation."""
    out = [
        [
            tokens(int(r["seq_len"])),
            r["recompute"],
            f"{r['timeline_weights_hidden_fraction']:.0%}",
            f"{r['timeline_hidden_fraction_broadcast']:.0%}",
            f"{r['timeline_hidden_fraction_send_recv']:.0%}",
            f"{r['timeline_step_time_s']:.2f}",
        ]
        for _, r in df.iterrows()
    ]
    header = [
        "tokens",
        "recompute",
        "weight traffic hidden",
        "broadcasts hidden",
        "ring shifts hidden",
        "step (s)",
    ]
    return grid(header, out)


# ----------------------------------------------------------------------------- the paper's studies

RECOMPUTE_MODES = ("none", "selective", "full")


def recompute_table(df: pd.DataFrame, head: str, cell: Callable[[pd.Series], str]) -> str:
    """One row per layout, one column per recomputation mode (``head`` formats its name)."""
    out = []
    for layout, group in df.groupby("layout", sort=False):
        by = group.set_index("recompute")
        out.append([layout, *(cell(by.loc[m]) for m in RECOMPUTE_MODES)])
    return grid(["layout", *(head.format(m) for m in RECOMPUTE_MODES)], out)


def memory_error_table(df: pd.DataFrame) -> str:
    """Peak GiB per GPU by layout and recomputation, the model's error beside it."""
    return recompute_table(
        df, "recompute {}", lambda r: f"{r['peak_memory_bytes'] / GIB:.1f} ({pct(r['err'])})"
    )


def memory_pair_table(df: pd.DataFrame) -> str:
    """Peak GiB per GPU by layout and recomputation: fake world / model."""
    return recompute_table(
        df,
        "{}: fake / model",
        lambda r: f"{r['peak_memory_bytes'] / GIB:.1f} / {r['predicted_peak_memory_bytes'] / GIB:.1f}",
    )


def tsp_fsdp_table(df: pd.DataFrame) -> str:
    """TSP against FSDP+SP at D = 8: memory, bus bytes and throughput by length and recomputation."""
    out = []
    for (seq, rec, d), g in df.assign(d=df["world_size"]).groupby(["seq_len", "recompute", "d"]):
        t, f = g[g["strategy"] == "tsp"], g[g["strategy"] == "fsdp_sp"]
        if t.empty or f.empty or d != 8:
            continue
        t, f = t.iloc[0], f.iloc[0]
        out.append([d, tokens(int(seq)), rec,
                    f"{t['peak_memory_bytes'] / GIB:.1f} / {f['peak_memory_bytes'] / GIB:.1f}",
                    f"{t['comm_bytes_per_step'] / GIB:.1f} / {f['comm_bytes_per_step'] / GIB:.1f}",
                    f"{t['tokens_per_s_per_gpu']:,.0f} / {f['tokens_per_s_per_gpu']:,.0f}"])  # fmt: skip
    header = ["D", "tokens", "recompute", "peak GiB/GPU TSP / FSDP+SP", "bus GiB per step TSP / FSDP+SP",
              "tokens/s/GPU TSP / FSDP+SP"]  # fmt: skip
    return grid(header, out)


def backtest_table(df: pd.DataFrame) -> str:
    """The published runs the model predicts: published tokens/s/GPU against each prediction."""

    def cell(v: float, e: float) -> str:
        return "-" if pd.isna(v) else f"{v:,.0f} ({pct(e)})"

    out = [
        [
            r.id,
            r.role,
            f"{r.published_layout}{' + compile' if r.compile else ''}",
            f"{r.published_tokens_per_s_per_gpu:,.0f}",
            cell(r.assumed_tokens_per_s_per_gpu, r.assumed_error),
            cell(r.assumed_timeline_tokens_per_s_per_gpu, r.assumed_timeline_error),
            cell(r.calibrated_tokens_per_s_per_gpu, r.calibrated_error),
        ]
        for r in df[df["predicted"]].itertuples()
    ]
    header = ["entry", "role", "layout", "published tokens/s/GPU", "model, assumed", "timeline, assumed",
              "model, calibrated"]  # fmt: skip
    return grid(header, out)


def batch_table(layouts: list[str], batches: list[int], cell: Callable[[str, int], str]) -> str:
    """One row per batch, one column per layout."""
    return grid(["batch", *layouts], [[b, *(cell(layout, b) for layout in layouts)] for b in batches])


def tpot_cell(df: pd.DataFrame, layout: str, batch: int, columns: tuple[str, ...]) -> str:
    """TPOT in ms of one point ('p50 / p99' for two columns), '-' where it did not run or fit."""
    hit = df[(df["layout"] == layout) & (df["batch"] == batch)]
    if hit.empty or hit.iloc[0]["status"] != "completed" or not hit.iloc[0].get("fits", True):
        return "-"
    return " / ".join(f"{hit.iloc[0][c] * 1e3:.1f}" for c in columns)


def decode_projected_table(mi300x: pd.DataFrame, h100: pd.DataFrame) -> str:
    """Projected TPOT p50 (ms) by batch and layout, MI300X / H100."""
    layouts = list(dict.fromkeys(mi300x.sort_values("world_size")["layout"]))
    p50 = ("tpot_p50_s",)
    return batch_table(
        layouts,
        sorted(mi300x["batch"].unique()),
        lambda layout, b: f"{tpot_cell(mi300x, layout, b, p50)} / {tpot_cell(h100, layout, b, p50)}",
    )


def decode_measured_table(df: pd.DataFrame) -> str:
    """Measured TPOT p50 / p99 (ms) by batch and layout."""
    layouts = list(dict.fromkeys(df.sort_values("tpot_p50_s")["layout"]))
    return batch_table(
        layouts,
        sorted(df["batch"].unique()),
        lambda layout, b: tpot_cell(df, layout, b, ("tpot_p50_s", "tpot_p99_s")),
    )
