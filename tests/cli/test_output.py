"""What a user reads from the command line (issue #36): every rejected layout of a plan, help
for every flag, sizes in the unit that suits them, the time model's error beside the memory
model's, the commit in --version and in every record, the sbatch jobs a dry run would submit,
and the recomputation mode in sweep progress and status.

Expected values come from elsewhere than the code that prints: the --json output of the same
command, git, the experiment and cluster profile files, submitit, or numbers written here.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import subprocess
from pathlib import Path

import pytest
import yaml

import tspbench
from tspbench.cli.bench_text import figures
from tspbench.cli.main import build_parser, main
from tspbench.core.units import format_bytes, readable_sizes

ROOT = Path(__file__).resolve().parents[2]
GIB, MIB, KIB = 2**30, 2**20, 2**10


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def _output(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


# ----------------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    "nbytes, shown",
    [
        (137169.1 * MIB, "134.0 GiB"),  # the peak at GPU scale, once printed in MiB
        (182.4 * GIB, "182.4 GiB"),
        (5.5 * GIB, "5.50 GiB"),
        (1536, "1.50 KiB"),  # once "0.000 GiB"
        (1.3 * MIB, "1.30 MiB"),
        (385.2 * KIB, "385.2 KiB"),
        (512, "512 B"),
        (0, "0 B"),
        (1023.99 * MIB, "1.00 GiB"),  # rounds to 1024.0 MiB: the next unit instead
        (3 * 2**40, "3.00 TiB"),
    ],
)
def test_a_size_is_printed_in_the_unit_that_suits_it(nbytes: float, shown: str) -> None:
    assert format_bytes(nbytes) == shown


CLI = ROOT / "tspbench" / "cli"
# backtest compares with published figures, which are given in GiB
PRINTS_BYTES = [p for p in sorted(CLI.glob("*.py")) if p.name not in ("backtest.py",)]


@pytest.mark.parametrize("path", PRINTS_BYTES, ids=lambda p: p.name)
def test_the_cli_scales_no_size_by_hand(path: Path) -> None:
    """One helper prints sizes: no command divides by 2**20 or 2**30 or labels a number MiB/GiB."""
    text = path.read_text()
    by_hand = re.findall(r"2 ?\*\* ?(?:20|30)\b|\bGIB\b|\} ?[KMG]iB", text)
    assert not by_hand, f"{path.name}: {by_hand} (use tspbench.core.units.format_bytes)"


def test_a_reason_in_raw_bytes_reads_in_the_tables_units() -> None:
    """The issue's stored reason: 111,909,279,744 B is 104.22 GiB, 81,604,378,624 B 76.00 GiB."""
    stored = "predicted peak 111,909,279,744 B exceeds usable 81,604,378,624 B"
    assert readable_sizes(stored) == "predicted peak 104.2 GiB exceeds usable 76.0 GiB"
    assert readable_sizes("tried 512 B; 2 ranks") == "tried 512 B; 2 ranks"  # small sizes stay in bytes


# ----------------------------------------------------------------------------- out of memory

OOM_STUDY = """
name: oom_rows
hardware: mi300x
executor: predict
model: {preset: 7b}
settings: {batch: 1, seq_len: 131072, mode: train, recompute: none, dtype: bfloat16, device: cuda}
sweep:
  zip:
    - layout: [{strategy: tp, tp: 8}, {strategy: tsp, tsp: 8}]
"""


def _cells_after(line: str, word: str) -> list[str]:
    return line.split(f" {word} ", 1)[1].split()


