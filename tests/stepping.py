"""One measured step per workload on a launched rank: what the fake world and the analytic model
are held against (tests/measure/test_fake.py, tests/analytic/test_predict.py).

One step is enough: while the memory tracker counts, tspbench's collectives run on staging
copies gloo never sees (tspbench.dist.comm.staging), so no buffer of the program dies late on
gloo's worker thread, and the same step peaks at the same byte every time
(tests/dist/test_comm.py::test_under_staging_no_program_tensor_dies_on_gloos_thread). Training is
measured on its second step, when the AdamW state exists: the FLOP count takes the first.
"""

from __future__ import annotations

from tspbench.core.spec import Layout, Workload
from tspbench.dist.comm import summarize
from tspbench.measure.runner import RankRun


def measure_steps(layout: Layout, workloads: list[Workload]) -> list[dict]:
    """Per workload on this rank: FLOPs (torch's FlopCounterMode, a step of its own), the measured
    step's MemoryReport and its collectives summarized (op, phase, group, size -> calls, bytes)."""
    out = []
    for workload in workloads:
        run = RankRun(layout, workload)
        flops = run.counted_flops()
        step = run.measured_step()
        out.append({"flops": flops, "memory": step.memory, "comm": summarize(step.comm)})
    return out


def measure_layouts(plan: list[tuple[Layout, list[Workload]]]) -> list[list[dict]]:
    """``measure_steps`` for several layouts of one world size in one launch (each layout builds
    its own groups), saving a launch per layout."""
    return [measure_steps(layout, workloads) for layout, workloads in plan]
