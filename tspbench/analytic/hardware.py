"""Hardware profiles: the numbers the time and fit models need, as YAML data with sources.

Shipped in tspbench/analytic/profiles/ (mi300x, h100, h200, a100, and cpu measured on this kind of host).
A profile is found by name there, in directories listed in TSPBENCH_HARDWARE_PATH, or given as
a path to a .yaml file (``tspbench calibrate --out`` writes one).
"""

from __future__ import annotations

import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import yaml

from tspbench.core.errors import HardwareError

SHIPPED = Path(__file__).parent / "profiles"


@dataclass(frozen=True)
class Hardware:
    name: str
    gpus_per_node: int
    memory_bytes: int
    peak_tflops: float  # dense, in the benchmark's dtype (bf16 on GPUs), for MFU
    gemm_tflops: float  # achievable on large GEMMs
    attention_tflops: float  # achievable on causal flash attention
    hbm_bandwidth_gbs: float
    intra_node_bandwidth_gbs: float  # bus bandwidth of a collective inside a node
    intra_node_latency_us: float
    inter_node_bandwidth_gbs: float  # per GPU, across nodes
    inter_node_latency_us: float
    usable_memory_fraction: float = 0.95
    description: str = ""
    sources: list[str] = field(default_factory=list)

    @property
    def usable_bytes(self) -> int:
        return int(self.memory_bytes * self.usable_memory_fraction)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def search_path() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("TSPBENCH_HARDWARE_PATH", "").split(os.pathsep) if p]
    return [*extra, SHIPPED]


def available_hardware() -> list[str]:
    names = {p.stem for d in search_path() if d.is_dir() for p in d.glob("*.yaml")}
    return sorted(names)


def load_hardware(name_or_path: str) -> Hardware:
    """A profile by name or path; a clear error naming the file and key when it is malformed."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        found = [d / f"{name_or_path}.yaml" for d in search_path() if (d / f"{name_or_path}.yaml").exists()]
        if not found:
            raise HardwareError(
                f"unknown hardware {name_or_path!r}; known: {', '.join(available_hardware())} "
                "(or give a path to a profile .yaml)"
            )
        path = found[0]
    if not path.exists():
        raise FileNotFoundError(f"hardware profile {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    known = {f.name for f in fields(Hardware)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise HardwareError(f"{path}: unknown key(s) {unknown}; allowed: {sorted(known)}")
    required = [f.name for f in fields(Hardware) if f.default is MISSING and f.default_factory is MISSING]
    missing = [name for name in required if name not in data]
    if missing:
        raise HardwareError(f"{path}: missing key(s) {missing}")
    return Hardware(**data)
