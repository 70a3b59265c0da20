"""``tspbench report RESULTS_DIR [--out DIR]``: summary tables and figures from stored records.

    <out>/                      default RESULTS_DIR/report
        report.md               index: what ran where, links to the tables, every figure
        summary.csv, summary.md one row per point (layout, shape, status, memory, speed, comm)
        <figure>.png, .svg      see FIGURES below

Everything is drawn from the records alone (``tspbench.sweep.store.load``), so a report
regenerates anywhere, and the same records give byte-identical files (tspbench.report.style.save);
the Gantt figure (tspbench.report.gantt) also replays the step traces kept in the run folders
(``run.trace: true``), and is skipped where there are none.
Given a results root of several experiments, each gets its own subfolder and report.md links
them. The records become one frame in tspbench.report.frame; tables.py, figures.py (lines) and
bars.py (bars and parity) draw from it. No torch is needed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import matplotlib as mpl
import pandas as pd
from matplotlib.figure import Figure

from tspbench.core.errors import DamagedFileError
from tspbench.core.files import write_atomic
from tspbench.report import bars, decode, figures, gantt, studies
from tspbench.report.band import BandFinder, with_bands
from tspbench.report.best import best_rows, best_view, markdown_lines, metric_of, swept
from tspbench.report.frame import Context, context, prepare
from tspbench.report.gpu_runs import write_gpu_runs
from tspbench.report.host import host_notes
from tspbench.report.ledger import HingeFinder, write_ledger
from tspbench.report.outdir import claim, record_written, remove_stale
from tspbench.report.provenance import provenance_lines, run_command, shown
from tspbench.report.style import RC, save
from tspbench.report.tables import markdown, summary_table
from tspbench.sweep.damage import RunFiles
from tspbench.sweep.store import load, results_folder


@dataclass
class ReportOutputs:
    """What one report wrote (for a results root: the index, and one child per experiment)."""

    out_dir: Path
    index: Path
    tables: list[Path] = field(default_factory=list)
    figures: dict[str, list[Path]] = field(default_factory=dict)  # name -> [png, svg]
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why the records do not support it
    damaged: list[str] = field(default_factory=list)  # "PATH: problem" per stored file left out
    experiments: list[ReportOutputs] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # why measured times may miss the profile (#46)


# ----------------------------------------------------------------------------- records -> columns


def is_experiment(path: Path) -> bool:
    return any(path.glob("*/point.json"))


def report(
    results_dir: Path,
    out_dir: Path | None = None,
    hinges: HingeFinder | None = None,
    bands: BandFinder | None = None,
) -> ReportOutputs:
    """Write tables, figures and report.md for an experiment folder, or for each experiment under
    a results root (into ``out_dir/<experiment>/``, with an index linking them, and where the
    root holds paper studies, ledger.md: the paper's claims judged from them; ``hinges`` gives
    the figures each projected verdict rests on, tspbench.report.ledger; ``bands`` the range of
    each projected tokens/s, tspbench.report.band)."""
    results_dir = results_folder(results_dir)
    out_dir = Path(out_dir) if out_dir is not None else results_dir / "report"
    claim(out_dir)  # before anything is written: never into a folder holding someone else's files
    if is_experiment(results_dir):
        return readable_report(results_dir, out_dir, bands)
    experiments = sorted(p for p in results_dir.iterdir() if p.is_dir() and is_experiment(p))
    if not experiments:
        raise FileNotFoundError(f"{results_dir}: no stored runs (no <run>/point.json here or one level down)")
    for p in experiments:
        claim(out_dir / p.name)
    children = [readable_report(p, out_dir / p.name, bands) for p in experiments]
    lines = [
        "# Reports",
        "",
        *(study_line(c.out_dir.name, p) for c, p in zip(children, experiments, strict=True)),
    ]
    gpu, damaged = write_gpu_runs(results_dir, out_dir)
    if gpu is not None:
        lines.append(f"- [measured on a lent GPU]({gpu.name})")
    papers = {p.name: for_claims(load(p), p.name) for p in experiments if p.name.startswith("paper_")}
    claims = write_ledger(papers, out_dir, hinges) if papers else None  # the paper's claims, judged
    if claims is not None:
        lines.append(f"- [the paper's claims, judged from these records]({claims.name})")
    write_atomic(out_dir / "report.md", "\n".join(lines) + "\n")
    written = [out_dir / "report.md", *([gpu] if gpu else []), *([claims] if claims else [])]
    record_written(out_dir, [*written, *(c.out_dir for c in children)])
    damaged += [d for c in children for d in c.damaged]
    return ReportOutputs(out_dir, out_dir / "report.md", experiments=children, damaged=damaged)


def study_line(name: str, runs: Path) -> str:
    """The index's line for a study: its report, and the command that made its records (#46)."""
    command = run_command(shown(runs))
    return f"- [{name}]({name}/report.md)" + (f": `{command}`" if command else "")


