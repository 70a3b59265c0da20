"""Measured MFU: a measured point's model FLOPs per second per device over its device's peak.

An MFU figure means nothing without its two conventions, so a record names both beside it:
``mfu_flop_convention`` (tspbench.costs.flops: causal attention as half the square, as
Megatron-LM counts it; torchtitan's whole square gives ~1.4x the MFU at 32K) and the peak it
divides by, ``mfu_peak_tflops`` with ``mfu_peak_source`` (which profile, and where that
profile's number comes from).

The peak is the profile of the device the point ran on: the ``--hardware`` profile when it
describes that kind of device (a CPU profile has ``cores_per_node``, a GPU's has not), else
``cpu`` on CPU, else the shipped GPU profile whose name is a word of the device's name
("NVIDIA H200" -> h200). CPUs have no datasheet peak: calibrate records the GEMM rate one rank
reaches alone on the host as ``peak_tflops``, so CPU MFU is against the best achieved, and ranks
sharing the host's cores cannot reach 1. With no profile for a GPU, ``mfu`` is None and
``mfu_peak_source`` says why.
"""

from __future__ import annotations

from tspbench.analytic.hardware import Hardware, available_hardware, load_hardware
from tspbench.core.spec import Layout, Workload
from tspbench.costs.flops import MODEL_FLOP_CONVENTION, mfu

CPU_PEAK_NOTE = "the GEMM rate one rank reaches alone on this host, not a datasheet peak"


def device_profile(device: str, hardware: str | None, device_name: str) -> tuple[Hardware | None, str]:
    """The profile of the device a point ran on, and a line saying which and why."""
    cpu = device == "cpu"
    if hardware:
        hw = load_hardware(hardware)
        if (hw.cores_per_node is not None) == cpu:
            return hw, f"{hardware} profile (the run's hardware profile)"
    if cpu:
        return load_hardware("cpu"), "cpu profile (this kind of host)"
    words = device_name.lower().replace("-", " ").split()
    named = [name for name in available_hardware() if name in words]
    if named:
        return load_hardware(named[0]), f"{named[0]} profile (matched by the device name {device_name!r})"
    return None, f"no hardware profile for {device_name!r}: give --hardware (or the experiment's hardware)"


def mfu_fields(
    layout: Layout, workload: Workload, record: dict, hardware: str | None, device_name: str
) -> dict[str, object]:
    """Measured ``mfu`` of a completed record, ``predicted_mfu`` beside it when the record has
    the model's step time (for the ``hardware`` it was predicted for), and what both divide."""
    hw, why = device_profile(workload.device, hardware, device_name)
    flops, world = float(record["model_flops_per_step"]), layout.world_size
    out: dict[str, object] = {
        "mfu": mfu(flops, float(record["step_time_s"]), world, hw.peak_tflops) if hw else None,
        "mfu_peak_tflops": hw.peak_tflops if hw else None,
        "mfu_peak_source": why if hw is None else f"{why}: {hw.source_of('peak_tflops')}",
        "mfu_flop_convention": MODEL_FLOP_CONVENTION,
    }
    if hw is not None and hw.cores_per_node is not None:
        out["mfu_peak_source"] = f"{out['mfu_peak_source']} ({CPU_PEAK_NOTE})"
    if hardware and record.get("predicted_step_time_s"):
        peak = load_hardware(hardware).peak_tflops
        out["predicted_mfu"] = mfu(flops, float(record["predicted_step_time_s"]), world, peak)
    return out