def test_out_of_memory_rows_print_no_time_or_throughput_and_say_why_in_gib(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The paper's 7B at 128K without recomputation: TP 8 does not fit an MI300X (its peak is
    over 182 GiB), TSP 8 does. The OOM row keeps its peak and leaves step and throughput blank,
    in run's table and in status's; status names each row's source and the reason in GiB."""
    study = tmp_path / "oom.yaml"
    study.write_text(OOM_STUDY)
    out = _output(["run", str(study), "--results", str(tmp_path)], capsys).splitlines()
    with open(tmp_path / "oom_rows" / "records.csv") as f:
        records = {r["strategy"]: r for r in csv.DictReader(f)}
    assert records["tp"]["status"] == "oom" and records["tsp"]["status"] == "completed"
    peak, usable = (float(records["tp"][k]) / GIB for k in ("peak_memory_bytes", "capacity_bytes"))
    rows = [ln for ln in out if not ln.startswith("[")]  # the table, not the progress lines
    tp, tsp = (next(ln for ln in rows if records[s]["run_id"] in ln) for s in ("tp", "tsp"))
    assert _cells_after(tp, "oom") == [f"{peak:.1f}", "GiB"], tp  # no step_ms, no tok/s/gpu
    assert len(_cells_after(tsp, "completed")) == 4, tsp  # step_ms, tok/s/gpu, peak

    table = _output(["status", str(tmp_path / "oom_rows")], capsys).splitlines()
    assert table[0].split()[-6:] == ["status", "source", "attempt", "step_ms", "peak", "error"]
    tp = next(ln for ln in table if records["tp"]["run_id"] in ln)
    reason = f"predicted peak {peak:.1f} GiB exceeds usable {usable:.1f} GiB"
    assert _cells_after(tp, "oom")[:4] == ["predicted", "1", f"{peak:.1f}", "GiB"], tp  # no step_ms
    assert tp.rstrip().endswith(reason), tp
    tsp = next(ln for ln in table if records["tsp"]["run_id"] in ln)
    assert _cells_after(tsp, "completed")[:2] == ["predicted", "1"], tsp


def test_stored_reasons_in_raw_bytes_show_in_gib(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A store written before #46 holds its reasons in bytes (results/paper_memory's OOM points
    do): status shows them in GiB all the same, from the stored bytes."""
    study = tmp_path / "oom.yaml"
    study.write_text(OOM_STUDY)
    _output(["run", str(study), "--results", str(tmp_path)], capsys)
    (status,) = [p for p in (tmp_path / "oom_rows").glob("*/status.json") if '"oom"' in p.read_text()]
    stored = json.loads(status.read_text())
    result = json.loads((status.parent / "result.json").read_text())
    peak, usable = result["peak_memory_bytes"], result["capacity_bytes"]
    stored["error"] = f"predicted peak {peak:,} B exceeds usable {usable:,} B"  # as written before #46
    status.write_text(json.dumps(stored))
    table = _output(["status", str(tmp_path / "oom_rows")], capsys).splitlines()
    line = next(ln for ln in table if " oom " in ln)
    assert line.rstrip().endswith(f"peak {peak / GIB:.1f} GiB exceeds usable {usable / GIB:.1f} GiB")
    assert " B " not in line


def test_report_says_what_it_wrote_and_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One table in two formats is one table; the figures are counted from the folder itself."""
    study = tmp_path / "oom.yaml"
    study.write_text(OOM_STUDY)
    _output(["run", str(study), "--results", str(tmp_path)], capsys)
    lines = _output(["report", str(tmp_path / "oom_rows")], capsys).splitlines()
    folder = tmp_path / "oom_rows" / "report"
    pngs = sorted(p.stem for p in folder.glob("*.png"))
    assert pngs and sorted(p.stem for p in folder.glob("*.svg")) == pngs
    head, names = lines[0].split(" .png and .svg: ")
    assert head == f"{folder}/: the summary table (summary.csv, summary.md); {len(pngs)} figures, each as"
    assert sorted(names.split(", ")) == pngs
    assert lines[-1] == f"open {folder / 'report.md'}: every table and figure, with what each shows"
    assert (folder / "report.md").is_file() and "tables" not in lines[0]


# ----------------------------------------------------------------------------- plan


PLAN = ["plan", "--gpus", "64", "--seq-len", "32768", "--top", "3"]


