"""The summary table of a report: one row per point, in CSV and GitHub Markdown."""

from __future__ import annotations

import pandas as pd

from tspbench.report.style import byte_unit

IDENTITY = ("strategy", "degrees", "world_size", "seq_len", "batch", "mode", "recompute", "status", "source")


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per point; a metric column appears only when some point has it. Memory columns
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
    for name, values in metrics.items():
        if values.notna().any():
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


def schedule_table(rows: list[dict]) -> str:
    """Where each rank's step went, measured and replayed, as GitHub Markdown: one row per
    ``{"layout": ..., "schedule": {"measured": ..., "replayed": ...}}`` (the op-level check's
    rows; seconds, mean over ranks; measured by tspbench.measure.schedstat)."""
    out = [
        "| layout | step: measured / replayed | busy | blocked | waiting for a core (measured) "
        "| gloo threads' CPU (measured) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        m, p = r["schedule"]["measured"], r["schedule"]["replayed"]
        parts = ("step_s", "busy_s", "blocked_s")
        cells = [f"{m[k]:.2f} / {p[k]:.2f} s ({p[k] / m[k] - 1:+.0%})" for k in parts]
        cells += [f"{m['runqueue_s']:.2f} s", f"{m['comm_threads_cpu_s']:.2f} s"]
        out.append(f"| {r['layout']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


KIND_NAMES = {"gemm": "GEMM", "attention": "attention", "elementwise": "element-wise"}


def oncore_table(rows: list[dict]) -> str:
    """Each kind's seconds on a core and its wait for one, as GitHub Markdown: one row per layout
    and kind of the op-level check's rows (seconds summed over ranks). On a core: the replay's
    price of each op on a device of its own against the ops' measured on-core time
    (tspbench.measure.opclock); wall over on-core: measured (the same ops' wall clock) and
    replayed (the share of the host the replay gave the kind)."""
    out = [
        "| layout | kind | on a core: replayed alone / measured s (error) "
        "| wall / on-core: measured, replayed |",
        "|---|---|---|---|",
    ]
    for r in rows:
        for kind, name in KIND_NAMES.items():
            alone, oncore = r["replayed_alone_s"][kind], r["oncore_s"][kind]
            waits = f"{r['clocked_wall_s'][kind] / oncore:.2f}x, {r['replayed_s'][kind] / alone:.2f}x"
            core = f"{alone:.3f} / {oncore:.3f} ({alone / oncore - 1:+.1%})"
            out.append(f"| {r['layout']} | {name} | {core} | {waits} |")
    return "\n".join(out)


def oncore_worst(rows: list[dict]) -> dict[str, float]:
    """By kind, the largest |error| on a core over the op-level check's rows."""
    return {k: max(abs(r["replayed_alone_s"][k] / r["oncore_s"][k] - 1) for r in rows) for k in KIND_NAMES}
