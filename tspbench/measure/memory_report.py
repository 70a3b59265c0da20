"""A rank's peak memory over a window (MemoryReport, one flat record), and the CUDA caching
allocator's peaks (CudaPeak) with the categories the dispatch tracker (tspbench.measure.tracker)
saw at its own peak."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tspbench.core.names import CATEGORIES


@dataclass
class MemoryReport:
    """Peak bytes of one rank over a window, with the category totals at the moment of the peak."""

    peak_bytes: int
    by_category: dict[str, int] = field(default_factory=dict)
    reserved_bytes: int | None = None
    method: str = "cpu-dispatch"
    phase: str = ""  # the step phase (forward, backward, optimizer) the peak fell in
    phase_peaks: dict[str, int] = field(default_factory=dict)  # the highest live total in each phase
    tracked_bytes: int | None = None  # CUDA: the dispatch tracker's peak beside the allocator's

    def to_record(self, prefix: str = "peak_memory") -> dict[str, object]:
        record: dict[str, object] = {
            f"{prefix}_bytes": self.peak_bytes,
            f"{prefix}_method": self.method,
            f"{prefix}_phase": self.phase,
        }
        for cat in CATEGORIES:
            record[f"{prefix}_{cat}_bytes"] = self.by_category.get(cat, 0)
        for phase, nbytes in self.phase_peaks.items():
            record[f"{prefix}_in_{phase}_bytes"] = nbytes
        if self.reserved_bytes is not None:
            record[f"{prefix}_reserved_bytes"] = self.reserved_bytes
        if self.tracked_bytes is not None:
            record[f"{prefix}_tracked_bytes"] = self.tracked_bytes
            record[f"{prefix}_untracked_bytes"] = self.peak_bytes - self.tracked_bytes
        return record


class CudaPeak:
    """Allocator peaks on CUDA - allocated (what tensors hold) and reserved (what the cache holds)
    - with the categories taken at the peak by a dispatch tracker run beside the allocator.

    The allocator knows how much, not what: its peak is the record's peak, and the tracker's
    categories are what was live at the tracker's own peak (the same moment, up to what the
    tracker cannot see). ``tracked_bytes`` is the tracker's peak; the allocator's excess over it
    (cuBLAS and flash workspaces, NCCL buffers, allocation rounding) is recorded apart as
    ``peak_memory_untracked_bytes``, never spread over the categories.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __enter__(self) -> CudaPeak:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        torch.cuda.synchronize(self.device)

    def report(self, tracked: MemoryReport) -> MemoryReport:
        return allocator_report(
            torch.cuda.max_memory_allocated(self.device), torch.cuda.max_memory_reserved(self.device), tracked
        )


def allocator_report(allocated: int, reserved: int, tracked: MemoryReport) -> MemoryReport:
    """The allocator's peaks with the tracker's categories, phase and per-phase peaks at its peak."""
    return MemoryReport(
        allocated,
        dict(tracked.by_category),
        reserved,
        "cuda-allocator",
        tracked.phase,
        dict(tracked.phase_peaks),
        tracked_bytes=tracked.peak_bytes,
    )
