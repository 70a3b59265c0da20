"""The op-level test set: a step's device time by kind, measured on a GPU, against the timeline's
price of the same step's ops, kind by kind.

    measured   <run>/probes/op_kinds.json (tools/h200_probes.py op_kinds): one training step at
               world 1 per strategy under torch.profiler, its kernels' device time summed by
               kind (GEMM, attention, element-wise: every other kernel, the optimizer's too);
               and gpu-check's ops/S rows (<run>/gpu_check/ops_S.json), the same by aten op,
               each op the trace records timed whole
    replayed   the same point executed in the fake world (its simulated GPU calling the
               shipped profile's attention kernel), its trace priced by the timeline on the
               shipped profile (out of sample) and on the run's own calibration (gpu-check's
               profile.yaml, where the run finished one): each kind's kernel seconds

An error is replayed / measured - 1. The goal (tspbench.checks.gpu_ops.OP_LEVEL_TOLERANCE) is
each kind within 10%. Nothing is measured here: the probe is read back, the step is executed on
fake tensors and replayed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from tspbench.analytic.hardware import Hardware
from tspbench.analytic.timeline import timeline
from tspbench.checks.gpu_ops import KINDS, OP_LEVEL_TOLERANCE, elementwise_by_op
from tspbench.checks.gpu_points import same_run_profile
from tspbench.core.files import read_input_text, write_atomic
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.core.trace import RankTrace
from tspbench.dist.fake_world import run_fake_ranks
from tspbench.measure import fake_cuda
from tspbench.measure.fake import fake_rank, simulated_kernel
from tspbench.strategy import check_fake_world

PROBE = Path("probes") / "op_kinds.json"


def probe_workload(entry: dict) -> Workload:
    """The point a probe entry measured: its own ``point`` where it names one, else the point
    tools/h200_probes.py measured before it wrote one (the 7B cut to 4 layers, 8K, bf16)."""
    point = entry.get("point") or {"model": "7b", "n_layers": 4, "batch": 1, "seq_len": 8192}
    model = ModelConfig.preset(point["model"])
    if point.get("n_layers") and point["n_layers"] != model.n_layers:
        model = model.cut_to(point["n_layers"])
    return Workload(model, point["batch"], point["seq_len"], "train", "none", "bfloat16", "cuda")


def measured_entries(run: Path) -> list[dict]:
    """Every step of ``run`` measured by kind: {strategy, point, seconds_by_kind, source}."""
    out = []
    if (run / PROBE).is_file():
        out += [{**e, "source": "probe"} for e in json.loads(read_input_text(run / PROBE))]
    for path in sorted((run / "gpu_check").glob("ops_*.json")):
        check = json.loads(read_input_text(path))
        details = check.get("details") or {}
        if check.get("status") in ("passed", "failed") and details.get("workload"):
            out.append({"strategy": path.stem.removeprefix("ops_"), "point": details["workload"],
                        "seconds_by_kind": details["profiled_s"], "source": "gpu-check"})  # fmt: skip
    return out


def fake_trace(strategy: str, workload: Workload, shipped: Hardware) -> RankTrace:
    """The traced step of ``strategy`` at world 1 in the fake world, its simulated GPU calling
    ``shipped``'s attention kernel."""
    layout = Layout(strategy)
    check_fake_world(layout, workload)
    kernel = simulated_kernel(shipped)
    env = fake_cuda.preload_env(workload.device)
    return run_fake_ranks(fake_rank, [0], 1, layout, workload, None, True, kernel, env=env)[0]["trace"]


def replayed_kinds(trace: RankTrace, hw: Hardware) -> dict[str, float]:
    """The timeline's kernel seconds of each kind for one rank's step at world 1."""
    by_rank = timeline([trace], hw, 1).kind_s
    return {k: sum(kinds.get(k, 0.0) for kinds in by_rank.values()) for k in KINDS}


@dataclass
class Scores:
    """``kinds``: a row per (run, strategy, kind); ``ops``: a row per element-wise op name of each
    replayed step, its traced calls and bytes and its replayed seconds on the shipped profile."""

    kinds: list[dict] = field(default_factory=list)
    ops: list[dict] = field(default_factory=list)


def score(root: Path, shipped: Hardware) -> Scores:
    """Every step measured by kind under ``root`` (module doc)."""
    out = Scores()
    for run in sorted(p for p in root.iterdir() if p.is_dir()):
        profiles = {"shipped": shipped, "same_run": same_run_profile(run)}
        for entry in measured_entries(run):
            workload = probe_workload(entry)
            trace = fake_trace(entry["strategy"], workload, shipped)
            replayed = {label: replayed_kinds(trace, hw) for label, hw in profiles.items() if hw is not None}
            first = {"run": run.name, "source": entry["source"], "strategy": entry["strategy"],
                     "point": workload_name(workload)}  # fmt: skip
            for kind in KINDS:
                measured = entry["seconds_by_kind"].get(kind, 0.0)
                row = {**first, "kind": kind, "measured_s": measured}
                for label, seconds in replayed.items():
                    row[f"replayed_{label}_s"] = seconds[kind]
                    row[f"{label}_error"] = seconds[kind] / measured - 1 if measured > 0 else float("nan")
                out.kinds.append(row)
            ops = elementwise_by_op(trace, shipped)
            out.ops += [{**first, "op": name, **op} for name, op in ops.items()]
    return out


def workload_name(workload: Workload) -> str:
    return f"{workload.model.name} {workload.seq_len // 1024}K bf16"


def table(rows: list[dict]) -> str:
    """The rows as markdown: measured and replayed milliseconds, errors in %."""
    lines = [
        "| run | from | strategy | point | kind | measured | replayed, shipped | error "
        "| replayed, same run | error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["run"], r["source"], r["strategy"], r["point"], r["kind"]]
        cells.append(f"{1e3 * r['measured_s']:.1f} ms")
        for label in ("shipped", "same_run"):
            if f"{label}_error" in r:
                cells += [f"{1e3 * r[f'replayed_{label}_s']:.1f} ms", f"{r[f'{label}_error']:+.1%}"]
            else:
                cells += ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def within_goal(rows: list[dict], label: str = "shipped") -> dict[str, bool]:
    """Per kind: every row's error on ``label``'s profile within OP_LEVEL_TOLERANCE."""
    return {
        kind: all(abs(r[f"{label}_error"]) <= OP_LEVEL_TOLERANCE for r in rows if r["kind"] == kind)
        for kind in KINDS
    }


def write_scores(scores: Scores, out: Path) -> list[Path]:
    """op_scores.csv, op_scores.md and op_scores_elementwise.csv in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "op_scores.csv", pd.DataFrame(scores.kinds).to_csv(index=False))
    write_atomic(out / "op_scores.md", table(scores.kinds))
    write_atomic(out / "op_scores_elementwise.csv", pd.DataFrame(scores.ops).to_csv(index=False))
    return [out / name for name in ("op_scores.csv", "op_scores.md", "op_scores_elementwise.csv")]
