"""Measured MFU: a measured point's model FLOPs per second per device over its device's peak.

An MFU figure means nothing without its two conventions, so a record names both beside it:
``mfu_flop_convention`` (tspbench.costs.flops: causal attention as half the square, as
Megatron-LM counts it; torchtitan's whole square gives ~1.4x the MFU at 32K) and the peak it
divides by, ``mfu_peak_tflops`` with ``mfu_peak_source`` (which profile, why that one, and where
that profile's number comes from).

The peak is the point's profile (tspbench.analytic.profile_choice: the one its time and timeline
are priced on too) where that profile describes the device the point ran on: named, or matched
to the device ("NVIDIA H200" -> h200; ``cpu`` on CPU). CPUs have no datasheet peak: calibrate
records the GEMM rate one rank reaches alone on the host as ``peak_tflops``, so CPU MFU is
against the best achieved, and ranks sharing the host's cores cannot reach 1. Where the profile
is not the device's (a GPU no profile describes, a GPU's profile named for a CPU run), ``mfu`` is
None and ``mfu_peak_source`` says why.
"""

from __future__ import annotations

from tspbench.analytic.profile_choice import HardwareChoice
from tspbench.core.spec import Layout
from tspbench.costs.flops import MODEL_FLOP_CONVENTION, mfu

CPU_PEAK_NOTE = "the GEMM rate one rank reaches alone on this host, not a datasheet peak"


def mfu_fields(layout: Layout, record: dict, choice: HardwareChoice) -> dict[str, object]:
    """Measured ``mfu`` of a completed record, ``predicted_mfu`` beside it when the record has
    the model's step time (priced on the same profile), and what both divide."""
    hw, flops, world = choice.hardware, float(record["model_flops_per_step"]), layout.world_size
    out: dict[str, object] = {
        "mfu": None,
        "mfu_peak_tflops": None,
        "mfu_peak_source": f"no MFU: the {choice.reason} does not describe the device the point ran on",
        "mfu_flop_convention": MODEL_FLOP_CONVENTION,
    }
    if choice.of_device:
        note = f" ({CPU_PEAK_NOTE})" if hw.cores_per_node is not None else ""
        out.update(
            mfu=mfu(flops, float(record["step_time_s"]), world, hw.peak_tflops),
            mfu_peak_tflops=hw.peak_tflops,
            mfu_peak_source=f"{choice.reason}: {hw.source_of('peak_tflops')}{note}",
        )
    if record.get("predicted_step_time_s"):
        out["predicted_mfu"] = mfu(flops, float(record["predicted_step_time_s"]), world, hw.peak_tflops)
    return out
