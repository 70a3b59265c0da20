"""What a point costs: device-hours per token and energy per token, from a finished record.

    gpu_hours_per_btok     train / prefill: world_size x step seconds / tokens per step / 3600 x 1e9
    gpu_hours_per_mtok     decode: world_size x TPOT / generated tokens per step / 3600 x 1e6, where
                           a decode step generates one token per sequence (batch x dp); the prefill
                           is not counted (it is TTFT's), as the measured energy does not count it
    gpu_hours_source       'measured' (the record's measured step time) or 'projected (<how>)'
    energy_per_token_j     measured where the record holds a meter's reading (NVML, amdsmi, RAPL:
                           tspbench.measure.energy), else projected: the profile's board power x
                           world_size x the same seconds / the same tokens
    energy_per_token_source  'measured (NVML)' or 'projected (<profile> board power, <provenance>)'

No new price: the seconds are the record's own (measured, or priced by the model or the
timeline through tspbench.analytic.prices); this only turns seconds into hours and, with a power,
into joules. A record with no time (out of memory, a fake world without a timeline) gets
blanks, and a profile that states no board power (``board_power_w``: the cpu profile) no energy.
The report computes the same fields for records stored before them (tspbench.report.costs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cache
from typing import Any

from tspbench.analytic.hardware import Hardware
from tspbench.analytic.profile_choice import named_profile, profile_name
from tspbench.core.errors import HardwareError

SECONDS_PER_HOUR = 3600.0
PER_BILLION, PER_MILLION = 1e9, 1e6
METERS = {"nvml": "NVML", "amdsmi": "amdsmi", "rapl": "RAPL"}
COST_FIELDS = (
    "gpu_hours_per_btok",
    "gpu_hours_per_mtok",
    "gpu_hours_source",
    "energy_per_token_j",
    "energy_per_token_source",
)


def number(record: Mapping[str, Any], key: str) -> float | None:
    """``record[key]`` as a finite number > 0, else None (absent, null, NaN, text)."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def time_basis(record: Mapping[str, Any]) -> tuple[float, float, str] | None:
    """(seconds, tokens those seconds produce, where the seconds come from), or None: a decode
    step and the sequences it extends, else a step and its tokens; a fake world's from its
    replayed timeline (it times nothing)."""
    source = str(record.get("source") or "measured")
    hw = record.get("timeline_hardware") or record.get("hardware") or record.get("predicted_hardware")
    if record.get("mode") == "decode":
        seconds = number(record, "tpot_s") or number(record, "tpot_p50_s")
        tokens = (number(record, "batch") or 1) * (number(record, "dp") or 1)
        how = "decode model"
    else:
        fake = source == "fake"
        seconds = number(record, "timeline_step_time_s" if fake else "step_time_s")
        tokens, how = number(record, "tokens_per_step"), "timeline" if fake else "analytic model"
    if seconds is None or tokens is None:
        return None
    if source == "measured":
        return seconds, tokens, "measured"
    return seconds, tokens, f"projected ({how} on {hw})" if hw else f"projected ({how})"


def cost_fields(record: Mapping[str, Any], hw: Hardware | None) -> dict[str, object]:
    """The module's fields of one completed ``record`` priced on ``hw`` (the profile it was
    priced on, for the board power; None: none known): blanks where it has no time."""
    out: dict[str, object] = dict.fromkeys(COST_FIELDS)
    fits = record.get("status") == "completed" and record.get("fits") is not False  # a model's misfit
    basis = time_basis(record) if fits else None
    if basis is None:
        return out
    seconds, tokens, how = basis
    world = number(record, "world_size") or 1
    device_hours = world * seconds / tokens / SECONDS_PER_HOUR
    if record.get("mode") == "decode":
        out["gpu_hours_per_mtok"] = device_hours * PER_MILLION
    else:
        out["gpu_hours_per_btok"] = device_hours * PER_BILLION
    out["gpu_hours_source"] = how
    measured, meter = number(record, "energy_per_token_j"), record.get("energy_source")
    if measured is not None and isinstance(meter, str) and meter:
        out["energy_per_token_j"] = measured
        out["energy_per_token_source"] = f"measured ({METERS.get(meter, meter)})"
    elif hw is not None and hw.board_power_w:
        out["energy_per_token_j"] = hw.board_power_w * world * seconds / tokens
        kind = hw.source_of("board_power_w").split(":")[0]
        out["energy_per_token_source"] = f"projected ({hw.name} board power, {kind})"
    else:
        why = record.get("energy_unavailable")
        meter = f"no meter ({why}), and " if isinstance(why, str) and why else ""
        name = hw.name if hw is not None else "no"
        out["energy_per_token_source"] = f"none: {meter}the {name} profile states no board power"
    return out


def record_costs(record: Mapping[str, Any]) -> dict[str, object]:
    """``cost_fields`` on the profile the record names (``cost_profile``)."""
    return cost_fields(record, cost_profile(record_profile_name(record)))


def record_profile_name(record: Mapping[str, Any]) -> str:
    """The profile a record was priced on: the one it names (the timeline's, a predicted
    record's, else the model's beside a measurement: a measured H200 point names h200 there),
    else tspbench.analytic.profile_choice's default for its device."""
    for key in ("timeline_hardware", "hardware", "predicted_hardware"):
        value = record.get(key)
        if isinstance(value, str) and value:
            return value
    return profile_name({"device": record.get("device", "cpu")})


@cache
def cost_profile(name: str) -> Hardware | None:
    """The profile ``name``, loaded once; None where no profile has that name any more."""
    try:
        return named_profile(name)
    except HardwareError:
        return None
