"""tspbench report: tables, figures, OOM marks, byte-identical reruns, results roots, the CLI.

Measured-style records are written straight through the results store (fast, and every case is
chosen: OOM with a prediction far over the capacity, a failed point, a third-party strategy);
predicted ones come from the real predict executor on a small sweep over micro-batch and dp.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib as mpl
import matplotlib.image as mpimg
import pandas as pd
import pytest
from matplotlib.collections import PathCollection

from tspbench.cli.main import main
from tspbench.core.units import degrees_text
from tspbench.report import figures as report_figures
from tspbench.report import style as report_style
from tspbench.report.build import report
from tspbench.report.frame import context, prepare, series_label
from tspbench.sweep.store import Store, load

MiB = 2**20
CAPACITY = 300 * MiB
SEQS = (1024, 2048, 4096)
LAYOUTS = {
    "dp": {"dp": 4},
    "tp": {"tp": 4},
    "tp_sp": {"tp": 2, "sp": 2},
    "tsp": {"tsp": 4},
    "ring9": {"tsp": 4},
}
PREDICTED_OOM = {("dp", 2048): 420 * MiB, ("dp", 4096): 900 * MiB}  # 900 MiB: over 2x capacity, clipped
FAILED = {("tp", 4096)}
MEASURED_FIGURES = {"memory_vs_seq", "throughput_vs_seq", "memory_parity", "time_parity", "comm_by_op",
                    "memory_breakdown"}  # fmt: skip


def point(experiment: str, index: int, strategy: str, seq: int) -> dict:
    layout = {"strategy": strategy, "dp": 1, "tp": 1, "sp": 1, "tsp": 1, **LAYOUTS[strategy]}
    workload = {
        "batch": 1,
        "mode": "train",
        "recompute": "none",
        "dtype": "float32",
        "device": "cpu",
        "seq_len": seq,
    }
    return {
        "run_id": f"{experiment[:3]}{index:03d}",
        "experiment": experiment,
        "index": index,
        "world_size": 4,
        "timeout": 60.0,
        "config": {
            "method": "measure",
            "layout": layout,
            "model": {"name": "small", "hidden": 256},
            "workload": workload,
            "measure": {"warmup": 0, "steps": 1, "repeats": 1, "capacity_bytes": CAPACITY},
        },
    }


def record(strategy: str, seq: int, k: int) -> tuple[str, dict]:
    """(status, record) of a synthetic measured point: memory grows with the sequence."""
    base = {
        "capacity_bytes": CAPACITY,
        "env_device_name": "x86_64",
        "env_cpu_count": 2,
        "env_backend": "gloo",
    }
    if (strategy, seq) in PREDICTED_OOM:
        return "oom", {
            **base,
            "error": "OutOfMemoryError",
            "predicted_peak_memory_bytes": PREDICTED_OOM[strategy, seq],
        }
    if (strategy, seq) in FAILED:
        return "failed", {**base, "error": "RuntimeError: boom"}
    cats = {
        "parameters": 10 + k,
        "gradients": 0,
        "optimizer": 20,
        "activations": seq // 32 + 5 * k,
        "other": 3,
    }
    peak = sum(cats.values()) * MiB
    return "completed", {
        **base,
        "step_time_s": 1.0 + k,
        "predicted_step_time_s": (1.0 + k) * (1 + 0.05 * (k - 2)),
        "tokens_per_s_per_gpu": seq / (1.0 + k) / 4,
        "tflops_per_gpu": 0.01 * (k + 1),
        "peak_memory_bytes": peak,
        **{f"peak_memory_{c}_bytes": v * MiB for c, v in cats.items()},
        "predicted_peak_memory_bytes": peak * (1 + 0.02 * (k - 2)),
        "predicted_memory_error": 0.02 * (k - 2),
        "comm_bytes_per_step": (4 + k) * MiB,
        "comm_all_reduce_bytes": 3 * MiB,
        "comm_all_gather_bytes": (1 + k) * MiB,
        "comm_forward_bytes": 2 * MiB,  # a phase, not a collective: must not become a bar
    }


def write_experiment(root: Path, name: str, strategies: list[str], seqs: tuple[int, ...]) -> Path:
    store = Store(root / name)
    index = 0
    for seq in seqs:
        for k, strategy in enumerate(strategies):
            p = point(name, index, strategy, seq)
            store.prepare(p)
            status, rec = record(strategy, seq, k)
            store.finish(p["run_id"], status, rec)
            index += 1
    return store.root


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    root = tmp_path_factory.mktemp("results")
    exp = write_experiment(root, "synthetic", list(LAYOUTS), SEQS)
    return exp, report(exp)


@pytest.mark.slow
def test_summary_table_has_columns_rows_and_order(measured: tuple[Path, object]) -> None:
    _, out = measured
    table = pd.read_csv(out.out_dir / "summary.csv")
    expected = ["strategy", "degrees", "world_size", "seq_len", "batch", "mode", "recompute", "status",
                "source", "peak measured (MiB)", "peak predicted (MiB)", "prediction error (%)",
                "step measured (ms)", "step predicted (ms)", "step error (%)", "tokens/s per rank",
                "TFLOP/s per rank", "comm per step (MiB)", "rank-hours per 1e9 tokens", "rank-hours source",
                "energy per token (J)", "energy source"]  # fmt: skip
    assert list(table.columns) == expected  # no MFU: measured records have none
    assert len(table) == len(LAYOUTS) * len(SEQS)
    assert list(dict.fromkeys(table["strategy"])) == ["dp", "tp", "tp_sp", "tsp", "ring9"]
    assert table.loc[table["strategy"] == "tp_sp", "degrees"].iloc[0] == "tp2 x sp2"
    oom = table[table["status"] == "oom"]
    assert len(oom) == 2 and oom["peak measured (MiB)"].isna().all()
    assert sorted(oom["peak predicted (MiB)"]) == [420.0, 900.0]
    tsp = table[(table["strategy"] == "tsp") & (table["seq_len"] == 1024)].iloc[0]
    assert tsp["prediction error (%)"] == pytest.approx(2.0)  # k = 3: predicted 2% over measured
    assert table.loc[table["status"] == "failed", "tokens/s per rank"].isna().all()
    md = (out.out_dir / "summary.md").read_text().splitlines()
    assert md[0] == "| " + " | ".join(expected) + " |"
    assert len(md) == 2 + len(table)


def test_figures_exist_and_are_valid_png_and_svg(measured: tuple[Path, object]) -> None:
    _, out = measured
    assert set(out.figures) == MEASURED_FIGURES
    assert set(out.skipped) == {"scaling", "microbatch", "timeline_gantt"}
    for name, (png, svg) in out.figures.items():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        height, width = mpimg.imread(png).shape[:2]
        assert height > 300 and width > 500, name
        assert ET.parse(svg).getroot().tag == "{http://www.w3.org/2000/svg}svg", name
    index = (out.out_dir / "report.md").read_text()
    assert "(summary.md)" in index and "(summary.csv)" in index
    assert all(f"({name}.png)" in index for name in MEASURED_FIGURES)
    assert "scaling" in index  # named among those not drawn


def oom_marks(fig: mpl.figure.Figure) -> list[tuple[float, float]]:
    marks = [c for ax in fig.axes for c in ax.collections if isinstance(c, PathCollection)]
    return [tuple(xy) for c in marks for xy in c.get_offsets()]


def test_oom_points_are_marked(measured: tuple[Path, object]) -> None:
    exp, _ = measured
    df = prepare(load(exp))
    ctx = context(df)
    with mpl.rc_context(report_style.RC):
        memory = report_figures.memory_vs_seq(df, ctx)
        speed = report_figures.throughput_vs_seq(df, ctx)
    ax = memory.axes[0]
    bottom, top = ax.get_ylim()
    marks = sorted(oom_marks(memory))
    assert [round(x) for x, _ in marks] == [2048, 4096]
    assert marks[0][1] == pytest.approx(420)  # at its predicted peak, in MiB
    assert marks[1][1] == pytest.approx(900)  # 900 MiB is beyond 2x capacity: still at its value...
    assert ax.get_yscale() == "log" and bottom < 420 and top > 900  # ...inside a log axis
    assert any(line.get_ydata()[0] == pytest.approx(300) for line in ax.lines)  # the capacity line
    labels = [t.get_text() for t in memory.legends[0].get_texts()]
    assert any(label.startswith("out of memory") for label in labels)
    assert any(label.startswith("simulated capacity") for label in labels)
    strip = [c for c in speed.axes[0].collections if isinstance(c, PathCollection)]
    assert [round(x) for c in strip for x, _ in c.get_offsets()] == [2048, 4096]  # no throughput...
    assert speed.axes[0].get_ylim()[0] < 0  # ...in the strip below zero


@pytest.mark.slow
def test_rerun_gives_identical_bytes_in_process_and_from_the_cli(
    measured: tuple[Path, object], tmp_path: Path
) -> None:
    exp, out = measured
    again = report(exp, tmp_path / "again")
    cli = tmp_path / "cli"
    done = subprocess.run([sys.executable, "-m", "tspbench", "report", str(exp), "--out", str(cli)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    files = sorted(p.name for p in out.out_dir.iterdir())
    assert len(files) == 4 + 2 * len(MEASURED_FIGURES)  # report.md, 2 tables, the list of them (#45)
    for name in files:
        first = (out.out_dir / name).read_bytes()
        assert (again.out_dir / name).read_bytes() == first, name
        assert (cli / name).read_bytes() == first, name


@pytest.mark.slow
def test_predicted_sweep_draws_scaling_and_microbatch(tmp_path: Path) -> None:
    yaml = tmp_path / "tiny.yaml"
    yaml.write_text(
        "name: tiny_predict\nmodel: {preset: 1b}\n"
        "settings: {seq_len: 65536, mode: train, recompute: none, dtype: bfloat16, device: cuda}\n"
        "sweep:\n  grid: {batch: [1, 2], dp: [1, 2]}\n"
        "  zip:\n    - layout: [{strategy: tsp, tsp: 4}, {strategy: tp, tp: 4}]\n"
        "run: {warmup: 1, steps: 1, repeats: 1, timeout: 60}\nexecutor: predict\nhardware: h100\n"
    )
    assert main(["run", str(yaml), "--results", str(tmp_path / "results")]) == 0
    (tmp_path / "results" / "tiny_predict" / "report").mkdir()
    (tmp_path / "results" / "tiny_predict" / "report" / "memory_parity.png").write_bytes(b"stale")
    # written by an earlier report (on its list): a file the report did not write is kept (#45)
    (tmp_path / "results" / "tiny_predict" / "report" / ".tspbench-report").write_text("memory_parity.png\n")
    out = report(tmp_path / "results" / "tiny_predict")
    assert {"scaling", "microbatch", "comm_by_op", "memory_breakdown"} <= set(out.figures)
    assert "memory_parity" in out.skipped  # nothing measured
    assert not (out.out_dir / "memory_parity.png").exists()  # a stale figure does not linger
    table = pd.read_csv(out.out_dir / "summary.csv")
    assert "MFU (%)" in table and "peak measured (GiB)" not in table
    assert set(table["source"]) == {"predicted"}
    assert (table["status"] == "oom").any()
    assert table.loc[table["status"] == "oom", "peak predicted (GiB)"].notna().all()
    assert table.loc[table["status"] == "oom", "tokens/s per GPU"].isna().all()


@pytest.mark.slow
def test_results_root_reports_each_experiment_and_links_them(tmp_path: Path) -> None:
    for name in ("alpha", "beta"):
        write_experiment(tmp_path / "results", name, ["tp", "tsp"], (1024,))
    out = report(tmp_path / "results", tmp_path / "out")
    assert [c.out_dir.name for c in out.experiments] == ["alpha", "beta"]
    assert all((c.out_dir / "summary.csv").exists() for c in out.experiments)
    assert "memory_vs_seq" in out.experiments[0].skipped  # one length only
    index = out.index.read_text()
    assert "(alpha/report.md)" in index and "(beta/report.md)" in index


@pytest.mark.slow
def test_cli_exit_codes(measured: tuple[Path, object], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["report", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no such results folder" in err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no stored runs" in capsys.readouterr().err
    exp, _ = measured
    shutil.copytree(exp, tmp_path / "copy", ignore=shutil.ignore_patterns("report"))
    assert main(["report", str(tmp_path / "copy")]) == 0
    assert (tmp_path / "copy" / "report" / "report.md").exists()


def test_degrees_and_series_labels() -> None:
    row = {"strategy": "tsp", "dp": 128, "tp": 1, "sp": 1, "tsp": 8}
    assert degrees_text("tsp", pd.Series(row)) == "tsp8 x dp128"
    assert degrees_text("tsp", row, with_dp=False) == "tsp8"
    tp_sp = {"strategy": "tp_sp", "dp": 1, "tp": 8, "sp": 1, "tsp": 1}
    assert degrees_text("tp_sp", tp_sp) == "tp8 x sp1"  # its own axes always, even at 1
    assert degrees_text("dp", {"dp": 1}) == "dp1"
    assert series_label("tp_sp", "tp8 x sp1") == "tp_sp tp8 x sp1 (= tp8)"  # plain TP, said so
    assert series_label("tp_sp", "tp1 x sp4 x dp2") == "tp_sp tp1 x sp4 x dp2 (= sp4 x dp2)"
    assert series_label("tp_sp", "tp2 x sp4") == "tp_sp tp2 x sp4"
    assert series_label("tsp", "tsp8 x dp2") == "tsp8 x dp2"
    assert series_label("ring9", "tsp4") == "ring9 tsp4"


def test_strategy_colors_are_fixed_and_third_party_ones_distinct() -> None:
    one = report_style.strategy_style(["tsp", "ring9", "tp"])
    two = report_style.strategy_style(["zeta", "ring9", "dp", "tsp"])
    assert one["tsp"] == two["tsp"] == (report_style.STRATEGY_COLORS["tsp"], "o")
    known = {report_style.STRATEGY_COLORS[s] for s in report_style.KNOWN_STRATEGIES}
    assert one["ring9"][0] not in known and two["zeta"][0] not in {*known, two["ring9"][0]}
    assert len(known) == len(report_style.KNOWN_STRATEGIES)


def test_byte_unit_follows_the_typical_value() -> None:
    assert report_style.byte_unit([60 * MiB, 70 * MiB, 1.1 * 2**30]) == ("MiB", float(MiB))
    assert report_style.byte_unit([20 * 2**30, 90 * 2**30]) == ("GiB", float(2**30))