def readable_report(runs: Path, out_dir: Path, bands: BandFinder | None = None) -> ReportOutputs:
    """One experiment's report from the run folders that read back; a damaged one is left out
    and named in ``damaged`` (one bad point does not stop the report of the others)."""
    bad: list[RunFiles] = []
    frame = load(runs, bad)
    problems = [problem for files in bad for problem in files.problems]
    if frame.empty and problems:
        raise DamagedFileError(f"{runs}: no readable point; {problems[0]}")
    outputs = report_experiment(frame, out_dir, runs, bands)
    outputs.damaged[:0] = problems
    return outputs


@dataclass(frozen=True)
class FigureSpec:
    """A figure: what draws it (None when the records do not support it), what it shows, why it may
    be missing."""

    draw: Callable[[pd.DataFrame, Context], Figure | None]
    what: str
    why_not: str
    mode: str | None = None  # drawn only for records of this mode (not listed as missing otherwise)

    @property
    def name(self) -> str:
        return self.draw.__name__


FIGURES = (
    FigureSpec(figures.memory_vs_seq, "peak memory per device vs sequence length, "
               "capacity and OOM marked", "no layout was run at more than one sequence length"),
    FigureSpec(figures.throughput_vs_seq, "tokens/s per device vs sequence length",
               "no layout has a throughput at more than one sequence length"),
    FigureSpec(figures.scaling, "tokens/s per device and in total vs number of devices",
               "no model-parallel replica was run at more than one world size"),
    FigureSpec(figures.microbatch, "tokens/s and peak memory per device vs micro-batch size",
               "no layout was run at more than one micro-batch size"),
    FigureSpec(bars.memory_parity, "predicted vs measured peak memory, y = x and the ±10% band",
               "no completed point has both a measured and a predicted peak"),
    FigureSpec(bars.time_parity, "predicted vs measured step time, y = x and the ±25% band",
               "no completed point has both a measured and a predicted step time"),
    FigureSpec(bars.comm_by_op, "communication bytes per step by collective and layout",
               "no completed point communicates"),
    FigureSpec(bars.memory_breakdown, "peak memory by category (parameters to activations) per "
               "layout", "no point has its memory split by category"),
    FigureSpec(decode.tpot_vs_batch, "decode: time per output token vs batch, TSP's break-even batch "
               "marked", "no decode point has a TPOT", "decode"),
    FigureSpec(decode.tpot_tails, "decode: p50 and p99 time per output token vs batch",
               "no decode point has p50 and p99 TPOT", "decode"),
    FigureSpec(gantt.timeline_gantt, "one decoder layer's forward per strategy on rank 0: compute and "
               "link lanes as the timeline replays the traced step", "no completed point has a step "
               "trace (trace.npz: run.trace: true) with layer marks"),
)  # fmt: skip


