"""The timeline's op-level check: replayed compute by kind against torch.profiler, on real steps.

Every strategy at world size 4 (the small preset, 2,048 tokens, float32 training, gloo on this
host's cores): each rank traces one step (tspbench.measure.trace) and profiles three more
(torch.profiler, the median self time of each aten op), in each of ``--runs`` launches (every
other one in reverse layout order; their spread is the measurement's own repeatability).

Per strategy and kind (GEMM, attention, element-wise): the replayed kernel seconds (the
timeline's replay of the traced steps on the profile given, at the share of the host each kind
had, summed over ranks) against the profiled self seconds of every aten op of that kind, mean
over launches (an op the trace sees whole is timed by the profiler in the ops it calls). Beside
it, where each rank's unprofiled step went (tspbench.measure.schedstat: on a core, waiting for
one, asleep on a collective) against the replay's compute and idle time. The result goes to
results/timeline_check/ops.json and ops.md, the first launch's traces to traces/<layout>.npz;
``--reprice`` replays those again with the current code and profile, measuring nothing.

With ``--calibrate PATH`` it first measures this host into a profile (tspbench calibrate, the
settings of the committed ``cpu`` profile) and prices the replay with that: this host's speed
drifts by a third from day to day, and the profile a check is priced on should be measured with
the host in the state the check finds it, as the step-level studies' is.

    tspbench check timeline-ops [--hardware cpu] [--seq-len 2048] [--repeats 3] [--runs 2]
                                [--calibrate results/timeline_check/cpu_same_run.yaml]
    tspbench check timeline-ops --reprice [--hardware cpu]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tspbench.analytic.hardware import Hardware
from tspbench.analytic.replayed import reprice as replay
from tspbench.analytic.timeline import Costs, Timeline, kind_seconds
from tspbench.calibrate import opcosts
from tspbench.core.errors import UsageError
from tspbench.core.files import read_input_text
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.core.trace import RankTrace, load_traces, save_traces
from tspbench.dist.launch import launch
from tspbench.measure import schedstat
from tspbench.report.tables import oncore_table, oncore_worst, schedule_table

LAYOUTS = [
    Layout("dp", dp=4),
    Layout("fsdp", fsdp=4),
    Layout("fsdp_sp", sp=4),
    Layout("tp", tp=4),
    Layout("sp", sp=4),
    Layout("tp_sp", tp=2, sp=2),
    Layout("tsp", tsp=4),
]
KINDS = ("gemm", "attention", "elementwise")
SCHEDULE_INTRO = (
    "Where each rank's unprofiled step went, mean over the 4 ranks, measured (Linux schedstat: busy = on "
    "a core or waiting for one; blocked = asleep, on a collective or a peer) and replayed (busy = the "
    "compute lane; blocked = the rest):"
)
ONCORE_INTRO = (
    "The same split in two: each op on a core (the replay's price of it on a device of its own, against "
    "its measured on-core time: the rank thread's CPU clock around each op, tspbench.calibrate.opclock) "
    "and how much longer it took on the wall than on a core (measured: the same ops' wall clock; "
    "replayed: the share of the host the replay gave it):"
)
TOLERANCE = 0.15


def check(layout: Layout, runs: list[list[dict]], hw: Hardware) -> dict[str, object]:
    """One layout's row from its ``runs`` (each: every rank's profiled_rank): the profiled self
    time by kind, mean over runs, how far the runs are apart (the measurement's own repeatability
    on this host), and the replay of the first run's traces against it (``replayed``)."""
    passes = [kind_totals(run) for run in runs]
    row: dict[str, object] = {
        "layout": layout.describe(),
        "world_size": layout.world_size,
        "profiled_s": {k: statistics.mean(p[k] for p in passes) for k in KINDS},
        "profiled_runs_s": passes,
    }
    if all("clocked" in r for run in runs for r in run):
        for which, key in (("cpu", "oncore_s"), ("wall", "clocked_wall_s")):
            clocked = [kind_totals(run, which) for run in runs]
            row[key] = {k: statistics.mean(c[k] for c in clocked) for k in KINDS}
    if len(runs) > 1:
        row["repeat_spread"] = {k: max(p[k] for p in passes) / min(p[k] for p in passes) - 1 for k in KINDS}
    if all(r["schedule"] for run in runs for r in run):
        measured = [measured_schedule(run) for run in runs]
        row["schedule"] = {"measured": {k: statistics.mean(m[k] for m in measured) for k in measured[0]}}
    return replayed(row, [r["trace"] for r in runs[0]], hw)


