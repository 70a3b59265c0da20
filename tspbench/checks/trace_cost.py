"""What tracing a fake-world step costs, and how fast the timeline replays it.

One rank of the 7B TSP 8 x 128 job at 128K tokens (bf16 training, full recomputation, simulated
CUDA) executed untraced and traced, interleaved; the trace's size on disk; then every rank of
the first model-parallel group traced and replayed on the MI300X and H100 profiles. Writes
results/timeline_check/trace_cost.json.

    tspbench check trace-cost [--rounds 2]
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from tspbench.analytic.profile_choice import choose_profile, named_profile
from tspbench.analytic.replayed import reprice
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.core.trace import load_traces
from tspbench.measure.fake import fake_bench

LAYOUT = Layout("tsp", tsp=8, dp=128)
WORKLOAD = Workload(ModelConfig.preset("7b"), 1, 131072, "train", "full", "bfloat16", "cuda")


def trace_cost(out: Path, rounds: int = 2) -> dict:
    """The rank executed untraced and traced ``rounds`` times each, the group traced and replayed;
    written to ``out`` (JSON) and returned."""
    tmp = Path(tempfile.mkdtemp())
    seconds: dict[bool, list[float]] = {False: [], True: []}
    hardware = choose_profile(None, device=WORKLOAD.device, measured=False)  # the paper's MI300X
    for _ in range(rounds):
        for traced in (False, True):
            record = fake_bench(
                LAYOUT,
                WORKLOAD,
                hardware,
                ranks=[0],
                trace=traced,
                trace_path=tmp / "rank0.npz" if traced else None,
            )
            seconds[traced].append(record["fake_seconds"])
    group = fake_bench(LAYOUT, WORKLOAD, hardware, trace_path=tmp / "group.npz")
    traces, _ = load_traces(tmp / "group.npz")
    replay = {}
    for name in ("mi300x", "h100"):
        start = time.perf_counter()
        reprice(group, traces, named_profile(name))
        replay[name] = time.perf_counter() - start
    result = {
        "point": f"{LAYOUT.describe()}, 7b, 131072 tokens, train, full recompute, bf16, simulated cuda",
        "rank_untraced_s": seconds[False],
        "rank_traced_s": seconds[True],
        "traced_over_untraced": statistics.median(seconds[True]) / statistics.median(seconds[False]),
        "rank_trace_bytes": (tmp / "rank0.npz").stat().st_size,
        "group_ranks": len(traces),
        "group_events": [len(t) for t in traces],
        "group_trace_bytes": (tmp / "group.npz").stat().st_size,
        "group_fake_seconds": group["fake_seconds"],
        "replay_seconds": replay,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return result
