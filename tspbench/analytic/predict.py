"""The analytic model: memory, communication, FLOPs and time of one step, per rank, any strategy.

Each strategy supplies its own terms (tspbench.strategy.base.Strategy): ``activation_terms`` for
memory, ``traffic`` for communication, ``flop_terms`` for FLOPs; what they share lives here and
in tspbench.costs.

Time, per rank and step: tspbench.analytic.timing (compute at the rank's share of its device,
each collective at its measured latency and bandwidth, and what the schedule overlaps).

FLOPs: model FLOPs follow tspbench.costs.flops (causal attention counted as half the square);
hardware FLOPs count what the kernels are asked to do - dense attention rectangles of each
call (as torch's FlopCounterMode counts them), recomputation included.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tspbench.analytic.hardware import Hardware
from tspbench.analytic.internode import internode_fields
from tspbench.analytic.timing import StepTime, step_time
from tspbench.core.records import comm_fields, point_record
from tspbench.core.spec import Layout, Workload
from tspbench.core.units import format_bytes
from tspbench.costs.elementwise import ElementwiseWork
from tspbench.costs.flops import FlopTerms, mfu, model_flops_per_step
from tspbench.costs.memory import MemoryPrediction
from tspbench.dist.comm import summarize
from tspbench.strategy import check_layout


@dataclass
class Prediction:
    layout: Layout
    workload: Workload
    hardware: Hardware
    memory: MemoryPrediction
    comm: list  # CommRecords
    flops: FlopTerms
    model_flops: float
    time: StepTime
    extra: dict = field(default_factory=dict)

    @property
    def step_time_s(self) -> float:
        return self.time.step_s

    @property
    def compute_s(self) -> float:
        return self.time.compute_s

    @property
    def comm_exposed_s(self) -> float:
        """Collectives on the critical path, and the overlapped ones the compute could not hide."""
        return self.time.comm_exposed_s + self.time.hidden_exposed_s

    @property
    def comm_hidden_s(self) -> float:
        """Collectives that run under compute."""
        return self.time.comm_hidden_s - self.time.hidden_exposed_s

    @property
    def tokens_per_step(self) -> int:
        return self.layout.data_degree * self.workload.batch * self.workload.seq_len

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_step / self.step_time_s / self.layout.world_size

    @property
    def mfu(self) -> float:
        return mfu(self.model_flops, self.step_time_s, self.layout.world_size, self.hardware.peak_tflops)

    @property
    def fits(self) -> bool:
        return self.memory.peak_bytes <= self.hardware.usable_bytes

    @property
    def comm_bytes_per_step(self) -> float:
        return sum(r.bus_bytes for r in self.comm)

    def comm_by(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for r in self.comm:
            out.setdefault(r.op, {}).setdefault(r.phase, 0.0)
            out[r.op][r.phase] += r.bus_bytes
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "strategy": self.layout.strategy,
            "layout": self.layout.describe(),
            "world_size": self.layout.world_size,
            "hardware": self.hardware.name,
            "peak_memory_bytes": self.memory.peak_bytes,
            "peak_memory_moment": self.memory.moment,
            "memory": self.memory.by_category,
            "memory_moments": self.memory.moments,
            "capacity_bytes": self.hardware.usable_bytes,
            "fits": self.fits,
            "comm_bytes_per_step": self.comm_bytes_per_step,
            "comm": self.comm_by(),
            "comm_calls": [
                {"op": op, "phase": phase, "group": g, "group_size": n, "calls": calls, "msg_bytes": nbytes}
                for (op, phase, g, n), (calls, nbytes) in summarize(self.comm).items()
            ],
            "flops_per_step": self.model_flops,
            "hardware_flops_per_step_per_gpu": self.flops.total,
            "gemm_flops_per_gpu": self.flops.gemm,
            "attention_flops_per_gpu": self.flops.attention,
            "compute_s": self.compute_s,
            "comm_exposed_s": self.comm_exposed_s,
            "comm_hidden_s": self.comm_hidden_s,
            "step_time_s": self.step_time_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "tflops_per_gpu": self.model_flops / self.step_time_s / self.layout.world_size / 1e12,
            "mfu": self.mfu,
        }


def predict(layout: Layout, workload: Workload, hw: Hardware) -> Prediction:
    """The analytic model of one point on the profile ``hw`` (no process is started)."""
    cls = check_layout(layout, workload)
    sized = cls.for_analysis(layout, workload)
    terms = sized.activation_terms()
    memory = sized.predict_memory(terms)
    traffic = sized.step_traffic()
    comm = [sized.record(t) for t in traffic if sized.mesh.size(*t.axes) > 1]
    flops = sized.flop_terms()
    params = memory.persistent["parameters"]
    work = ElementwiseWork(
        sized.elementwise_step_bytes(), sized.elementwise_layer_bytes(), params, sized.param_element_size
    )
    time = step_time(layout, workload, hw, flops, sized.mesh, traffic, work)
    model_flops = model_flops_per_step(
        workload.model, layout.data_degree * workload.batch, workload.seq_len, workload.mode
    )
    extra = internode_fields(sized.mesh, traffic, hw, time.step_s)  # what crosses nodes, its share
    return Prediction(layout, workload, hw, memory, comm, flops, model_flops, time, extra)


def oom_reason(peak_bytes: float, usable_bytes: float) -> str:
    """Why a projected point is out of memory, in the unit the tables use (#46)."""
    return f"predicted peak {format_bytes(peak_bytes)} exceeds usable {format_bytes(usable_bytes)}"


def predict_record(layout: Layout, workload: Workload, hw: Hardware) -> dict[str, object]:
    """A record of the same schema as ``tspbench bench`` (status completed), from the model alone."""
    p = predict(layout, workload, hw)
    record: dict[str, object] = {
        **point_record(layout, workload),
        "status": "completed",
        "error": None,
        "source": "predicted",
        "hardware": p.hardware.name,
        **p.time.to_dict(),
        "tokens_per_step": p.tokens_per_step,
        "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
        "model_flops_per_step": p.model_flops,
        "tflops_per_gpu": p.model_flops / p.step_time_s / layout.world_size / 1e12,
        "mfu": p.mfu,
        "peak_memory_bytes": p.memory.peak_bytes,
        "peak_memory_method": "analytic",
        "peak_memory_phase": p.memory.moment,
        **{f"peak_memory_{k}_bytes": v for k, v in p.memory.by_category.items()},
        "capacity_bytes": p.hardware.usable_bytes,
        "fits": p.fits,
        **comm_fields(p.comm),
        **p.extra,
    }
    if not p.fits:
        record["status"] = "oom"
        record["error"] = oom_reason(p.memory.peak_bytes, p.hardware.usable_bytes)
    return record
