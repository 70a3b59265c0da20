"""gpu-check's op-level rows: what the timeline prices each kind of op at, against what the
device spent on it.

    ops/S   S in OP_STRATEGIES, one training step at world 1 (on a GPU: the 7B cut to 4 layers
            at 8K tokens, bf16): torch.profiler's device time of the step's GEMMs, attention
            and element-wise ops, each op the trace records timed whole with the ops it calls,
            as calibrate times it (tspbench.calibrate.opcosts.kind_seconds), against the same
            step's trace replayed on the run's own calibrated profile
            (tspbench.analytic.timeline): each kind within OP_LEVEL_TOLERANCE on a GPU; the
            details keep every element-wise op name's calls, traced bytes, profiled and
            replayed seconds (``by_op``), from which its rate can be read again

Off a GPU it runs on the tiny model as a smoke test, without a pass mark: on a shared 2-core
host the self time of an op varies by more than the tolerance from run to run.
"""

from __future__ import annotations

import numpy as np

from tspbench.analytic import prices
from tspbench.analytic.hardware import Hardware
from tspbench.analytic.profile_choice import HardwareChoice
from tspbench.analytic.replay_costs import Costs, kernel_seconds
from tspbench.analytic.timeline import timeline
from tspbench.calibrate.opcosts import kind_seconds, profiled_rank
from tspbench.checks.gpu_plan import Check, Plan
from tspbench.core.spec import Layout
from tspbench.core.trace import COMPUTE, ELEMENTWISE, RankTrace
from tspbench.dist.launch import launch

OP_STRATEGIES = ("dp", "tsp", "fsdp")
OP_LEVEL_TOLERANCE = 0.10
KINDS = ("gemm", "attention", "elementwise")
REPEATS = 3


def op_level_check(p: Plan, strategy: str, hardware: HardwareChoice | None) -> Check:
    """The ops/S row (module doc)."""
    name = f"ops/{strategy}"
    if hardware is None:
        return Check(name, "skipped", "needs the profile calibrate writes (its check failed)")
    workload = p.memory.with_(seq_len=8192) if p.device == "cuda" else p.validate
    layout = Layout(strategy)
    rank = launch(profiled_rank, 1, layout, workload, REPEATS, True, device=p.device, timeout=900)[0]
    profiled = {k: kind_seconds(rank["seconds"]).get(k, 0.0) for k in KINDS}
    replay = timeline([rank["trace"]], hardware.hardware, 1)
    replayed = {k: sum(by_kind.get(k, 0.0) for by_kind in replay.kind_s.values()) for k in KINDS}
    errors = {k: replayed[k] / profiled[k] - 1 for k in KINDS if profiled[k] > 0}
    point = f"{workload.model.name} at {workload.seq_len} tokens"
    by_op = elementwise_by_op(rank["trace"], hardware.hardware, rank["seconds"])
    where = {"model": workload.model.name.split("-")[0], "n_layers": workload.model.n_layers,
             "batch": workload.batch, "seq_len": workload.seq_len}  # fmt: skip
    details = {"profiled_s": profiled, "replayed_s": replayed, "error": errors, "point": point,
               "by_op": by_op, "workload": where}  # fmt: skip
    summary = f"{layout.describe()}, {point}: replayed / profiled - 1: " + ", ".join(
        f"{k} {errors[k]:+.1%}" for k in KINDS if k in errors
    )
    if p.device != "cuda":
        return Check(name, "measured", summary + " (no pass mark off a GPU)", details)
    ok = len(errors) == len(KINDS) and all(abs(e) <= OP_LEVEL_TOLERANCE for e in errors.values())
    return Check(name, "passed" if ok else "failed", f"{summary} (limit {OP_LEVEL_TOLERANCE:.0%})", details)


def elementwise_by_op(
    trace: RankTrace, hw: Hardware, seconds: dict[str, float] | None = None
) -> dict[str, dict]:
    """Per element-wise op name of ``trace``: calls, traced bytes, the GB/s and the seconds the
    replay prices them at on ``hw``, and with ``seconds`` (a profiled step's, by name) its profiled
    seconds."""
    replayed, ev = kernel_seconds(trace, Costs(hw, 1), alone=True), trace.events
    ops = (ev["kind"] == COMPUTE) & (ev["cls"] == ELEMENTWISE)
    out = {}
    for index in np.unique(ev["name"][ops]).tolist():
        mask, name = ops & (ev["name"] == index), trace.names[index]
        out[name] = {
            "calls": int(mask.sum()),
            "bytes": float(ev["nbytes"][mask].sum()),
            "priced_gbs": prices.elementwise_gbs(hw, name),
            "replayed_s": float(replayed[mask].sum()),
        }
        if seconds is not None:
            out[name]["profiled_s"] = seconds.get(name, 0.0)
    return out