def replayed(row: dict, traces: list[RankTrace], hw: Hardware) -> dict:
    """``row`` with the replay of ``traces`` on ``hw``: kernel seconds by kind against the
    profiled ones, and the replayed schedule beside the measured one."""
    tl = replay(row, traces, hw)
    seconds = {k: sum(tl.kind_s[r].get(k, 0.0) for r in tl.kind_s) for k in KINDS}
    profiled = row["profiled_s"]
    errors = {k: seconds[k] / profiled[k] - 1 for k in KINDS if profiled[k] > 0}
    out = {**row, "replayed_s": seconds, "error": errors}
    if "oncore_s" in row:
        alone = [kind_seconds(t, Costs(hw, row["world_size"]), alone=True) for t in traces]
        out["replayed_alone_s"] = {k: sum(a.get(k, 0.0) for a in alone) for k in KINDS}
    if "schedule" in row:
        out["schedule"] = {**row["schedule"], "replayed": replayed_schedule(tl)}
    return out


def trace_path(out: Path, layout: str) -> Path:
    return out / "traces" / f"{layout.replace(' ', '_').replace('(', '_').replace(')', '')}.npz"


def kind_totals(ranks: list[dict], clock: str = "") -> dict[str, float]:
    """Profiled self seconds by kind, summed over ranks (``clock``: "wall" or "cpu", the ops'
    seconds on that clock of tspbench.calibrate.opclock instead)."""
    out = dict.fromkeys(KINDS, 0.0)
    for r in ranks:
        for kind, seconds in opcosts.kind_seconds(r["clocked"][clock] if clock else r["seconds"]).items():
            if kind in out:
                out[kind] += seconds
    return out


def measured_schedule(ranks: list[dict]) -> dict[str, float]:
    """Mean over ranks of an unprofiled step: wall, busy (on a core or waiting for one), asleep
    (blocked on a collective or a peer), and the CPU the rank's other (gloo's) threads ran."""
    mean = schedstat.mean_over_ranks([r["schedule"] for r in ranks])
    keys = ("busy_s", "blocked_s", "runqueue_s", "comm_threads_cpu_s")
    return {"step_s": mean["wall_s"], **{k: mean[k] for k in keys}}


def replayed_schedule(tl: Timeline) -> dict[str, float]:
    """The same in the replay, mean over ranks: the rank's end, its compute, the rest idle."""
    step = sum(tl.rank_end_s.values()) / len(tl.rank_end_s)
    return {"step_s": step, "busy_s": tl.mean_busy_s, "blocked_s": tl.mean_blocked_s}


