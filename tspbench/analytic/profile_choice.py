"""Which hardware profile a point is priced on: chosen once per point, at the edge (the CLI, the
sweep's executors, the checks), and passed down as an object to everything that prices it (the
analytic model, the timeline, MFU), so one record is priced on one profile and says which and
why (``hardware_choice``).

The rule (``choose_profile``):

    measured point        the profile the user names (``--hardware``, the experiment's
                          ``hardware:``), else the one of its device: ``cpu`` for a CPU run, the
                          shipped profile whose name is a word of the GPU's name ("NVIDIA H200"
                          -> h200), else (a GPU no profile describes) the paper's MI300X, said so
    fake-world or         the profile the user names, else the experiment's, else the paper's
    predicted point       MI300X for a (simulated) GPU and ``cpu`` for a fake CPU world

MFU divides by the chosen profile's peak only where that profile is the device's own
(``of_device``: named or matched, and of the device's kind, a CPU profile having
``cores_per_node``); elsewhere a record has no MFU and says why (tspbench.analytic.mfu).

A stored record names the profile it was priced on (``timeline_hardware``, ``predicted_hardware``,
``hardware``) and is re-priced on that one (``record_profile``, ``named_profile``): a profile a
check or a file names is loaded as named, with no rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tspbench.analytic.hardware import Hardware, available_hardware, load_hardware

PAPER_GPU = "mi300x"  # the paper's GPU: what a simulated GPU is priced on when nothing is named
HOST = "cpu"  # this kind of host (calibrate measured it)


@dataclass(frozen=True)
class HardwareChoice:
    """A point's profile: what its analytic time, its timeline and its MFU are all priced on."""

    hardware: Hardware
    label: str  # the name or .yaml path it was loaded by: records store it to load it again
    reason: str  # which profile and why, in a few words: the record's ``hardware_choice``
    of_device: bool  # the profile describes the device the point ran on (its peak is the MFU's)


def choose_profile(
    named: str | None,
    *,
    device: str,
    measured: bool,
    device_name: str = "",
    experiment: str | None = None,
) -> HardwareChoice:
    """The profile of one point by the module's rule, loaded once. ``device``: the point's
    (``cpu`` or ``cuda``); ``device_name``: what a measured point ran on ("NVIDIA H200"), which
    picks its profile when none is named."""
    label, why, own = _rule(named, device, measured, device_name, experiment)
    hw = load_hardware(label)
    of_device = (hw.cores_per_node is not None) == (device == "cpu") if own is None else own
    return HardwareChoice(hw, label, f"{label} profile ({why})", of_device)


def _rule(
    named: str | None, device: str, measured: bool, device_name: str, experiment: str | None
) -> tuple[str, str, bool | None]:
    """(the profile's name or path, why, whether it is the device's: None where its kind says)."""
    if named:
        return named, "the profile named", None
    if experiment:
        return experiment, "the experiment's hardware", None
    if device == "cpu":
        return HOST, "this kind of host" if measured else "a fake CPU world: this kind of host", True
    match = device_match(device_name) if measured else None
    if match:
        return match, f"matched by the device name {device_name!r}", True
    if measured:
        return (
            PAPER_GPU,
            f"the paper's GPU: no profile matches the device {device_name!r}; give --hardware",
            False,
        )
    return PAPER_GPU, "the paper's GPU, for a simulated one", False


def device_match(device_name: str) -> str | None:
    """The shipped (or TSPBENCH_HARDWARE_PATH) profile whose name is a word of ``device_name``."""
    words = device_name.lower().replace("-", " ").split()
    return next((name for name in available_hardware() if name in words), None)


def profile_name(record: Mapping[str, Any]) -> str:
    """The hardware profile a stored ``record`` was priced on: ``timeline_hardware``, else
    ``hardware``, else what a record that names none was priced on (``cpu`` for a CPU run, the
    paper's MI300X for a GPU)."""
    for key in ("timeline_hardware", "hardware"):
        value = record.get(key)
        if isinstance(value, str) and value:
            return value
    return HOST if record["device"] == "cpu" else PAPER_GPU


def record_profile(record: Mapping[str, Any]) -> Hardware:
    """The profile a stored record (a result.json, a report row) names (``profile_name``)."""
    return named_profile(profile_name(record))


def named_profile(name_or_path: str) -> Hardware:
    """The profile a stored record, a check or a file names, loaded as named (no rule applies)."""
    return load_hardware(name_or_path)
