"""Hardware profiles: the numbers the time and fit models need, as YAML data with provenance.

Shipped in tspbench/analytic/profiles/: a100, h100, mi300x (datasheets and assumptions), h200
(measured on one H200 by gpu-check's calibrate), cpu (measured on this kind of host by ``tspbench
calibrate``), and the H100 96 GB at 500 W that torchtitan's published runs used: h100-96gb-500w
(h100's assumptions), h100-96gb-500w-hopper-measured (the H200's measured figures carried over),
and its two fits written by ``tspbench check backtest --fit --write``,
h100-96gb-500w-calibrated(-compile). A profile is found by name there, in directories listed in
TSPBENCH_HARDWARE_PATH, or given as a path to a .yaml file (``tspbench calibrate --out`` writes
one). Every figure says where it comes from in ``provenance``: ``datasheet``, ``assumed``, or
``measured: <how>``; a field missing from it is reported as ``unstated``.

Compute rates are per rank on its own device. Where ranks share a device (CPU ranks sharing a
host's cores: ``cores_per_node``), each rank gets ``share(ranks on the node)`` of it: the measured
``contention`` table when it has an entry, else cores / ranks. Collectives use the measured
``collectives`` entry for their op and group size when there is one, else the intra- or
inter-node link figures.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tspbench.analytic import profile_check as check
from tspbench.analytic.profile_check import BadField
from tspbench.core.errors import HardwareError
from tspbench.core.names import CUDA_ATTENTION_KERNELS
from tspbench.core.yamlfile import read_yaml

SHIPPED = Path(__file__).parent / "profiles"
# Passes of element-wise traffic a step makes, for a profile that measured (calibrate) or fitted
# (backtest --fit) them (tspbench.analytic.timing): over the activations a block computes, per
# layer, in a training step and a forward; over the parameter bytes, AdamW's. A key such a
# profile leaves out takes the number below (the optimizer: what its code moves); a profile with
# none counts every byte from the code instead (tspbench.costs.elementwise).
ASSUMED_PASSES = {"train": 12.0, "infer": 4.0}
PASS_KEYS = ("train", "infer", "optimizer")
LAUNCH_KEYS = ("launch_us", "graph_kernel_us", "graph_replay_us")
RATES = (
    "peak_tflops", "gemm_tflops", "attention_tflops", "attention_causal_tflops", "hbm_bandwidth_gbs",
    "intra_node_bandwidth_gbs", "intra_node_latency_us", "inter_node_bandwidth_gbs", "inter_node_latency_us",
)  # fmt: skip


@dataclass(frozen=True)
class Collective:
    """A measured collective: ``op`` over groups of ``group_size`` in a world of ``world_size``."""

    op: str
    group_size: int
    world_size: int
    latency_us: float
    bandwidth_gbs: float  # bus bandwidth (nccl-tests convention), large messages
    batched_latency_us: float | None = None  # per call, when issued async together (else latency_us)


@dataclass(frozen=True)
class Hardware:
    name: str
    gpus_per_node: int  # ranks per node (GPUs; on a CPU host, the ranks it runs)
    memory_bytes: int
    peak_tflops: float  # dense, in the benchmark's dtype (bf16 on GPUs), for MFU
    gemm_tflops: float  # achievable on the step's GEMMs, per rank
    attention_tflops: float  # flash attention of a query chunk against a key prefix (dense rectangle counted)
    hbm_bandwidth_gbs: float  # element-wise ops (norms, RoPE, activations, optimizer), per rank
    intra_node_bandwidth_gbs: float  # bus bandwidth of a collective inside a node
    intra_node_latency_us: float
    inter_node_bandwidth_gbs: float  # per GPU, across nodes
    inter_node_latency_us: float
    attention_causal_tflops: float = 0.0  # square causal calls, counted as the dense square; 0: 2x attention
    attention_causal_by_size: dict[int, float] = field(default_factory=dict)  # square side -> rate
    attention_by_size: dict[int, float] = field(default_factory=dict)  # rectangle's query chunk -> rate
    usable_memory_fraction: float = 0.95
    cores_per_node: int | None = None  # ranks on a node share this many cores (CPU); None: own device
    contention: dict[int, float] = field(default_factory=dict)  # ranks on a node -> each rank's share
    attention_contention: dict[int, float] = field(default_factory=dict)  # the same, of attention calls
    sync_us: dict[int, dict[float, float]] = field(default_factory=dict)  # ranks -> {chunk us: wait us}
    collectives: list[Collective] = field(default_factory=list)
    overlap_efficiency: float = 1.0  # fraction of 'hidden' communication that really runs under compute
    # the timeline's per-op terms (tspbench.analytic.timeline); calibrate measures them on a
    # profiled single-device step (tspbench.calibrate.opcosts)
    op_overhead_us: float = 0.0  # per op with a kernel: CPU dispatch; GPU kernel launch and tail
    host_overhead_us: float = 0.0  # per op, outside its kernel (Python, autograd); 0: the host runs ahead
    step_gemm_tflops: float | None = None  # the model's own GEMMs in a profiled step (else gemm_tflops)
    elementwise_by_op: dict[str, float] = field(default_factory=dict)  # op name -> GB/s ("*": the rest)
    # a GPU's launches: the host's time per op of an eager step (Python, dispatch, launch: what
    # the device waits for where the host is behind), per kernel inside a replayed CUDA graph,
    # per replay (tspbench.calibrate.launches); 0: not measured
    launch_us: float = 0.0
    graph_kernel_us: float = 0.0
    graph_replay_us: float = 0.0
    # each kind's share of the device where ranks share a host, measured on the model's own step
    # run by that many ranks at once: kind (gemm, attention, elementwise) -> ranks -> share
    step_contention: dict[str, dict[int, float]] = field(default_factory=dict)
    # compute that overlaps a collective on the rank's link is slowed by this fraction of the overlap
    # (timeline); None: 1 - overlap_efficiency (on CPU the transfer needs the cores the compute has)
    comm_compute_slowdown: float | None = None
    elementwise_passes: dict[str, float] = field(default_factory=dict)  # measured or fitted; empty: counted
    # What the caching allocator reserves beyond the peak of allocated memory, as a fraction of
    # it: the fake world and the model give allocated (live tensors); published runs often give
    # reserved (torchtitan logs max_reserved). 0: the profile assumes nothing is added.
    reserved_overhead_fraction: float = 0.0
    # the attention kernel the device runs (tspbench.model.attention): "cudnn" (Hopper and newer
    # NVIDIA GPUs with cuDNN) or "flash" (FlashAttention-2; ROCm's own flash); the fake world's
    # simulated GPU calls it. None: not a GPU (CPU profiles)
    attention_kernel: str | None = None
    # the board power a step is taken to draw, in watts, for energy per token where no meter
    # reads one (tspbench.analytic.cost): a datasheet TDP or a power limit. None: unknown
    board_power_w: float | None = None
    description: str = ""
    sources: list[str] = field(default_factory=list)
    provenance: dict[str, str] = field(default_factory=dict)

    @property
    def comm_slowdown(self) -> float:
        """How much a collective on the rank's link slows its concurrent compute (timeline)."""
        if self.comm_compute_slowdown is not None:
            return self.comm_compute_slowdown
        return 1.0 - self.overlap_efficiency

    @property
    def usable_bytes(self) -> int:
        return int(self.memory_bytes * self.usable_memory_fraction)

    def reserved_bytes(self, allocated: float) -> float:
        """What the caching allocator would hold (reserved) for a step whose live tensors peak
        at ``allocated``, as this profile assumes."""
        return allocated * (1 + self.reserved_overhead_fraction)

    def causal_tflops(self, side: int = 0) -> float:
        """Square causal calls of ``side`` tokens: a flash kernel skips the masked half of the
        dense square it is counted as (so by default twice the rectangle rate), less well on
        small squares: the measured table, interpolated in log(side), when there is one."""
        default = self.attention_causal_tflops or 2 * self.attention_tflops
        return _interpolated(self.attention_causal_by_size, side, default)

    def rectangle_tflops(self, chunk: int = 0) -> float:
        """A query chunk of ``chunk`` tokens against the keys before it: the measured table
        (chunk vs a prefix 4x as long), interpolated in log(chunk), else ``attention_tflops``."""
        return _interpolated(self.attention_by_size, chunk, self.attention_tflops)

    @property
    def step_gemm_rate(self) -> float:
        """TFLOP/s of a training or prefill step's GEMMs: the rate they ran at inside calibrate's
        profiled step where it measured one, else the achievable rate (both time models use it)."""
        return self.step_gemm_tflops or self.gemm_tflops

    def ranks_on_node(self, world_size: int) -> int:
        """Ranks that share one node in a job of ``world_size`` (a job smaller than a node has it
        to itself): the count every contention share and peer-wait price of a step is read at."""
        return min(world_size, self.gpus_per_node)

    def share(self, ranks_on_node: int) -> float:
        """The fraction of its device one rank gets when ``ranks_on_node`` ranks run on a node."""
        if self.cores_per_node is None:
            return 1.0
        if ranks_on_node in self.contention:
            return self.contention[ranks_on_node]
        return min(1.0, self.cores_per_node / ranks_on_node)

    def kind_share(self, kind: str, ranks_on_node: int) -> float:
        """A cost class's share of the device for the timeline: measured on the model's step
        (``step_contention``) where there is a figure, else the probes' (GEMMs' for element-wise
        and for the host's time)."""
        measured = self.step_contention.get(kind, {})
        if self.cores_per_node is not None and ranks_on_node in measured:
            return measured[ranks_on_node]
        return self.attention_share(ranks_on_node) if kind == "attention" else self.share(ranks_on_node)

    def kind_share_at(self, kind: str, busy: float) -> float:
        """``kind_share`` with ``busy`` ranks computing on the node on average, not all of them:
        each gets min(1, cores / busy) of a core, at an efficiency that falls linearly from 1
        (alone) to what was measured with the most ranks (memory bandwidth, the scheduler)."""
        if self.cores_per_node is None or busy <= 1:
            return 1.0
        measured = self.step_contention.get(kind) or (
            self.attention_contention if kind == "attention" else self.contention
        )
        most = max(measured, default=1)
        if most <= 1:
            return min(1.0, self.cores_per_node / busy)
        ideal = min(1.0, self.cores_per_node / most)
        worst = min(1.0, self.kind_share(kind, most) / ideal)
        efficiency = 1 + (worst - 1) * min(1.0, (busy - 1) / (most - 1))
        return min(1.0, self.cores_per_node / busy) * efficiency

    def attention_share(self, ranks_on_node: int) -> float:
        """The same for attention calls, which share a host's cores differently from GEMMs (they
        are measured apart where calibrate ran them; else the GEMM share)."""
        if self.cores_per_node is not None and ranks_on_node in self.attention_contention:
            return self.attention_contention[ranks_on_node]
        return self.share(ranks_on_node)

    def sync_s(self, ranks_on_node: int, chunk_s: float) -> float:
        """Seconds a blocking collective that follows ``chunk_s`` of compute waits for its peers
        to be scheduled, beyond its latency, where ranks share a host's cores (else 0): the
        measured table, linear in the chunk between its points, proportional below the shortest
        (no compute, no drift) and flat above the longest (the scheduler bounds the drift)."""
        table = self.sync_us.get(ranks_on_node)
        if not table:
            return 0.0
        return _interpolated({0.0: 0.0, **table}, chunk_s * 1e6, 0.0, log=False) * 1e-6

    def link(
        self, op: str, group_size: int, world_size: int, inter_node: bool, batched: bool = False
    ) -> tuple[float, float]:
        """(latency in s, bus bandwidth in bytes/s) of ``op`` over a group of ``group_size``;
        ``batched``: the latency per call of calls issued async together, where measured."""
        measured = [c for c in self.collectives if c.op == op and c.group_size == group_size]
        if measured and not inter_node:
            best = min(measured, key=lambda c: (abs(c.world_size - world_size), c.world_size))
            latency = best.batched_latency_us if batched and best.batched_latency_us else best.latency_us
            return latency * 1e-6, best.bandwidth_gbs * 1e9
        if inter_node:
            return self.inter_node_latency_us * 1e-6, self.inter_node_bandwidth_gbs * 1e9
        return self.intra_node_latency_us * 1e-6, self.intra_node_bandwidth_gbs * 1e9

    def source_of(self, key: str) -> str:
        return self.provenance.get(key, "unstated")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _interpolated(table: dict, size: float, default: float, log: bool = True) -> float:
    """``table`` (size -> value) at ``size``, interpolated in log(size) (or linearly) and clamped
    at its ends; ``default`` without a table or a size."""
    rows = sorted(table.items())
    if not rows or size <= 0:
        return default
    if size <= rows[0][0]:
        return rows[0][1]
    for (s0, r0), (s1, r1) in itertools.pairwise(rows):
        if size <= s1:
            w = math.log(size / s0) / math.log(s1 / s0) if log else (size - s0) / (s1 - s0)
            return r0 + w * (r1 - r0)
    return rows[-1][1]


