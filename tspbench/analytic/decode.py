"""The decode model: TTFT, TPOT (p50/p90/p99 over the steps), memory with the KV cache, and
TSP's break-even batch, per layout, from tspbench.costs.decode and a hardware profile.

    TTFT      the prefill's predicted time (tspbench.analytic.predict in mode "infer": the head
              runs on every position there, one position in decode - 2 B S h V FLOPs more)
    a step    GEMMs       max(FLOPs / gemm rate, weight bytes read / HBM bandwidth): a decode
                          GEMM reads its whole weight matrix for a handful of rows, so below
                          rows* = gemm rate x elt / (2 x HBM bandwidth) it is bandwidth-bound
              attention   max(FLOPs / attention rate, K/V bytes read / HBM bandwidth)
              element-wise 4 passes over the step's [rows, h] and [rows, ffn] tensors per layer
              collectives each at latency + bus bytes / bandwidth of its link (as timing.py);
                          exposed, except those the schedule overlaps:
              TSP         per schedule, the weight traffic hides behind the GEMMs of the shard
                          in hand: per layer max(D gemm_attn, eta D bcast) + (1 - eta) D bcast,
                          the MLP ring likewise with D - 1 shifts, the head's ring behind the
                          head GEMMs; the embedding's ring has no compute to hide behind
              FSDP        block gathers behind the step's compute (as timing.py), the root exposed
    TPOT      step k's time grows with the keys it attends (S + k + 1); p50/p90/p99 are the
              percentiles of the N predicted steps (the model has no noise: its tail is the
              cache growing, not jitter)
    memory    max(prefill peak + the cache allocated before it, parameters + cache + the step's
              working memory)
    break-even  (TSP) the smallest B whose GEMMs on one shard last as long as eta x moving the
              next shard, for the attention broadcast and the MLP ring; beyond it every block's
              weight traffic is hidden

Every number from here is a projection of the model, never a measurement.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from tspbench.analytic import prices
from tspbench.analytic.hardware import Hardware, load_hardware
from tspbench.analytic.predict import Prediction, predict
from tspbench.analytic.timing import comm_seconds, ranks_per_node, sync_seconds
from tspbench.core.bus import BUS_FACTOR
from tspbench.core.records import point_record
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.costs.decode import (
    DecodeShape,
    DecodeWork,
    Transfer,
    decode_elementwise_bytes,
    decode_flops,
    decode_transfers,
    decode_work,
    kv_cache_bytes,
    tsp_shard_bytes,
    tsp_shard_gemm_flops,
)
from tspbench.dist.mesh import Mesh
from tspbench.strategy import Traffic, get_strategy

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class DecodeStepTime:
    """Seconds of one decode step on one rank, by what they are spent on."""

    gemm_s: float
    attention_s: float
    elementwise_s: float
    comm_exposed_s: float  # on the critical path, including overlapped traffic compute could not hide
    comm_hidden_s: float  # traffic that ran under compute

    @property
    def step_s(self) -> float:
        return self.gemm_s + self.attention_s + self.elementwise_s + self.comm_exposed_s


class DecodeSteps(Sequence[DecodeStepTime]):
    """The N steps of a decode, each priced when first asked for: the record and the planner
    need a handful of them (the percentiles' neighbours and the middle one), never all N, so a
    prediction takes the same time for a billion tokens as for one.

    A step's time never falls as its keys grow (attention reads more, and what it feeds - the
    overlap, a wait on peers - grows with compute) where the profile's waits on peers grow,
    or shrink by less than the compute that precedes them (``sync_us``'s slopes >= -1): then
    the steps are already in order and a percentile is numpy's linear one between two of them.
    Otherwise every step is priced and sorted, as numpy does."""

    def __init__(self, price: Callable[[int], DecodeStepTime], n: int, ordered: bool) -> None:
        self.price, self.n, self.ordered = price, n, ordered
        self.priced: dict[int, DecodeStepTime] = {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self.n))]
        if not -self.n <= k < self.n:
            raise IndexError(f"step {k} of {self.n}")
        k %= self.n
        if k not in self.priced:
            self.priced[k] = self.price(k)
        return self.priced[k]

    def percentile(self, q: float) -> float:
        """numpy.percentile (linear) of the steps' times."""
        if not self.ordered:
            return float(np.percentile([s.step_s for s in self], q))
        virtual = (self.n - 1) * (q / 100)
        lo = math.floor(virtual)
        t = virtual - lo
        a, b = self[lo].step_s, self[min(lo + 1, self.n - 1)].step_s
        return float(b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t)


def steps_ordered(hw: Hardware) -> bool:
    """Whether a later decode step never costs less (see DecodeSteps): every wait-on-peers table
    falls by less than the compute before it grows."""
    for table in hw.sync_us.values():
        rows = sorted({0.0: 0.0, **table}.items())
        if any((w1 - w0) < -(c1 - c0) for (c0, w0), (c1, w1) in itertools.pairwise(rows)):
            return False
    return True


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
    transfers: list[Transfer]
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
            n = self.mesh.size(t.axis)
            if t.phase == "decode" and n > 1:
                out[t.op] = out.get(t.op, 0.0) + BUS_FACTOR[t.op](n) * t.msg_bytes * t.count
        return out

    def record(self) -> dict[str, object]:
        """The flat record of a projected decode point (sweep and report columns)."""
        comm = self.comm_bytes_per_step()
        mid = self.steps[len(self.steps) // 2]
        return {
            "status": "completed" if self.fits else "oom",
            "error": None
            if self.fits
            else (f"predicted peak {self.peak_bytes:,} B exceeds usable {self.hardware.usable_bytes:,} B"),
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


def traffic_of(transfers: list[Transfer]) -> list[Traffic]:
    """The spec's transfers as the time model's Traffic entries."""
    return [
        Traffic(t.op, (t.axis,), t.msg_bytes, t.count, t.phase, "model", t.hidden, t.channel)
        for t in transfers
    ]


def transfer_s(t: Transfer, mesh: Mesh, hw: Hardware, count: int | None = None) -> float:
    """Seconds of ``count`` (default: all) of a transfer's collectives."""
    exposed, hidden = comm_seconds(mesh, traffic_of([t]), hw)
    return (exposed + hidden) * ((count if count is not None else t.count) / t.count)


def step_time(
    cfg: ModelConfig, s: DecodeShape, layout: Layout, hw: Hardware, mesh: Mesh, step: int
) -> DecodeStepTime:
    """Step ``step``'s time on one rank (see the module docstring)."""
    ranks = ranks_per_node(layout, hw)
    share = hw.share(ranks)
    f = decode_flops(cfg, s, step)
    ew_bytes = decode_elementwise_bytes(cfg, s)
    gemm, attention, elementwise = compute_seconds(
        hw, ranks, f.gemm, f.weight_bytes, f.attention, f.cache_bytes, ew_bytes
    )
    transfers = [t for t in decode_transfers(cfg, s) if t.phase == "decode"]
    if s.strategy == "tsp" and s.weight_parts > 1:
        return tsp_step_time(cfg, s, hw, mesh, share, transfers, attention, elementwise)
    traffic = traffic_of(transfers)
    exposed, hidden = comm_seconds(mesh, traffic, hw)
    compute = gemm + attention + elementwise
    exposed += sync_seconds(mesh, traffic, hw, compute)
    hidden_cost = prices.hidden_exposed(compute, hidden, hw.overlap_efficiency)
    return DecodeStepTime(gemm, attention, elementwise, exposed + hidden_cost, hidden - hidden_cost)


def compute_seconds(
    hw: Hardware,
    ranks_on_node: int,
    gemm: float,
    weight_bytes: float,
    attention: float,
    cache_bytes: float,
    elementwise_bytes: float,
) -> tuple[float, float, float]:
    """(GEMM, attention, element-wise) seconds of a decode step at the rank's share of its
    device: GEMMs at the achievable rate reading their weights, attention a rectangle (one query
    against the keys) reading its K/V, each bound by HBM where that takes longer."""
    share = hw.share(ranks_on_node)
    gemm_s = prices.at_share(prices.gemm_seconds(hw, gemm, weight_bytes, decode=True), share)
    attention_s = prices.attention_seconds(hw, attention, False, nbytes=cache_bytes)
    elementwise_s = prices.elementwise_seconds(elementwise_bytes, prices.elementwise_gbs(hw))
    return (
        gemm_s,
        prices.at_share(attention_s, hw.attention_share(ranks_on_node)),
        prices.at_share(elementwise_s, share),
    )


def tsp_step_time(
    cfg: ModelConfig,
    s: DecodeShape,
    hw: Hardware,
    mesh: Mesh,
    share: float,
    transfers: list[Transfer],
    attention: float,
    elementwise: float,
) -> DecodeStepTime:
    """TSP: each schedule's weight traffic behind the GEMMs of the shard in hand."""
    D, L, eta = s.weight_parts, cfg.n_layers, hw.overlap_efficiency
    by = {t.what: t for t in transfers}
    g_attn, g_mlp, g_vocab = shard_gemm_seconds(cfg, s, hw, share)
    bcast, shift = transfer_s(by["W_attn"], mesh, hw, D), transfer_s(by["W_mlp"], mesh, hw, D - 1)
    vocab_shift = transfer_s(by["W_vocab"], mesh, hw, D - 1)
    schedules = [  # (GEMM seconds, weight seconds behind them), per layer x L or once
        (L * D * g_attn, L * bcast),
        (L * D * g_mlp, L * shift),
        (0.0, vocab_shift),  # the embedding: a lookup per shard, nothing to hide behind
        (D * g_vocab, vocab_shift),  # the head
    ]
    gemm = sum(c for c, _ in schedules)
    weights = sum(h for _, h in schedules)
    hidden_cost = sum(prices.hidden_exposed(c, h, eta) for c, h in schedules)
    exchange = sum(transfer_s(t, mesh, hw) for t in transfers if t.what in ("queries", "partials"))
    exchange += sync_seconds(mesh, traffic_of(transfers), hw, gemm + attention + elementwise)
    return DecodeStepTime(gemm, attention, elementwise, exchange + hidden_cost, weights - hidden_cost)


def shard_gemm_seconds(
    cfg: ModelConfig, s: DecodeShape, hw: Hardware, share: float
) -> tuple[float, float, float]:
    """Seconds of a TSP rank's GEMMs on one (attention, MLP, vocabulary) shard (roofline)."""
    flops, nbytes = tsp_shard_gemm_flops(cfg, s), tsp_shard_bytes(cfg, s)
    seconds = (prices.gemm_seconds(hw, f, b, decode=True) for f, b in zip(flops, nbytes, strict=True))
    return tuple(prices.at_share(t, share) for t in seconds)  # type: ignore[return-value]


def break_even_batch(
    cfg: ModelConfig, layout: Layout, dtype: str, hw: Hardware, limit: int = 1 << 24
) -> dict[str, int]:
    """TSP: the smallest B (a multiple of D: whole slots) whose GEMMs on one attention (MLP)
    shard last at least eta x the broadcast (ring shift) of the next one; "batch" is the larger.
    ``limit`` if even that many rows per rank do not (a link faster than HBM)."""
    D = layout.tsp
    mesh = Mesh.planning(get_strategy("tsp").mesh_dims(layout), 2)
    share, eta = hw.share(ranks_per_node(layout, hw)), hw.overlap_efficiency

    def hidden(batch: int, schedule: int) -> bool:
        s = DecodeShape.of(layout, batch, 2 * D, 1, dtype)
        by = {t.what: t for t in decode_transfers(cfg, s)}
        transfer = transfer_s(by[("W_attn", "W_mlp")[schedule]], mesh, hw, 1)
        return prices.fully_hidden(shard_gemm_seconds(cfg, s, hw, share)[schedule], transfer, eta)

    out = {}
    for schedule, name in enumerate(("attention", "mlp")):
        slots = _smallest(lambda b, k=schedule: hidden(D * b, k), limit)
        out[name] = D * slots
    out["batch"] = max(out["attention"], out["mlp"])
    return out


def _smallest(ok, limit: int) -> int:
    """The smallest n >= 1 with ok(n), for a monotone ok; ``limit`` when none up to it is."""
    hi = 1
    while not ok(hi):
        if hi >= limit:
            return limit
        hi *= 2
    lo = hi // 2  # ok(hi), not ok(lo) (or lo == 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def predict_decode(
    layout: Layout,
    model: ModelConfig,
    batch: int,
    context: int,
    decode_tokens: int,
    dtype: str,
    hardware: Hardware | str,
) -> DecodePrediction:
    """The decode model of one point: B sequences per replica, S context, N generated tokens."""
    hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
    prefill = predict(layout, Workload(model, batch, context, "infer", dtype=dtype, device="cuda"), hw)
    s = DecodeShape.of(layout, batch, context, decode_tokens, dtype)
    mesh = Mesh.planning(get_strategy(layout.strategy).mesh_dims(layout), 2)
    steps = DecodeSteps(partial(step_time, model, s, layout, hw, mesh), decode_tokens, steps_ordered(hw))
    params = prefill.memory.persistent["parameters"]
    even = break_even_batch(model, layout, dtype, hw) if layout.strategy == "tsp" and layout.tsp > 1 else {}
    return DecodePrediction(layout, s, hw, prefill, steps, kv_cache_bytes(model, s), params,
                            decode_work(model, s), decode_transfers(model, s), mesh, even)  # fmt: skip


def decode_record(layout: Layout, workload: Workload, hardware: str) -> dict[str, object]:
    """A projected decode point as a record (the sweep's predict executor, mode "decode")."""
    n = workload.decode_tokens
    p = predict_decode(layout, workload.model, workload.batch, workload.seq_len, n, workload.dtype, hardware)
    return {**point_record(layout, workload, "predicted"), **p.record()}
