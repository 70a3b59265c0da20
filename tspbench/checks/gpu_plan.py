"""What a gpu-check run covers (its ``Plan``) and what one of its checks gives (a ``Check``):
the types gpu_check.py, gpu_rows.py and gpu_ops.py share, in a module of their own so none of
them imports another for a type."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tspbench.core.spec import ModelConfig, Workload


@dataclass
class Check:
    """One check's outcome: passed, failed, skipped (with the reason) or measured (no pass mark)."""

    name: str
    status: str
    summary: str
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """What the run covers: the device, the world of the group checks, the two workloads."""

    device: str
    world: int
    validate: Workload
    memory: Workload


def plan(device: str, quick: bool) -> Plan:
    if device == "cpu" or quick:
        tiny = Workload(ModelConfig.preset("tiny"), 1, 256, "train", "none", "float32", device)
        return Plan(device, 2 if device == "cpu" else _world(), tiny, tiny.with_(seq_len=1024))
    seven_b = ModelConfig.preset("7b").cut_to(4)
    small = Workload(ModelConfig.preset("small"), 1, 512, "train", "none", "bfloat16", device)
    return Plan(device, _world(), small, Workload(seven_b, 1, 32768, "train", "none", "bfloat16", device))


def _world() -> int:
    """The largest power of two of the visible GPUs, at most 8."""
    count = min(torch.cuda.device_count(), 8)
    return 1 << (count.bit_length() - 1) if count else 0
