"""Each aten op's wall and on-core seconds, as the step trace sees ops (tspbench.measure.trace).

torch.profiler's self time of an op is wall time: where ranks outnumber a host's cores it holds
the time the rank waited for a core in the middle of the op. ``OpClock`` times every aten op the
trace records (the outermost one, with what it calls) on two clocks: the wall (perf_counter) and
the calling thread's own CPU time (CLOCK_THREAD_CPUTIME_ID: on a core only). The on-core time is
what the op cost a core, with the memory and caches it shared with the ranks beside it; wall over
on-core is how long it waited for one. A rank's ops run on its own thread here (one intra-op
thread per rank; CPU autograd runs backward on the caller's thread), so its CPU time is theirs.
"""

from __future__ import annotations

import time
from collections import defaultdict

from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type


class OpClock(TorchDispatchMode):
    """Wall and on-core seconds of the aten ops run inside it, summed by op name (no overload)."""

    def __init__(self) -> None:
        super().__init__()
        self.wall_s: dict[str, float] = defaultdict(float)
        self.cpu_s: dict[str, float] = defaultdict(float)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            return NotImplemented  # a DTensor op: time the local ops it desugars into
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        out = func(*args, **(kwargs or {}))
        cpu, wall = time.thread_time_ns() - cpu, time.perf_counter_ns() - wall
        if func.namespace == "aten":
            name = func.overloadpacket.__name__
            self.cpu_s[name] += cpu * 1e-9
            self.wall_s[name] += wall * 1e-9
        return out
