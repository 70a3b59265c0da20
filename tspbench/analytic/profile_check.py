"""A hardware profile's values checked by meaning, not only by shape (#45).

A profile reaches every price the models quote, so a value of the right type that means nothing
must be refused where the file is read, naming the key and what is allowed: ``gpus_per_node:
0.5`` (a count: an integer, else it truncates to 0 and a price divides by it), a bandwidth of
5e-324 GB/s (a step of ``inf s``), a contention share of 50 (a rank's *share* of its device is at
most 1), a collective of an op no model prices, ``provenance`` that is not a mapping. The bounds
below are far outside any real device, and well inside what a float holds.
"""

from __future__ import annotations

import math
from typing import Any

from tspbench.core.fields import OPS

TFLOPS = (1e-6, 1e5)  # 1 MFLOP/s (a slow core) .. 100 PFLOP/s (no chip comes near)
GBS = (1e-6, 1e6)  # 1 KB/s .. 1 PB/s
MICROSECONDS = (0.0, 1e8)  # at most 100 s per call
BOUNDS = {
    "peak_tflops": TFLOPS,
    "gemm_tflops": TFLOPS,
    "attention_tflops": TFLOPS,
    "step_gemm_tflops": TFLOPS,
    "hbm_bandwidth_gbs": GBS,
    "intra_node_bandwidth_gbs": GBS,
    "inter_node_bandwidth_gbs": GBS,
    "intra_node_latency_us": MICROSECONDS,
    "inter_node_latency_us": MICROSECONDS,
    "op_overhead_us": MICROSECONDS,
    "host_overhead_us": MICROSECONDS,
    "launch_us": MICROSECONDS,
    "graph_kernel_us": MICROSECONDS,
    "graph_replay_us": MICROSECONDS,
    "memory_bytes": (2**20, 2**50),  # 1 MiB .. 1 PiB per device
    "board_power_w": (1.0, 1e5),  # 1 W .. 100 kW per device
}
COUNTS = {"gpus_per_node": (1, 4096), "cores_per_node": (1, 2**20)}


class BadField(ValueError):
    """A profile value that is not allowed: 'KEY: what is allowed, got VALUE'."""


def number(key: str, value: Any, low: float, high: float, low_open: bool = False) -> float:
    """``value`` if it is a finite number in [low, high] (``low_open``: (low, high]), else BadField."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadField(f"{key}: expected a number, got {value!r}")
    if not math.isfinite(value):
        raise BadField(f"{key}: expected a finite number, got {value!r}")
    if value < 0 or (value == 0 and (low_open or low > 0)):  # the sign first: it says the most
        raise BadField(f"{key}: must be {'> 0' if low_open or low > 0 else '>= 0'}, got {value!r}")
    if value < low or value > high or (low_open and value == low):
        opening = "(" if low_open else "["
        raise BadField(f"{key}: must be in {opening}{low:g}, {high:g}], got {value!r}")
    return value


def positive(key: str, value: Any, zero_ok: bool = False) -> float:
    """A finite number > 0 (``zero_ok``: >= 0) within the key's bounds (BOUNDS, else 1e12)."""
    low, high = BOUNDS.get(key.split(".")[0], (0.0, 1e12))
    if zero_ok:
        return number(key, value, 0.0, high)
    return number(key, value, low, high, low_open=low == 0)


def count(key: str, value: Any, low: int = 1, high: int = 2**20) -> int:
    """An integer in [low, high]: a count of ranks, cores or a group's size is never a fraction."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadField(f"{key}: expected an integer, got {value!r}")
    if not low <= value <= high:
        raise BadField(f"{key}: must be an integer in [{low}, {high}], got {value!r}")
    return value


def shares(key: str, entry: Any) -> dict[int, float]:
    """{ranks on a node: each rank's share of its device}: ranks an integer >= 1, a share in (0, 1]."""
    if entry is None:
        return {}
    if not isinstance(entry, dict):
        raise BadField(f"{key}: expected a mapping of ranks to a share in (0, 1], got {entry!r}")
    return {
        count(f"{key} key", k): number(f"{key}.{k}", v, 0.0, 1.0, low_open=True) for k, v in entry.items()
    }


def table(key: str, entry: Any) -> dict[int, float]:
    """{size (an integer >= 1): a rate > 0} (empty when absent)."""
    if entry is None:
        return {}
    if not isinstance(entry, dict):
        raise BadField(f"{key}: expected a mapping of sizes to numbers, got {entry!r}")
    return {count(f"{key} key", k, high=2**40): number(f"{key}.{k}", v, *TFLOPS) for k, v in entry.items()}


def strings(key: str, entry: Any, kind: type) -> Any:
    """``provenance`` (a mapping of keys to text) or ``sources`` (a list of text)."""
    if entry is None:
        return kind()
    if kind is dict and isinstance(entry, dict):
        return {str(k): str(v) for k, v in entry.items()}
    if kind is list and isinstance(entry, list):  # an item with ': ' in it reads as a mapping: kept as text
        return [str(s) for s in entry]
    want = "a mapping of keys to text" if kind is dict else "a list of text"
    raise BadField(f"{key}: expected {want}, got {entry!r}")


def collective(index: int, entry: Any, names: list[str], required: set[str]) -> dict[str, Any]:
    """One measured collective: a known op, integer group and world sizes (group <= world),
    latency and bus bandwidth in range."""
    where = f"collectives[{index}]"
    if not isinstance(entry, dict) or not required <= set(entry) <= set(names):
        raise BadField(f"{where}: expected keys {names} (batched_latency_us optional), got {entry!r}")
    if entry["op"] not in OPS:
        raise BadField(f"{where}.op: must be one of {', '.join(OPS)}, got {entry['op']!r}")
    world = count(f"{where}.world_size", entry["world_size"])
    group = count(f"{where}.group_size", entry["group_size"], high=world)
    out = {"op": entry["op"], "group_size": group, "world_size": world}
    out["latency_us"] = number(f"{where}.latency_us", entry["latency_us"], *MICROSECONDS)
    out["bandwidth_gbs"] = number(f"{where}.bandwidth_gbs", entry["bandwidth_gbs"], *GBS)
    if entry.get("batched_latency_us") is not None:
        out["batched_latency_us"] = number(
            f"{where}.batched_latency_us", entry["batched_latency_us"], *MICROSECONDS
        )
    return out


def collectives(entry: Any, names: list[str], required: set[str]) -> list[dict[str, Any]]:
    """The ``collectives`` list (empty when absent)."""
    if entry is None:
        return []
    if not isinstance(entry, list):
        raise BadField(f"collectives: expected a list of measured collectives, got {entry!r}")
    return [collective(i, c, names, required) for i, c in enumerate(entry)]