def test_plan_lists_every_rejected_layout_under_its_reason(capsys: pytest.CaptureFixture[str]) -> None:
    plan = json.loads(_output([*PLAN, "--json"], capsys))
    text = _output(PLAN, capsys).splitlines()
    by_kind: dict[str, int] = {}
    for r in plan["rejected"]:
        kind = r["reason"].split(":")[0]
        by_kind[kind] = by_kind.get(kind, 0) + 1
    assert len(by_kind) >= 2, by_kind  # this cluster has layouts out of memory and across nodes

    head = next(i for i, line in enumerate(text) if line.startswith("rejected: "))
    assert text[head] == f"rejected: {len(plan['rejected'])}, by reason:", text[head]
    listed: dict[str, int] = {}
    kind = ""
    for line in text[head + 1 :]:
        if line.startswith("    "):  # one rejected layout
            listed[kind] += 1
        elif line.startswith("  ") and line.rstrip().endswith(":"):  # a reason, with its count
            kind = line.strip().split(" (")[0]
            listed[kind] = 0
            count = int(re.search(r"\((\d+)", line).group(1))
            assert count == by_kind[kind], line
        else:
            break
    assert listed == by_kind
    assert sum(listed.values()) == len(plan["rejected"])


def test_plan_says_how_many_fitting_layouts_it_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    ranked = len(json.loads(_output([*PLAN, "--json"], capsys))["ranked"])
    assert ranked > 3
    assert f"... {ranked - 3} more that fit (--top {ranked} lists them)" in _output(PLAN, capsys)