def report_experiment(
    frame: pd.DataFrame, out_dir: Path, runs: Path | None = None, bands: BandFinder | None = None
) -> ReportOutputs:
    """The report of one experiment's records; ``runs``: the folder they were loaded from (its run
    folders hold the step traces the Gantt figure replays: without it, that figure is skipped).
    Only into a folder the report owns (tspbench.report.outdir), deleting only what it wrote."""
    claim(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    df = prepare(with_run_dirs(frame, runs))
    outputs = ReportOutputs(out_dir, out_dir / "report.md", notes=host_notes(df))
    table = summary_table(df)
    write_atomic(out_dir / "summary.csv", table.to_csv(index=False))
    write_atomic(out_dir / "summary.md", markdown(table))
    outputs.tables = [out_dir / "summary.csv", out_dir / "summary.md"]
    ctx = context(df)
    drawn, drawn_ctx = best_against_best(df, ctx, out_dir)  # #43: each layout at its best
    drawn = with_bands(drawn, bands)  # a projected speed's range, for the rows drawn only
    for spec in FIGURES:
        with mpl.rc_context(RC):
            fig = spec.draw(drawn, drawn_ctx)
            if fig is not None:
                outputs.figures[spec.name] = save(fig, out_dir / spec.name)
        if fig is None:
            if spec.mode is None or (df["mode"] == spec.mode).any():
                outputs.skipped[spec.name] = spec.why_not
            # a figure the records no longer support must not linger (if this report wrote it)
            remove_stale(out_dir, [f"{spec.name}.{ext}" for ext in ("png", "svg")])
    outputs.damaged += ctx.damaged
    write_atomic(outputs.index, index_text(df, ctx, outputs, runs))
    figures = [p for paths in outputs.figures.values() for p in paths]
    record_written(out_dir, [*outputs.tables, *figures, outputs.index])
    return outputs


def best_against_best(df: pd.DataFrame, ctx: Context, out_dir: Path) -> tuple[pd.DataFrame, Context]:
    """What the figures draw: where a paper study swept settings, each layout's best feasible
    setting (tspbench.report.best; a memory study's lowest peak), and every title says so; else
    every record."""
    name = study_name(df, out_dir)
    best = best_view(df, name)
    if best is None:
        return df, ctx
    words = "lowest-peak" if metric_of(name) == "memory" else "best"
    return best, replace(ctx, where=f"{ctx.where}; each layout at its {words} setting")


def for_claims(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """The records a claim judges: of a speed study that swept settings, each layout's best (#43),
    so TSP is held against TP+SP each at its best; a memory study's records as stored."""
    return best_rows(frame) if metric_of(name) == "speed" and swept(frame) else frame


def study_name(df: pd.DataFrame, out_dir: Path) -> str:
    return str(df["experiment"].iloc[0]) if "experiment" in df and len(df) else out_dir.name


def with_run_dirs(frame: pd.DataFrame, runs: Path | None) -> pd.DataFrame:
    """The records with each point's run folder (``gantt.RUN_DIR``) when ``runs`` is known."""
    if runs is None or "run_id" not in frame:
        return frame
    return frame.assign(**{gantt.RUN_DIR: [str(Path(runs) / str(r)) for r in frame["run_id"]]})


def index_text(df: pd.DataFrame, ctx: Context, outputs: ReportOutputs, runs: Path | None = None) -> str:
    """report.md: what ran where, how to make its records and itself again and how long the points
    ran (from ``runs``, tspbench.report.provenance), the tables, every figure embedded, what was
    not drawn and why."""
    name = study_name(df, outputs.out_dir)
    counts = df["status"].value_counts()
    status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    lines = [
        f"# {name}",
        "",
        f"{len(df)} points ({status}), {ctx.where}."
        + ("" if runs is not None else " Regenerate with `tspbench report RESULTS_DIR`."),
        "",
        *provenance_lines(df, runs),
        *([f"**Warning, step times:** {'; '.join(outputs.notes)}.", ""] if outputs.notes else []),
        "## Tables",
        "",
        "- [summary.md](summary.md), [summary.csv](summary.csv): one row per point",
        "",
    ]
    best = markdown_lines(df, name, ctx.where)  # #43: each layout at its best beside its default
    lines += ["## Each layout at its best setting", "", *best, ""] if best else []
    lines += ["## Figures", ""]
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
            words = studies.caption(spec.name, df)  # scaling: why flat / what bends it; micro-batch walls
            lines += [words.rstrip("\n"), ""] if words else []
    if outputs.skipped:
        lines += ["Not drawn, as the records do not support them:", ""]
        lines += [f"- {fig}: {why}" for fig, why in outputs.skipped.items()]
    return "\n".join(lines).rstrip() + "\n"
