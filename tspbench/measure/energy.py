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

import os
import re
from collections.abc import Callable
from pathlib import Path

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
        return _amdsmi(device) if torch.version.hip else _nvml(device)
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


def _nvml(device: torch.device) -> EnergyMeter:
    try:
        import pynvml
    except ImportError:
        return EnergyMeter(None, None, "pynvml is not installed (pip install nvidia-ml-py)")
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except pynvml.NVMLError as exc:
        return EnergyMeter(None, None, f"NVML energy counter unavailable: {exc}")
    return EnergyMeter("nvml", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) * 1e-3)


def _amdsmi(device: torch.device) -> EnergyMeter:
    try:
        import amdsmi
    except ImportError:
        return EnergyMeter(None, None, "amdsmi is not installed")
    try:
        amdsmi.amdsmi_init()
        handle = amdsmi.amdsmi_get_processor_handles()[device.index or 0]

        def read() -> float:
            count = amdsmi.amdsmi_get_energy_count(handle)
            return count["energy_accumulator"] * count["counter_resolution"] * 1e-6

        read()
    except Exception as exc:  # amdsmi raises its own AmdSmiException and IndexError alike
        return EnergyMeter(None, None, f"amdsmi energy counter unavailable: {exc}")
    return EnergyMeter("amdsmi", read)