def test_plan_decode_lists_every_rejected_layout(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan-decode", "--gpus", "16", "--seq-len", "32768", "--batch", "16", "--top", "2"]
    rejected = json.loads(_output([*argv, "--json"], capsys))["rejected"]
    text = _output(argv, capsys)
    assert f"rejected: {len(rejected)}, by reason:" in text
    assert len([line for line in text.splitlines() if line.startswith("    ")]) == len(rejected)


def test_plan_peaks_are_printed_in_gib(capsys: pytest.CaptureFixture[str]) -> None:
    peaks = [r["peak_memory_bytes"] for r in json.loads(_output([*PLAN, "--json"], capsys))["ranked"][:3]]
    text = _output(PLAN, capsys).splitlines()
    head = next(i for i, line in enumerate(text) if line.startswith("rank "))
    rows = text[head + 1 : head + 4]
    for peak, row in zip(peaks, rows, strict=True):
        assert f"{peak / GIB:.1f} GiB" in row, row


MI300X_PLAN = ["plan", "--model", "7b", "--gpus", "64", "--gpus-per-node", "8", "--seq-len", "131072"]


def test_plan_gives_its_answers_before_the_rejected_layouts_each_naming_its_setting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = _output([*MI300X_PLAN, "--hardware", "mi300x", "--recompute", "selective"], capsys).splitlines()
    blocks = [line.split(" (")[0].split(":")[0].split("  ")[0] for line in text if not line.startswith(" ")]
    answers = ["fastest layouts that fit", "rank", "memory frontier", "crossover"]
    assert blocks[1:] == [*answers, "rejected"], blocks  # the rejected layouts last
    for line in text:
        if line.startswith(("fastest", "memory frontier", "crossover")):
            assert "train, recompute selective" in line, line


def test_plan_frontier_stops_at_max_seq_len_and_says_when_nothing_fits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The issue's plan on MI300X: TSP 8 fits far past the 7B's 139,264 positions (it once said
    359,424); the frontier says 139,264 and that it is the cap. On an H100 the 7B's plain DDP
    replica (every weight, gradient and Adam state on one GPU) fits not even 1,024 tokens."""
    result = json.loads(_output([*MI300X_PLAN, "--hardware", "mi300x", "--json"], capsys))
    assert result["frontier"]["tsp"]["8"] == 139264 == result["frontier_cap"]
    fits = ["predict", "--model", "7b", "--strategy", "tsp", "--tsp", "8", "--seq-len", "139264"]
    assert json.loads(_output([*fits, "--hardware", "mi300x", "--json"], capsys))["fits"]
    text = _output([*MI300X_PLAN, "--hardware", "mi300x"], capsys)
    capped = r"4: 139,264 \(max_seq_len\)  8: 139,264 \(max_seq_len\)"
    assert re.search(rf"^  tsp +2: [\d,]+  {capped}$", text, re.M), text
    assert "359,424" not in text

    ddp = ["predict", "--model", "7b", "--strategy", "dp", "--seq-len", "1024", "--dtype", "bfloat16"]
    assert not json.loads(_output([*ddp, "--hardware", "h100", "--json"], capsys))["fits"]
    text = _output(
        ["plan", "--model", "7b", "--gpus", "8", "--seq-len", "4096", "--hardware", "h100"], capsys
    )
    assert re.search(r"^  dp +1: does not fit$", text, re.M), text
    assert not re.search(r"\d: 0\b", text)


MY_COMMANDS = ("env", "validate", "bench", "gpu-check", "predict", "plan", "calibrate", "plan-decode", "run")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", MY_COMMANDS)
def test_every_flag_has_help(command: str) -> None:
    parser = _subparsers()[command]
    flags = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    assert flags
    bare = [a.option_strings[-1] for a in flags if not a.help or a.help == argparse.SUPPRESS]
    assert not bare, f"tspbench {command}: no help for {bare}"


DEFAULTS = [
    ("bench", "tiny", "float32", "predict prices GPUs"),
    ("predict", "7b", "bfloat16", "bench defaults"),
]


@pytest.mark.parametrize("command, model, dtype, why", DEFAULTS)
def test_bench_and_predict_help_say_their_defaults(command: str, model: str, dtype: str, why: str) -> None:
    """The defaults the parsers hold, said in --help; the dtypes differ, and each help says why."""
    parser = _subparsers()[command]
    assert parser.get_default("model") == model and parser.get_default("dtype") == dtype
    text = " ".join(parser.format_help().split())
    assert f"model preset (default {model})" in text
    assert f"(default {dtype}" in text and why in text


def test_plan_help_names_what_each_asked_about_flag_means() -> None:
    text = _subparsers()["plan"].format_help()
    for flag in ("--gpus", "--seq-len", "--batch", "--mode", "--recompute"):
        assert flag in text
    for word in ("selective", "full", "infer", "prefill", "micro-batch", "plan-decode"):
        assert word in text, word


# ----------------------------------------------------------------------------- bench


def _bench_record(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, target: str
) -> tuple[dict, str]:
    """Run ``bench`` for its --json record, then print that record as a user sees it (the step is
    not run twice: a second run would measure other times)."""
    record = json.loads(_output([*argv, "--json"], capsys))
    monkeypatch.setattr(target, lambda *args, **kwargs: record)
    return record, _output(argv, capsys)


def test_bench_gives_the_time_models_error_beside_the_memory_models(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["bench", "--strategy", "dp", "--steps", "2", "--warmup", "1"]
    r, text = _bench_record(argv, capsys, monkeypatch, "tspbench.measure.bench.bench")
    assert r["status"] == "completed"
    predicted_error = r["predicted_step_time_s"] / r["step_time_s"] - 1
    memory_error = r["predicted_peak_memory_bytes"] / r["peak_memory_bytes"] - 1
    assert f"({memory_error:+.1%})" in text
    assert f"({predicted_error:+.1%} vs measured)" in text, text
    peak = r["peak_memory_bytes"] / MIB  # a tiny model's peak: MiB, not GiB
    assert 1 <= peak < 1024 and f"{peak:.{1 if peak >= 10 else 2}f} MiB" in text, text
    assert "GiB" not in text
    for label in (r"TFLOP/s/GPU ([\d.,]+)", r"of ([\d.,]+) TFLOP/s/GPU"):  # achieved, and the peak MFU is of
        shown = re.search(label, text).group(1).replace(",", "")
        value = r["tflops_per_gpu"] if label.startswith("TFLOP") else r["mfu_peak_tflops"]
        assert float(shown) == pytest.approx(value, rel=5e-3), (shown, value)
        assert value >= 100 or len(shown.replace(".", "").lstrip("0")) <= 3, shown  # 0.0935, not 0.093542


@pytest.mark.parametrize(
    "value, shown",
    [(0.093542, "0.0935"), (1.2549, "1.25"), (12.34, "12.3"), (989.4, "989"), (1979.0, "1,979"), (0.0, "0")],
)
def test_bench_rates_have_three_significant_figures(value: float, shown: str) -> None:
    assert figures(value) == shown


def test_bench_fake_gives_the_time_models_error_against_the_replayed_step(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["bench", "--fake", "--strategy", "tp", "--tp", "2"]
    r, text = _bench_record(argv, capsys, monkeypatch, "tspbench.cli.measure.bench_fake")
    assert r["status"] == "completed" and r["timeline_step_time_s"] and r["predicted_step_time_s"]
    error = r["predicted_step_time_s"] / r["timeline_step_time_s"] - 1
    assert f"({error:+.1%} vs the replay)" in text, text
    assert "0.000" not in text  # tiny sizes in KiB/MiB, not fractions of a GiB
    assert re.search(r"\d KiB", text) and re.search(r"\d MiB", text), text


# ----------------------------------------------------------------------------- the commit


def test_version_names_the_commit(capsys: pytest.CaptureFixture[str]) -> None:
    tspbench.version.cache_clear()  # worked out once per process; HEAD may have moved since
    short = _git("rev-parse", "--short", "HEAD")
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out == f"tspbench {tspbench.__version__}"
    assert out.endswith(f"+g{short}"), out


def test_a_projected_sweep_shows_recompute_and_records_the_commit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """experiments/paper_memory_fake.yaml (paper_memory's points at the layouts' defaults) varies
    recompute: each of its modes is a row of its own, in the progress lines, the run's summary and
    status; each projected record names the commit."""
    experiment = ROOT / "experiments" / "paper_memory_fake.yaml"
    modes = yaml.safe_load(experiment.read_text())["sweep"]["grid"]["recompute"]
    tspbench.version.cache_clear()
    argv = ["run", str(experiment), "--executor", "predict", "--results", str(tmp_path)]
    assert main([*argv, "--set", "sweep.grid.seq_len=[16384]"]) in (0, 1)
    progress = capsys.readouterr().out
    tp8 = [line for line in progress.splitlines() if " tp tp8 seq 16384 " in line and line.startswith("[")]
    assert sorted(re.search(r"recompute (\w+)", line).group(1) for line in tp8) == sorted(modes), tp8

    with open(tmp_path / "paper_memory_fake" / "records.csv") as f:
        records = list(csv.DictReader(f))
    assert len(records) == 6 * len(modes)
    head, short = _git("rev-parse", "HEAD"), _git("rev-parse", "--short", "HEAD")
    for r in records:
        assert r["source"] == "predicted" and r["env_git_sha"] == head, r["env_git_sha"]
        assert r["env_tspbench_version"].endswith(f"+g{short}")

    table = _output(["status", str(tmp_path / "paper_memory_fake")], capsys).splitlines()
    header = table[0].split()
    assert "recompute" in header and "peak" in header
    for line in table[1 : 1 + len(records)]:
        cells = dict(zip(header, line.split(), strict=False))
        record = next(r for r in records if r["run_id"] == cells["run_id"])
        assert cells["recompute"] == record["recompute"]
        peak = float(record["peak_memory_bytes"])  # 7B at 16K tokens: GiB on every GPU
        assert re.search(rf"\s{peak / GIB:.1f} GiB\s", line), line


# ----------------------------------------------------------------------------- slurm dry run


def test_a_slurm_dry_run_prints_the_sbatch_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two points of 2 ranks (1 node of the local profile's 2 ranks each) go out as one job array,
    the 4-rank point (2 nodes) as a single job, each asking sbatch for what the profile says."""
    profile = yaml.safe_load((ROOT / "slurm" / "local.yaml").read_text())
    data = {
        "name": "dry",
        "model": {"preset": "tiny"},
        "settings": {"seq_len": 256, "dtype": "float32", "device": "cpu"},
        "sweep": {
            "zip": [
                {
                    "layout": [
                        {"strategy": "dp", "dp": 2},
                        {"strategy": "tp", "tp": 2},
                        {"strategy": "tp", "tp": 4},
                    ]
                }
            ]
        },
        "run": {"timeout": 3600},  # an hour: the job asks for the profile's most, its time
        "executor": "slurm",
        "cluster": "local",
    }
    path = tmp_path / "dry.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    text = _output(["run", str(path), "--dry-run", "--results", str(tmp_path / "results")], capsys)
    worlds = {}
    for line in text.splitlines():
        cells = line.split()
        if cells and re.fullmatch(r"[0-9a-f]{10}", cells[0]):
            worlds[cells[0]] = int(cells[7])  # run_id strategy dp tp sp tsp fsdp world
    assert sorted(worlds.values()) == [2, 2, 4]

    assert "3 points to submit in 2 sbatch calls: 1 job array, 1 single job" in text, text
    jobs = re.split(r"\n  (?=\d+\. )", text[text.index("sbatch calls") :])[1:]
    assert len(jobs) == 2, text
    common = [f"--partition={profile['partition']}", f"--cpus-per-task={profile['cpus_per_task']}"]
    common.append(f"--time={profile['time']}")
    array, single = jobs
    pairs = [i for i, w in worlds.items() if w == 2]
    assert array.startswith("1. job array of 2 points, 1 node x 2 tasks"), array
    for option in [*common, "--nodes=1", "--ntasks-per-node=2", "--array=0-1%2"]:
        assert option in array.split(), (option, array)
    assert all(i in array for i in pairs)
    assert single.startswith("2. single job, 2 nodes x 2 tasks"), single
    for option in [*common, "--nodes=2", "--ntasks-per-node=2"]:
        assert option in single.split(), (option, single)
    four = next(i for i, w in worlds.items() if w == 4)
    assert four in single and "--array" not in single
    assert "--gpus-per-node" not in text  # a CPU profile asks for no GPU


def test_the_dry_runs_sbatch_options_are_those_submitit_writes(tmp_path: Path) -> None:
    """Each option the dry run prints is a line of the sbatch script submitit makes of the same
    parameters, for a profile with extras (qos, exclusive) and an array over its parallelism."""
    slurm_module = pytest.importorskip("submitit.slurm.slurm")
    make_script = getattr(slurm_module, "_make_sbatch_string", None)
    if make_script is None:
        pytest.skip("this submitit has no _make_sbatch_string")
    from tspbench.sweep.cluster import load_profile
    from tspbench.sweep.experiment import load_experiment
    from tspbench.sweep.points import expand
    from tspbench.sweep.slurm import submissions

    profile_path = tmp_path / "site.yaml"
    site = {"partition": "gpu", "gpus_per_node": 8, "time": 120, "constraint": "h100", "mem": "0"}
    site |= {"array_parallelism": 5, "extra": {"qos": "high", "exclusive": True}, "account": "proj"}
    profile_path.write_text(yaml.safe_dump(site))
    profile = load_profile(str(profile_path))
    points, _ = expand(load_experiment(str(ROOT / "experiments" / "paper_memory.yaml"), []), "measure", None)
    jobs = submissions(points, profile)
    assert sum(len(j.points) for j in jobs) == len(points)
    for job in jobs:
        params = job.parameters(profile)
        if len(job.points) > 1:
            params["map_count"] = len(job.points)
        script = make_script(command="true", folder=str(tmp_path / "%j"), **params)
        sbatch = {line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH")}
        options = job.sbatch_options(profile)
        assert set(options) <= sbatch, set(options) - sbatch
        assert "--qos=high" in options and "--exclusive" in options and "--account=proj" in options
        if len(job.points) > 1:
            assert f"--array=0-{len(job.points) - 1}%{min(len(job.points), 5)}" in options
        assert math.ceil(job.points[0].world_size / 8) == job.nodes
