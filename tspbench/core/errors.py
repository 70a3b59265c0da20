"""The errors tspbench raises for bad input. The CLI prints any UsageError as one line, exit 2.

UsageError            bad input of any kind (a flag, a file, a value)
├── LayoutError       a layout that cannot run this workload (degrees, divisibility)
├── WorkloadError     a workload value out of range (dtype, mode, batch, sequence)
├── HardwareError     an unknown or malformed hardware profile
└── ExperimentError   a bad experiment file or cluster profile (names the file and key)
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2, before anything is launched."""


class LayoutError(UsageError, ValueError):
    """A layout that cannot run: raised before anything is launched, naming what was wrong."""


class WorkloadError(UsageError, ValueError):
    """A workload value that is not allowed (dtype, mode, recomputation, sizes)."""


class HardwareError(UsageError, ValueError):
    """An unknown hardware profile, or one with a missing, unknown or bad field."""


class ExperimentError(UsageError):
    """Bad experiment or cluster-profile input: one line naming the file and key path."""
