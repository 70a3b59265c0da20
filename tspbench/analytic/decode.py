"""The decode model: TTFT, TPOT (p50/p90/p99 over the steps), memory with the KV cache, and the
break-even batch of a strategy whose weight traffic hides behind windows of GEMMs (TSP), per
layout, from tspbench.costs.decode, the strategy's decode declarations and a hardware profile.

    TTFT      the prefill's predicted time (tspbench.analytic.predict in mode "infer": the head
              runs on every position there, one position in decode - 2 B S h V FLOPs more)
    a step    tspbench.analytic.decode_step: compute at the price list's rates, and each of the
              collectives the strategy declares (``decode_traffic``) exposed or hidden behind
              the compute it names; e.g. TSP's weight shards each behind the GEMMs of the
              shard in hand, per layer max(D gemm_attn, eta D bcast) + (1 - eta) D bcast, the
              MLP ring likewise with D - 1 shifts, the head's ring behind the head GEMMs, the
              embedding's ring behind nothing; FSDP's block gathers behind the step's compute;
              and its kernels replayed as a CUDA graph (prices.graph_launch_seconds: a GPU's
              bench replays decode's steps so; 0 on a profile that measured no launches)
    TPOT      step k's time grows with the keys it attends (S + k + 1); p50/p90/p99 are the
              percentiles of the N predicted steps (the model has no noise: its tail is the
              cache growing, not jitter), priced from the few steps they fall between
    memory    max(prefill peak + the cache allocated before it, parameters + cache + the step's
              working memory)
    break-even  the smallest B whose GEMMs on one shard last as long as eta x moving the next
              shard, for each block window (TSP: the attention broadcast and the MLP ring);
              beyond it every block's weight traffic is hidden

Every number from here is a projection of the model, never a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

from tspbench.analytic.decode_step import (
    DecodeSteps,
    DecodeStepTime,
    break_even_batch,
    step_time,
    steps_ordered,
    windows,
)
from tspbench.analytic.hardware import Hardware
from tspbench.analytic.predict import Prediction, oom_reason, predict
from tspbench.analytic.timing import ranks_per_node
from tspbench.core.bus import BUS_FACTOR
from tspbench.core.records import point_record
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.costs.decode import DecodeShape, DecodeWork, decode_work, kv_cache_bytes
from tspbench.dist.mesh import Mesh
from tspbench.strategy import Traffic, get_strategy

__all__ = ["DecodePrediction", "DecodeStepTime", "break_even_batch", "decode_record", "predict_decode"]
PERCENTILES = (50, 90, 99)


@dataclass
class DecodePrediction:
    layout: Layout
    shape: DecodeShape
    hardware: Hardware
    prefill: Prediction
    steps: DecodeSteps
    kv_cache_bytes: int
    parameter_bytes: int
    work: DecodeWork
    transfers: list[Traffic]  # the first token's (phase forward) and one step's (phase decode)
    mesh: Mesh
    break_even: dict[str, int] = field(default_factory=dict)  # TSP: schedule -> batch

    @property
    def ttft_s(self) -> float:
        return self.prefill.step_time_s

    def tpot_s(self, percentile: float = 50) -> float:
        return self.steps.percentile(percentile)

    @property
    def tokens_per_s(self) -> float:
        """Tokens generated per second by all replicas: B x data-parallel degree / TPOT p50."""
        return self.shape.batch * self.layout.data_degree / self.tpot_s()

    @property
    def prefill_peak_bytes(self) -> int:
        """The prefill's block moment with the cache allocated before it: decode's prefill runs
        the head on the last position only (tspbench.model.transformer.Transformer.prefill), so
        the prefill's head moment (every position's logits) never happens here; the head's
        work on one row per sequence is below a block's."""
        return self.prefill.memory.moments["prefill block"] + self.kv_cache_bytes

    @property
    def step_peak_bytes(self) -> int:
        return self.parameter_bytes + self.kv_cache_bytes + self.work.total

    @property
    def peak_bytes(self) -> int:
        return max(self.prefill_peak_bytes, self.step_peak_bytes)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.hardware.usable_bytes

    def comm_bytes_per_step(self) -> dict[str, float]:
        """Bus bytes of one decode step per rank, by op (groups of one rank move nothing)."""
        out: dict[str, float] = {}
        for t in self.transfers:
            n = self.mesh.size(*t.axes)
            if t.phase == "decode" and n > 1:
                out[t.op] = out.get(t.op, 0.0) + BUS_FACTOR[t.op](n) * t.msg_bytes * t.count
        return out

    def record(self) -> dict[str, object]:
        """The flat record of a projected decode point (sweep and report columns)."""
        comm = self.comm_bytes_per_step()
        mid = self.steps[len(self.steps) // 2]
        return {
            "status": "completed" if self.fits else "oom",
            "error": None if self.fits else oom_reason(self.peak_bytes, self.hardware.usable_bytes),
            "source": "predicted",
            "hardware": self.hardware.name,
            "ttft_s": self.ttft_s,
            **{f"tpot_p{p}_s": self.tpot_s(p) for p in PERCENTILES},
            "decode_tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s / self.layout.world_size,
            "decode_gemm_s": mid.gemm_s,
            "decode_attention_s": mid.attention_s,
            "decode_comm_exposed_s": mid.comm_exposed_s,
            "decode_comm_hidden_s": mid.comm_hidden_s,
            "peak_memory_bytes": self.peak_bytes,
            "peak_memory_method": "analytic",
            "peak_memory_phase": "prefill"
            if self.prefill_peak_bytes >= self.step_peak_bytes
            else "decode step",
            "peak_memory_parameters_bytes": self.parameter_bytes,
            "peak_memory_kv_cache_bytes": self.kv_cache_bytes,
            "kv_cache_bytes": self.kv_cache_bytes,
            "prefill_peak_memory_bytes": self.prefill_peak_bytes,
            "decode_step_peak_memory_bytes": self.step_peak_bytes,
            "capacity_bytes": self.hardware.usable_bytes,
            "fits": self.fits,
            "decode_comm_bytes_per_step": sum(comm.values()),
            **{f"decode_comm_{op}_bytes_per_step": b for op, b in sorted(comm.items())},
            "break_even_batch": self.break_even.get("batch"),
        }


def predict_decode(
    layout: Layout,
    model: ModelConfig,
    batch: int,
    context: int,
    decode_tokens: int,
    dtype: str,
    hw: Hardware,
) -> DecodePrediction:
    """The decode model of one point: B sequences per replica, S context, N generated tokens,
    on the profile ``hw``."""
    prefill = predict(layout, Workload(model, batch, context, "infer", dtype=dtype, device="cuda"), hw)
    workload = Workload(
        model, batch, context, "decode", dtype=dtype, device="cuda", decode_tokens=decode_tokens
    )
    sized = get_strategy(layout.strategy).for_analysis(layout, workload)
    s, mesh, traffic = sized.decode_shape(), sized.mesh, [t for t in sized.decode_traffic() if t.count]
    price = partial(step_time, model, s, hw, ranks_per_node(layout, hw), mesh, traffic)
    steps = DecodeSteps(price, decode_tokens, steps_ordered(hw))
    params = prefill.memory.persistent["parameters"]
    blocks = any(t.scope == "block" for calls in windows(traffic, mesh).values() for t in calls)
    even = break_even_batch(model, layout, dtype, hw) if blocks else {}
    work = decode_work(model, s, sized.decode_held_widths(), sized.decode_weights_bytes())
    transfers = sized.first_token_traffic() + traffic
    return DecodePrediction(
        layout, s, hw, prefill, steps, kv_cache_bytes(model, s), params, work, transfers, mesh, even
    )


def decode_record(layout: Layout, workload: Workload, hw: Hardware) -> dict[str, object]:
    """A projected decode point as a record (the sweep's predict executor, mode "decode")."""
    n = workload.decode_tokens
    p = predict_decode(layout, workload.model, workload.batch, workload.seq_len, n, workload.dtype, hw)
    return {**point_record(layout, workload, "predicted"), **p.record()}