def table(rows: list[dict], hardware: str) -> str:
    lines = [
        f"Replayed kernel seconds (timeline, profile `{hardware}`) against torch.profiler self time, "
        "summed over the 4 ranks, measured on this host:",
        "",
        "| layout | " + " | ".join(f"{k}: replayed / profiled s (error)" for k in KINDS) + " |",
        "|---|" + "---|" * len(KINDS),
    ]
    for r in rows:
        cells = [
            f"{r['replayed_s'][k]:.3f} / {r['profiled_s'][k]:.3f} ({r['error'][k]:+.1%})"
            if k in r["error"]
            else "-"
            for k in KINDS
        ]
        lines.append(f"| {r['layout']} | " + " | ".join(cells) + " |")
    worst = {k: max((abs(r["error"][k]) for r in rows if k in r["error"]), default=0.0) for k in KINDS}
    lines += ["", "Worst |error| by kind: " + ", ".join(f"{k} {v:.1%}" for k, v in worst.items())]
    if all("repeat_spread" in r for r in rows):
        spread = {k: max(r["repeat_spread"][k] for r in rows) for k in KINDS}
        launches = len(rows[0]["profiled_runs_s"])
        lines += [
            "",
            f"Profiled seconds are the mean of {launches} launches per layout; the largest spread between "
            "them by kind: " + ", ".join(f"{k} {v:.1%}" for k, v in spread.items()),
        ]
    if all("replayed_alone_s" in r for r in rows):
        worst = oncore_worst(rows)
        lines += ["", ONCORE_INTRO, "", oncore_table(rows), "", "Worst |error| on a core by kind: "
                  + ", ".join(f"{k} {v:.1%}" for k, v in worst.items())]  # fmt: skip
    if all("schedule" in r for r in rows):
        lines += ["", SCHEDULE_INTRO, "", schedule_table(rows)]
    return "\n".join(lines) + "\n"


def measure(
    out: Path,
    hw: Hardware,
    seq_len: int,
    repeats: int,
    runs: int,
    say: Callable[[str], None] = lambda _: None,
) -> list[dict]:
    """Trace and profile every layout in ``runs`` launches; keep the first launch's traces; replay
    them on the profile ``hw``. ``say`` hears one line per launch."""
    workload = Workload(ModelConfig.preset("small"), 1, seq_len, "train", "none", "float32")
    measured: dict[str, list[list[dict]]] = {layout.describe(): [] for layout in LAYOUTS}
    for n in range(runs):  # every other run in reverse order: the host's drift spreads over layouts
        for layout in LAYOUTS if n % 2 == 0 else LAYOUTS[::-1]:
            ranks = launch(opcosts.profiled_rank, layout.world_size, layout, workload, repeats,
                           timeout=1800)  # fmt: skip
            measured[layout.describe()].append(ranks)
            say(f"run {n + 1}/{runs}: {layout.describe()}")
    for name, launches in measured.items():
        save_traces(trace_path(out, name), [r["trace"] for r in launches[0]], {"layout": name})
    return [check(layout, measured[layout.describe()], hw) for layout in LAYOUTS]


CALIBRATE_TIMEOUT_S = 4 * 3600


def calibrate(out: Path, seq_len: int) -> None:
    """``tspbench calibrate`` with the committed cpu profile's settings, into ``out``."""
    settings = ["--ranks", "4", "--model", "small", "--seq-len", str(seq_len), "--max-seq-len", "8192"]
    command = [sys.executable, "-m", "tspbench", "calibrate", *settings, "--name", out.stem]
    command += ["--out", str(out)]
    try:  # minutes of measuring; a calibrate that hangs or fails is one line, not a traceback (#45)
        subprocess.run(command, check=True, timeout=CALIBRATE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        raise UsageError(f"--calibrate {out}: tspbench calibrate did not finish: {exc}") from None


def reprice(out: Path, hw: Hardware) -> list[dict]:
    """The stored rows replayed again from their stored traces on the profile ``hw`` (nothing
    measured)."""
    stored = json.loads(read_input_text(out / "ops.json"))["rows"]
    traces = {row["layout"]: load_traces(trace_path(out, row["layout"]))[0] for row in stored}
    return [replayed(row, traces[row["layout"]], hw) for row in stored]


def write(out: Path, hardware: str, rows: list[dict]) -> str:
    """ops.json and ops.md into ``out``; returns the table (ops.md's text)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "ops.json").write_text(json.dumps({"hardware": hardware, "rows": rows}, indent=2))
    text = table(rows, hardware)
    (out / "ops.md").write_text(text)
    return text
