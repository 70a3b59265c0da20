"""``tspbench report RESULTS_DIR [--out DIR]``: summary tables and figures from stored records.

    <out>/                      default RESULTS_DIR/report
        report.md               index: what ran where, links to the tables, every figure
        summary.csv, summary.md one row per point (layout, shape, status, memory, speed, comm)
        <figure>.png, .svg      see tspbench.report_figures.FIGURES

Everything is drawn from the records alone (``tspbench.results.load``), so a report regenerates
anywhere, and the same records give byte-identical files (tspbench.report_style.save). Given a
results root of several experiments, each gets its own subfolder and report.md links them.

Records come in two kinds, told apart by ``source``: measured (``tspbench bench``: peak memory
measured, the model's prediction beside it) and predicted (the analytic model alone: its peak
memory *is* the prediction). ``prepare`` maps both onto one set of columns so that tables and
figures need not care which they hold.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from tspbench.results import load, write_atomic

AXES = ("dp", "tp", "sp", "tsp")
PHASES = ("forward", "backward", "optimizer")  # tspbench.comm.PHASES (not imported: it needs torch)
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "other")
STRATEGY_RANK = {s: i for i, s in enumerate(("dp", "tp", "sp", "tp_sp", "tsp"))}
RECOMPUTE_RANK = {"none": 0, "selective": 1, "full": 2}


@dataclass
class ReportOutputs:
    """What one report wrote (for a results root: the index, and one child per experiment)."""

    out_dir: Path
    index: Path
    tables: list[Path] = field(default_factory=list)
    figures: dict[str, list[Path]] = field(default_factory=dict)  # name -> [png, svg]
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why the records do not support it
    experiments: list[ReportOutputs] = field(default_factory=list)


# ----------------------------------------------------------------------------- records -> columns


def column(df: pd.DataFrame, name: str) -> pd.Series:
    """A numeric column, NaN where absent (records of other executors lack some fields)."""
    if name not in df:
        return pd.Series(np.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[name], errors="coerce").astype(float)


def degrees(row: pd.Series, with_dp: bool = True) -> str:
    """'tsp8 x dp128', 'tp2 x sp4': the strategy's own axes always (its name lists them, as in
    tp_sp), any other axis above 1, data parallel last."""
    own = [a for a in row["strategy"].split("_") if a in AXES and a != "dp"]
    mp = [a for a in AXES[1:] if a in own or int(row[a]) > 1]
    shown = [*mp, "dp"] if with_dp and (int(row["dp"]) > 1 or row["strategy"] == "dp" or not mp) else mp
    return " x ".join(f"{a}{int(row[a])}" for a in shown) or "1"


def series_label(strategy: str, degree_text: str) -> str:
    """'tsp8' for a one-axis strategy named after its axis, else 'tp_sp tp2 x sp4'."""
    head = degree_text.split(" x ")[0]
    return degree_text if head.rstrip("0123456789") == strategy else f"{strategy} {degree_text}"


def prepare(frame: pd.DataFrame) -> pd.DataFrame:
    """The records with the columns tables and figures read, in a fixed, sensible order."""
    df = frame.copy()
    for name in (*AXES, "world_size", "seq_len", "batch"):
        df[name] = column(df, name).fillna(1).astype(int)
    for name in ("strategy", "mode", "recompute", "dtype", "model", "device"):
        df[name] = df[name].fillna("").astype(str) if name in df else ""
    predicted = (df["source"] == "predicted") if "source" in df else pd.Series(False, index=df.index)
    if "method" in df:
        predicted |= df["method"] == "predict"
    df["source"] = np.where(predicted, "predicted", "measured")
    df["degrees"] = df.apply(degrees, axis=1)
    df["series"] = [series_label(s, d) for s, d in zip(df["strategy"], df["degrees"], strict=True)]
    mp = df.apply(degrees, axis=1, with_dp=False)
    df["series_mp"] = [series_label(s, d) for s, d in zip(df["strategy"], mp, strict=True)]
    add_metrics(df, predicted)
    return sort(df)


def add_metrics(df: pd.DataFrame, predicted: pd.Series) -> None:
    """Memory, speed and comm columns that mean the same for measured and predicted records."""
    done = df["status"] == "completed"
    peak = column(df, "peak_memory_bytes")
    df["peak"] = peak
    df["measured_peak"] = peak.where(~predicted & done)
    df["pred_peak"] = peak.where(predicted, column(df, "predicted_peak_memory_bytes"))
    df["error_pct"] = (df["pred_peak"] / df["measured_peak"] - 1) * 100
    df["capacity"] = column(df, "capacity_bytes")
    df["oom_at"] = df["pred_peak"].fillna(df["capacity"]).where(df["status"] == "oom")
    df["tput"] = column(df, "tokens_per_s_per_gpu").where(done)
    df["agg"] = df["tput"] * df["world_size"]
    df["tflops"] = column(df, "tflops_per_gpu").where(done)
    df["mfu_pct"] = column(df, "mfu").where(done) * 100
    df["comm"] = column(df, "comm_bytes_per_step").where(done)
    for cat in CATEGORIES:
        df[f"peak_memory_{cat}_bytes"] = column(df, f"peak_memory_{cat}_bytes")
    df["breakdown"] = df[[f"peak_memory_{c}_bytes" for c in CATEGORIES]].notna().any(axis=1)
    skip = {"comm_bytes_per_step", *(f"comm_{p}_bytes" for p in PHASES)}
    ops = sorted(c for c in df.columns if c.startswith("comm_") and c.endswith("_bytes") and c not in skip)
    for name in ops:
        df[f"comm_op_{name.removeprefix('comm_').removesuffix('_bytes')}"] = column(df, name)


def sort(df: pd.DataFrame) -> pd.DataFrame:
    """Setting first (mode, recompute), then the model-parallel group size (D: layouts on the same
    GPUs side by side), strategy, layout (TP-heavy first), data-parallel degree, shape."""
    keys = pd.DataFrame(
        {
            "mode": df["mode"],
            "recompute": df["recompute"].map(RECOMPUTE_RANK).fillna(9),
            "model": df["model"],
            "dtype": df["dtype"],
            "replica": df["world_size"] // df["dp"].clip(lower=1),
            "strategy": df["strategy"].map(STRATEGY_RANK).fillna(len(STRATEGY_RANK)),
            "strategy_name": df["strategy"],
            **{a: -df[a] for a in AXES[1:]},
            "dp": df["dp"],
            "seq_len": df["seq_len"],
            "batch": df["batch"],
        }
    )
    order = keys.sort_values(list(keys.columns), kind="stable").index
    return df.loc[order].reset_index(drop=True)


# ----------------------------------------------------------------------------- tables

IDENTITY = ("strategy", "degrees", "world_size", "seq_len", "batch", "mode", "recompute", "status", "source")


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per point; a metric column appears only when some point has it. Memory columns
    share one unit (GiB or MiB, whichever suits the largest value) so they compare by eye."""
    from tspbench.report_style import byte_unit

    noun = "GPU" if (df["device"] == "cuda").any() else "rank"
    mem_unit, mem_scale = byte_unit([*df["measured_peak"].dropna(), *df["pred_peak"].dropna()])
    comm_unit, comm_scale = byte_unit(list(df["comm"].dropna()))
    metrics = {
        f"peak measured ({mem_unit})": (df["measured_peak"] / mem_scale).round(2),
        f"peak predicted ({mem_unit})": (df["pred_peak"] / mem_scale).round(2),
        "prediction error (%)": df["error_pct"].round(1) + 0.0,  # + 0.0: no "-0.0"
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


FORMATS = {"peak": "{:,.2f}", "prediction error": "{:+.1f}", "tokens/s": "{:,.1f}", "TFLOP/s": "{:.4g}",
           "MFU": "{:.1f}", "comm": "{:,.2f}"}  # fmt: skip


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


# ----------------------------------------------------------------------------- the report


def context(df: pd.DataFrame) -> object:
    """What titles say about where the records come from (``report_figures.Context``)."""
    from tspbench.report_figures import Context

    parts = []
    if (df["source"] == "measured").any():
        parts.append(measured_where(df[df["source"] == "measured"]))
    if (df["source"] == "predicted").any():
        hardware = sorted({str(h).upper() for h in df.loc[df["source"] == "predicted", "hardware"].dropna()})
        parts.append(f"projected for {' / '.join(hardware) or 'unknown hardware'} (analytic model)")
    noun = "GPU" if (df["device"] == "cuda").any() else "rank"
    return Context(" and ".join(parts), noun, list(dict.fromkeys(df["strategy"])))


def measured_where(df: pd.DataFrame) -> str:
    """'measured on CPU (x86_64, 2 cores, gloo)' or 'measured on NVIDIA H200' from the env fields."""
    first = df.iloc[0]
    env = {k[4:]: first[k] for k in df.columns if k.startswith("env_") and pd.notna(first[k])}
    if first["device"] == "cuda" and env.get("device_name"):
        return f"measured on {env['device_name']}"
    if first["device"] == "cpu":
        details = [env.get("device_name"), f"{env['cpu_count']} cores" if "cpu_count" in env else None,
                   env.get("backend")]  # fmt: skip
        return "measured on CPU" + (f" ({', '.join(str(d) for d in details if d)})" if any(details) else "")
    return "measured"


def is_experiment(path: Path) -> bool:
    return any(path.glob("*/point.json"))


def report(results_dir: Path, out_dir: Path | None = None) -> ReportOutputs:
    """Write tables, figures and report.md for an experiment folder, or for each experiment under
    a results root (into ``out_dir/<experiment>/``, with an index linking them)."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise FileNotFoundError(f"{results_dir}: no such results folder")
    out_dir = Path(out_dir) if out_dir is not None else results_dir / "report"
    if is_experiment(results_dir):
        return report_experiment(load(results_dir), out_dir)
    experiments = sorted(p for p in results_dir.iterdir() if p.is_dir() and is_experiment(p))
    if not experiments:
        raise FileNotFoundError(f"{results_dir}: no stored runs (no <run>/point.json here or one level down)")
    children = [report_experiment(load(p), out_dir / p.name) for p in experiments]
    lines = ["# Reports", "", *(f"- [{c.out_dir.name}]({c.out_dir.name}/report.md)" for c in children)]
    write_atomic(out_dir / "report.md", "\n".join(lines) + "\n")
    return ReportOutputs(out_dir, out_dir / "report.md", experiments=children)


@dataclass(frozen=True)
class FigureSpec:
    """A figure: the function that draws it (in ``module``), what it shows, why it may be missing."""

    name: str
    module: str
    what: str
    why_not: str

    def draw(self, df: pd.DataFrame, ctx: object) -> object:
        """The Figure, or None when the records do not support it (imported late: matplotlib)."""
        return getattr(importlib.import_module(f"tspbench.{self.module}"), self.name)(df, ctx)


FIGURES = (
    FigureSpec("memory_vs_seq", "report_figures", "peak memory per device vs sequence length, "
               "capacity and OOM marked", "no layout was run at more than one sequence length"),
    FigureSpec("throughput_vs_seq", "report_figures", "tokens/s per device vs sequence length",
               "no layout has a throughput at more than one sequence length"),
    FigureSpec("scaling", "report_figures", "tokens/s per device and in total vs number of devices",
               "no model-parallel replica was run at more than one world size"),
    FigureSpec("microbatch", "report_figures", "tokens/s and peak memory per device vs micro-batch size",
               "no layout was run at more than one micro-batch size"),
    FigureSpec("memory_parity", "report_bars", "predicted vs measured peak memory, y = x and the ±10% band",
               "no completed point has both a measured and a predicted peak"),
    FigureSpec("comm_by_op", "report_bars", "communication bytes per step by collective and layout",
               "no completed point communicates"),
    FigureSpec("memory_breakdown", "report_bars", "peak memory by category (parameters to activations) per "
               "layout", "no point has its memory split by category"),
)  # fmt: skip


def report_experiment(frame: pd.DataFrame, out_dir: Path) -> ReportOutputs:
    import matplotlib as mpl

    from tspbench.report_style import RC, save

    out_dir.mkdir(parents=True, exist_ok=True)
    df = prepare(frame)
    outputs = ReportOutputs(out_dir, out_dir / "report.md")
    table = summary_table(df)
    write_atomic(out_dir / "summary.csv", table.to_csv(index=False))
    write_atomic(out_dir / "summary.md", markdown(table))
    outputs.tables = [out_dir / "summary.csv", out_dir / "summary.md"]
    ctx = context(df)
    for spec in FIGURES:
        with mpl.rc_context(RC):
            fig = spec.draw(df, ctx)
            if fig is not None:
                outputs.figures[spec.name] = save(fig, out_dir / spec.name)
        if fig is None:
            outputs.skipped[spec.name] = spec.why_not
            for ext in ("png", "svg"):  # a figure the records no longer support must not linger
                with contextlib.suppress(FileNotFoundError):
                    (out_dir / f"{spec.name}.{ext}").unlink()
    write_atomic(outputs.index, index_text(df, ctx, outputs))
    return outputs


def index_text(df: pd.DataFrame, ctx: object, outputs: ReportOutputs) -> str:
    """report.md: what ran where, the tables, every figure embedded, what was not drawn and why."""
    name = str(df["experiment"].iloc[0]) if "experiment" in df and len(df) else outputs.out_dir.name
    counts = df["status"].value_counts()
    status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    lines = [
        f"# {name}",
        "",
        f"{len(df)} points ({status}), {ctx.where}. Regenerate with `tspbench report RESULTS_DIR`.",
        "",
        "## Tables",
        "",
        "- [summary.md](summary.md), [summary.csv](summary.csv): one row per point",
        "",
        "## Figures",
        "",
    ]
    for spec in FIGURES:
        if spec.name in outputs.figures:
            title = spec.what[0].upper() + spec.what[1:]
            lines += [
                f"### {title}",
                "",
                f"![{spec.what}]({spec.name}.png)",
                "",
                f"[SVG]({spec.name}.svg)",
                "",
            ]
    if outputs.skipped:
        lines += ["Not drawn, as the records do not support them:", ""]
        lines += [f"- {fig}: {why}" for fig, why in outputs.skipped.items()]
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------- command line


def cmd_report(args: argparse.Namespace) -> int:
    outputs = report(Path(args.results_dir), Path(args.out) if args.out else None)
    for out in outputs.experiments or [outputs]:
        made = ", ".join(out.figures) or "none"
        print(f"{out.out_dir}: {len(out.tables)} tables; figures: {made}")
        if out.skipped:
            print(f"  not drawn: {', '.join(out.skipped)}")
    print(f"index: {outputs.index}")
    return 0


def add_command(sub: argparse._SubParsersAction) -> None:
    """The ``report`` subcommand (called from tspbench.cli.build_parser)."""
    p = sub.add_parser("report", help="summary tables and figures from stored results")
    p.add_argument("results_dir", help="results/<experiment>, or a results root of several")
    p.add_argument("--out", help="output folder (default: RESULTS_DIR/report)")
    p.set_defaults(func=cmd_report)
