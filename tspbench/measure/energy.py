"""Energy counters for energy per token: read where the device reports them, never guessed.

    NVIDIA GPU   NVML's total energy counter of the rank's GPU (pynvml, millijoules)
    AMD GPU      amdsmi's energy accumulator of the rank's GPU (x its resolution, microjoules)
    CPU          Linux RAPL package counters (/sys/class/powercap/intel-rapl:N/energy_uj), read by
                 one rank per host (the packages are shared by every rank on it)

Otherwise the meter is unavailable and says why (no counter, not readable, library missing);
records then carry ``energy_per_token_j: null`` and ``energy_unavailable``. A GPU counter covers
the whole device, a RAPL counter the whole package: other work on them is counted too.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

RAPL_ROOT = Path("/sys/class/powercap")
_PACKAGE = re.compile(r"intel-rapl:\d+")


class EnergyMeter:
    """``read()``: joules since an arbitrary origin (monotonic, wrap-around handled), or None."""

    def __init__(self, source: str | None, read: Callable[[], float] | None, why: str = "") -> None:
        self.source, self._read, self.unavailable = source, read, why
        self.contributes = read is not None  # this rank's reading is summed into the world's

    def read(self) -> float | None:
        return self._read() if self._read is not None else None


def open_meter(device: torch.device, rank: int = 0) -> EnergyMeter:
    """The meter of this rank: its GPU's counter on CUDA/ROCm, else RAPL (local rank 0 only)."""
    if device.type == "cuda":
        return _gpu_meter("amdsmi" if torch.version.hip else "nvml", device)
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", rank)))
    meter = rapl_meter(RAPL_ROOT)
    if local != 0 and meter.source is not None:  # another rank of this host reads the packages
        return EnergyMeter(meter.source, None, "read by local rank 0")
    return meter


def rapl_meter(root: Path) -> EnergyMeter:
    """The sum of every RAPL package counter under ``root`` (wrap-around at max_energy_range_uj)."""
    found = root.glob("intel-rapl:*") if root.is_dir() else ()
    packages = sorted(p for p in found if _PACKAGE.fullmatch(p.name))
    if not packages:
        return EnergyMeter(None, None, f"no RAPL package counters under {root}")
    try:
        ranges = [int((p / "max_energy_range_uj").read_text()) for p in packages]
        for p in packages:
            int((p / "energy_uj").read_text())
    except (OSError, ValueError) as exc:
        return EnergyMeter(None, None, f"RAPL counters not readable: {exc}")
    state = {"last": [0] * len(packages), "total": [0] * len(packages), "started": False}

    def read() -> float:
        for i, p in enumerate(packages):
            now = int((p / "energy_uj").read_text())
            if state["started"]:
                delta = now - state["last"][i]
                state["total"][i] += delta if delta >= 0 else delta + ranges[i]
            state["last"][i] = now
        state["started"] = True
        return sum(state["total"]) * 1e-6

    return EnergyMeter("rapl", read)


def _nvml_counter(pynvml: ModuleType, index: int) -> Callable[[], float]:
    """NVML's total energy counter of GPU ``index``, in joules (it counts millijoules)."""
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) * 1e-3


def _amdsmi_counter(amdsmi: ModuleType, index: int) -> Callable[[], float]:
    """amdsmi's energy accumulator of GPU ``index`` times its resolution, in joules."""
    amdsmi.amdsmi_init()
    handle = amdsmi.amdsmi_get_processor_handles()[index]

    def read() -> float:
        count = amdsmi.amdsmi_get_energy_count(handle)
        return count["energy_accumulator"] * count["counter_resolution"] * 1e-6

    read()
    return read


# source -> (its library, why when that is missing, the counter's name in messages, how to open
# the counter (read once), what the library raises when the counter is unavailable: amdsmi raises
# its own AmdSmiException and IndexError alike)
_GPU_COUNTERS = {
    "nvml": ("pynvml", "pynvml is not installed (pip install nvidia-ml-py)", "NVML", _nvml_counter,
             lambda lib: lib.NVMLError),
    "amdsmi": ("amdsmi", "amdsmi is not installed", "amdsmi", _amdsmi_counter, lambda lib: Exception),
}  # fmt: skip


def _gpu_meter(source: str, device: torch.device) -> EnergyMeter:
    """``device``'s energy counter from ``source``'s library, or why there is none."""
    library, missing, label, counter, errors = _GPU_COUNTERS[source]
    try:
        lib = importlib.import_module(library)
    except ImportError:
        return EnergyMeter(None, None, missing)
    try:
        read = counter(lib, device.index or 0)
    except errors(lib) as exc:
        return EnergyMeter(None, None, f"{label} energy counter unavailable: {exc}")
    return EnergyMeter(source, read)
