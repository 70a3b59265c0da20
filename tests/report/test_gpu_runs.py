"""The report's page of runs on a lent GPU (tspbench.report.gpu_runs), from the committed H200
records: every bench record a row with its own numbers, gpu-check's summaries as written, a
damaged record named instead of drawn, and the results root's index linking the page."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tspbench.report.build import report
from tspbench.report.gpu_runs import gpu_run_folders, write_gpu_runs

REPO = Path(__file__).resolve().parents[2]
RUN = "2026-12-04_dd1d213"


def copied_root(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    shutil.copytree(REPO / "results" / "h200", root / "h200")
    return root


def test_each_bench_record_is_a_row_with_its_own_errors(tmp_path: Path) -> None:
    root = copied_root(tmp_path)
    page, damaged = write_gpu_runs(root, tmp_path / "out")
    text = page.read_text()
    section = text.split(f"## h200/{RUN}")[1]
    runs = sorted(
        p.name for p in (root / "h200").iterdir() if (p / "bench").is_dir() or (p / "gpu_check").is_dir()
    )
    assert damaged == [] and [p.name for p in gpu_run_folders(root)] == runs and RUN in runs
    for path in sorted((root / "h200" / RUN / "bench").glob("*.json")):
        r = json.loads(path.read_text())
        row = next(line for line in section.splitlines() if line.startswith(f"| {path.name} |"))
        assert f"{1e3 * r['step_time_s']:,.1f}" in row
        assert f"{100 * r['predicted_step_time_error']:+.1f}" in row and r["attention_kernel"] in row
    assert (root / "h200" / RUN / "gpu_check" / "summary.md").read_text().strip() in section


def test_the_page_opens_with_the_test_set_scored_on_the_shipped_profile(tmp_path: Path) -> None:
    """Every row of results/h200/scores.md and op_scores.md (`tspbench check gpu-points`) is on
    the page, before the first run's section."""
    root = copied_root(tmp_path)
    page, _ = write_gpu_runs(root, tmp_path / "out")
    head = page.read_text().split("## h200/")[0]
    for table in ("scores.md", "op_scores.md"):  # every measured point, and every step's kinds
        rows = [x for x in (root / "h200" / table).read_text().splitlines() if x.startswith("| 2026")]
        assert rows and all(row in head for row in rows)


def test_a_damaged_record_is_named_and_the_rest_drawn(tmp_path: Path) -> None:
    root = copied_root(tmp_path)
    bad = root / "h200" / RUN / "bench" / "b1_1b_8k_train.json"
    bad.write_text("{")
    page, damaged = write_gpu_runs(root, tmp_path / "out")
    assert len(damaged) == 1 and damaged[0].startswith(str(bad))
    assert "| b2_7b_32k_infer.json |" in page.read_text()


def test_the_results_root_report_links_the_page(tmp_path: Path) -> None:
    root = copied_root(tmp_path)
    shutil.copytree(REPO / "results" / "cpu_out_of_sample", root / "cpu_out_of_sample")
    out = report(root, tmp_path / "out")
    assert "- [measured on a lent GPU](gpu_runs.md)" in out.index.read_text()
    assert (tmp_path / "out" / "gpu_runs.md").is_file()
