"""The timeline's op-level check: replayed compute by kind against torch.profiler, on real steps.

Every strategy at world size 4 (the small preset, 2,048 tokens, float32 training, gloo on this
host's cores): each rank traces one step (tspbench.measure.trace) and profiles three more
(torch.profiler, the median self time of each aten op). Per strategy and kind (GEMM, attention,
element-wise), the replayed kernel seconds (the timeline's replay of the traced steps on the
profile given, at the share of the host each kind had, summed over ranks) against the profiled
self seconds of every aten op of that kind (an op the trace sees whole is timed by the profiler
in the ops it calls). The result goes to results/timeline_check/ops.json and ops.md.

    python benchmarks/timeline_checks.py [--hardware cpu] [--seq-len 2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tspbench.analytic.hardware import load_hardware
from tspbench.analytic.timeline import timeline
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.dist.launch import launch
from tspbench.measure import opcosts

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
TOLERANCE = 0.15


def check(layout: Layout, workload: Workload, hardware: str, repeats: int) -> dict[str, object]:
    ranks = launch(opcosts.profiled_rank, layout.world_size, layout, workload, repeats, timeout=1800)
    tl = timeline([r["trace"] for r in ranks], load_hardware(hardware), layout.world_size)
    replayed = {k: sum(tl.kind_s[r].get(k, 0.0) for r in tl.kind_s) for k in KINDS}
    profiled = {k: 0.0 for k in KINDS}
    for r in ranks:
        for kind, seconds in opcosts.kind_seconds(r["seconds"]).items():
            if kind in profiled:
                profiled[kind] += seconds
    errors = {k: replayed[k] / profiled[k] - 1 for k in KINDS if profiled[k] > 0}
    return {"layout": layout.describe(), "replayed_s": replayed, "profiled_s": profiled, "error": errors}


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
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", default="cpu")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/timeline_check"))
    args = parser.parse_args()
    workload = Workload(ModelConfig.preset("small"), 1, args.seq_len, "train", "none", "float32")
    rows = []
    for layout in LAYOUTS:
        rows.append(check(layout, workload, args.hardware, args.repeats))
        print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ops.json").write_text(json.dumps({"hardware": args.hardware, "rows": rows}, indent=2))
    (args.out / "ops.md").write_text(table(rows, args.hardware))
    print(table(rows, args.hardware))


if __name__ == "__main__":
    main()