def search_path() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("TSPBENCH_HARDWARE_PATH", "").split(os.pathsep) if p]
    return [*extra, SHIPPED]


def available_hardware() -> list[str]:
    names = {p.stem for d in search_path() if d.is_dir() for p in d.glob("*.yaml")}
    return sorted(names)


def find_profile(name_or_path: str) -> Path:
    """The profile file of a name (shipped or on TSPBENCH_HARDWARE_PATH) or a .yaml path."""
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
        raise HardwareError(f"hardware profile {path} does not exist")
    return path


def load_hardware(name_or_path: str) -> Hardware:
    """A profile by name or path; one line naming the file and key when it is malformed."""
    path = find_profile(name_or_path)
    data = read_yaml(path, HardwareError) or {}
    if not isinstance(data, dict):
        raise HardwareError(f"{path}: expected a mapping of profile keys")
    try:
        return _hardware(data)
    except BadField as exc:
        raise HardwareError(f"{path}: {exc}") from None


OVERHEADS = ("op_overhead_us", "host_overhead_us", "step_gemm_tflops", "comm_compute_slowdown")
FRACTIONS = (
    "usable_memory_fraction",
    "overlap_efficiency",
    "comm_compute_slowdown",
    "reserved_overhead_fraction",
)


def _hardware(data: dict[str, Any]) -> Hardware:
    """The Hardware of a profile's keys, each checked by meaning (tspbench.analytic.profile_check)."""
    known = {f.name: f for f in fields(Hardware)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise BadField(f"unknown key(s) {unknown}; allowed: {sorted(known)}")
    missing = [
        n for n, f in known.items() if f.default is MISSING and f.default_factory is MISSING and n not in data
    ]
    if missing:
        raise BadField(f"missing key(s) {missing}")
    values = _scalars(dict(data))
    values["elementwise_by_op"] = _rates("elementwise_by_op", values.get("elementwise_by_op"))
    contention = values.get("step_contention") or {}
    if not isinstance(contention, dict):
        raise BadField(f"step_contention: expected {{kind: {{ranks: share}}}}, got {contention!r}")
    values["step_contention"] = {
        str(k): check.shares(f"step_contention.{k}", v) for k, v in contention.items()
    }
    for key in ("contention", "attention_contention"):
        values[key] = check.shares(key, values.get(key))
    values["sync_us"] = _sync_table(values.get("sync_us"))
    names = [f.name for f in fields(Collective)]
    required = {f.name for f in fields(Collective) if f.default is MISSING}
    values["collectives"] = [
        Collective(**c) for c in check.collectives(values.get("collectives"), names, required)
    ]
    for key in ("attention_causal_by_size", "attention_by_size"):
        values[key] = check.table(key, values.get(key))
    passes = values.get("elementwise_passes")
    values["elementwise_passes"] = _passes({} if passes is None else passes)
    kernel = values.get("attention_kernel")
    if kernel is not None and kernel not in CUDA_ATTENTION_KERNELS:
        raise BadField(f"attention_kernel: must be one of {list(CUDA_ATTENTION_KERNELS)}, got {kernel!r}")
    values["provenance"] = check.strings("provenance", values.get("provenance"), dict)
    values["sources"] = check.strings("sources", values.get("sources"), list)
    if not isinstance(values.get("name"), str) or not isinstance(values.get("description", ""), str):
        raise BadField("name, description: expected text")
    return Hardware(**values)


def _scalars(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with every single-number key checked: rates and sizes in their bounds, counts
    integers, overheads >= 0 (a board's power > 0), fractions at most 1."""
    zero_ok = ("attention_causal_tflops", "overlap_efficiency", "reserved_overhead_fraction")
    for key in (*RATES, "memory_bytes", "usable_memory_fraction", *zero_ok):
        if key in values:
            values[key] = check.positive(key, values[key], zero_ok=key in zero_ok)
    for key, (low, high) in check.COUNTS.items():
        if values.get(key) is not None:
            values[key] = check.count(key, values[key], low, high)
    for key in (*OVERHEADS, "board_power_w", *LAUNCH_KEYS):
        if values.get(key) is not None:  # a board of 0 W is no board: > 0
            values[key] = check.positive(key, values[key], zero_ok=key != "board_power_w")
    for key in FRACTIONS:
        if values.get(key) is not None and values[key] > 1:
            raise BadField(f"{key}: must be in (0, 1], got {values[key]!r}")
    return values


def _rates(key: str, entry: Any) -> dict[str, float]:
    """A mapping of op names to GB/s (empty when absent)."""
    if entry is None:
        return {}
    if not isinstance(entry, dict):
        raise BadField(f"{key}: expected a mapping of op names to GB/s, got {entry!r}")
    return {str(k): check.number(f"{key}.{k}", v, *check.GBS) for k, v in entry.items()}


def _sync_table(entry: Any) -> dict[int, dict[float, float]]:
    """sync_us: {ranks on a node: {chunk of compute in us (> 0): wait per call in us (>= 0)}}."""
    if entry is None:
        return {}
    if not isinstance(entry, dict) or not all(isinstance(v, dict) for v in entry.values()):
        raise BadField(f"sync_us: expected {{ranks: {{chunk us: wait us}}}}, got {entry!r}")
    us = check.MICROSECONDS
    return {
        check.count("sync_us key", r): {
            check.number(f"sync_us.{r} key", c, *us, low_open=True): check.number(f"sync_us.{r}.{c}", w, *us)
            for c, w in table.items()
        }
        for r, table in entry.items()
    }


def _passes(entry: Any) -> dict[str, float]:
    if not isinstance(entry, dict) or set(entry) - set(PASS_KEYS):
        raise BadField(
            f"elementwise_passes: expected a mapping with keys among {sorted(PASS_KEYS)}, got {entry!r}"
        )
    return {str(k): check.number(f"elementwise_passes.{k}", v, 1e-3, 1e6) for k, v in entry.items()}
