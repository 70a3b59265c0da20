"""What a measured CPU point asks of this host's memory, checked before any rank starts (#45).

Every rank of a CPU world is a process on this host, and its tensors are real: a batch the host
cannot hold is not an ``oom`` record but swapping, the kernel's OOM killer, or a terabyte
``malloc`` failing mid-step. The memory model (tspbench.costs.memory, within a few percent of
the tracker on CPU) prices the point before it runs: ``world_size`` ranks times the per-rank
peak (decode: with its KV cache) against what the host can allocate now (``MemAvailable``).
A simulated ``--capacity`` does not lower the bound: the tracker stops a step only after the
allocation that crosses it was made, and that one (the logits of a huge batch) may be most of
the peak. The single command (``bench``, ``validate``)
and a local sweep's points ask the same question here, so they share one bound.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from tspbench.core.spec import Layout, Workload
from tspbench.core.units import format_bytes
from tspbench.strategy import get_strategy

MEMINFO = Path("/proc/meminfo")


def available_bytes(meminfo: Path = MEMINFO) -> int:
    """What this host can allocate without swapping: ``MemAvailable`` (Linux), else its physical
    memory."""
    try:
        with meminfo.open("rb") as f:
            for line in f.read(1 << 16).decode(errors="replace").splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def rank_bytes(layout: Layout, workload: Workload) -> int:
    """The memory model's peak of one rank of the point (decode: with its KV cache)."""
    sized = get_strategy(layout.strategy).for_analysis(layout, workload)
    peak = sized.predict_memory().peak_bytes
    if workload.mode == "decode":
        peak += sized.cache_bytes()
    return peak


def host_bytes(layout: Layout, workload: Workload) -> int:
    """What the point's ranks hold on this host together: each is a process here."""
    return layout.world_size * rank_bytes(layout, workload)


def largest_batch(layout: Layout, workload: Workload, have: int) -> int:
    """The largest micro-batch of the point the host holds (0: not even 1); memory grows with
    the batch, so a bisection over [1, workload.batch]."""
    low, high = 0, workload.batch
    while low < high:
        mid = (low + high + 1) // 2
        if host_bytes(layout, dataclasses.replace(workload, batch=mid)) <= have:
            low = mid
        else:
            high = mid - 1
    return low


def memory_problem(layout: Layout, workload: Workload, have: int | None = None) -> tuple[str, str] | None:
    """(the setting to blame, ``batch`` or ``seq_len``; why the point does not fit this host), or
    None where it fits. ``have``: the bytes available (default: this host's, now)."""
    need = host_bytes(layout, workload)
    have = available_bytes() if have is None else have
    if need <= have:
        return None
    ranks = f"{layout.world_size} ranks x " if layout.world_size > 1 else ""
    per_rank = format_bytes(need // layout.world_size)
    why = (
        f"the memory model puts {ranks}{per_rank} on this host, more than the {format_bytes(have)} "
        "it has available"
    )
    most = largest_batch(layout, workload, have)
    if most:
        return "batch", f"{why}; a batch of at most {most:,} fits"
    return "seq_len", f"{why} even at batch 1; a shorter sequence or more ranks may fit"
