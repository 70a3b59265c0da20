"""The errors tspbench raises for bad input. The CLI prints any UsageError as one line, exit 2.

UsageError            bad input of any kind (a flag, a file, a value)
├── LayoutError       a layout that cannot run this workload (degrees, divisibility)
├── WorkloadError     a workload value out of range (dtype, mode, batch, sequence)
├── HardwareError     an unknown or malformed hardware profile
├── ExperimentError   a bad experiment file or cluster profile (names the file and key)
├── OutputError       an output that could not be written (names the path and the reason)
└── DamagedFileError  a stored file that does not read back (names the file)
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


class OutputError(UsageError, OSError):
    """An output that could not be written (a full disk, a read-only mount): one line naming the
    path and the reason. Still an OSError, so code that handles a failed write keeps doing so.
    Built as ``OutputError(errno, "cannot write PATH: REASON", PATH)``; prints as that line."""

    def __str__(self) -> str:
        return str(self.strerror)


class DamagedFileError(UsageError, ValueError):
    """A stored file (trace, record, profile, published runs) that does not read back: one line
    naming the file and what is wrong with it; commands that read many skip it and say so."""
