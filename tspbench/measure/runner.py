"""One rank's run of a strategy: build it, step it, measure a step.

Called inside a launched world (local launcher or a Slurm task) after the process group is up.
The train step is the same for every strategy:

    zero grads -> forward + loss (phase forward) -> backward (phase backward)
    -> gradient sync + AdamW on owned shards (phase optimizer) -> global loss (phase forward)

A decode "step" is a whole decode run: the KV cache allocated (tracked as ``kv_cache``), the
prefill (phase forward) giving the first token, then ``decode_tokens`` greedy steps (phase
decode), each feeding the previous token of every slot (tspbench.strategy.decode).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from tspbench.core.errors import LayoutError
from tspbench.core.spec import Layout, Workload
from tspbench.core.trace import RankTrace
from tspbench.dist import comm
from tspbench.dist.c10d_count import C10dCounter
from tspbench.dist.launch import local_device
from tspbench.dist.mesh import Mesh
from tspbench.measure import schedstat
from tspbench.measure.decode_graphs import DecodeGraphs
from tspbench.measure.energy import EnergyMeter
from tspbench.measure.flop_counter import register_cpu_attention_flops
from tspbench.measure.memory_report import CudaPeak, MemoryReport
from tspbench.measure.storages import persistent_bytes
from tspbench.measure.trace import StepRecorder, mark_layers
from tspbench.measure.tracker import MemoryTracker
from tspbench.model.attention import record_kernels
from tspbench.model.optim import build_optimizer
from tspbench.model.reference import make_batch
from tspbench.model.transformer import fake_mode_active
from tspbench.strategy import LocalBatch, Strategy, get_strategy

register_cpu_attention_flops()


@dataclass
class StepMeasurement:
    """What one measured step of one rank produced."""

    loss: float | None
    comm: list[comm.CommRecord]
    memory: MemoryReport
    output: Tensor | None  # the global loss (train) or this rank's logits (infer)
    state: dict[str, int]  # bytes of parameters, gradients and optimizer state after the step
    c10d: list[comm.CommRecord]  # every collective as dispatched (the cross-check of ``comm``)
    trace: RankTrace | None = None  # the step's ops and collectives in program order (``trace=True``)
    attention_kernels: tuple[str, ...] = ()  # the attention kernels the step called (model.attention)

    def without_output(self) -> StepMeasurement:
        """The measurement with its output released: a bench keeps several steps' measurements,
        and an inference step's output is its [B, S, V] logits."""
        return dataclasses.replace(self, output=None)


@dataclass
class DecodeOutput:
    """One rank's decode run: per generated token (the prefill's, then one per step) the tokens of
    its slots [b, 1] and their logits (the prefill's: position S-1 of every sequence [B, V],
    meaningful on sequence rank 0; a step's: [b, V]); local seconds of the prefill and of each
    step when timed; counted FLOPs of the prefill and of all steps when counted."""

    tokens: list[Tensor]
    logits: list[Tensor]
    times_s: list[float] = field(default_factory=list)
    flops: dict[str, int] = field(default_factory=dict)
    energy_j: dict[str, float] = field(default_factory=dict)  # timed with a meter: prefill, steps
    cache_bytes: int = 0


class RankRun:
    """A strategy's model, optimizer and batch on this rank.

    ``device`` defaults to this rank's (tspbench.dist.launch.local_device); a fake world
    (tspbench.measure.fake) names the device it simulates, and builds the run under fake
    tensors: then nothing has values, and memory is always measured by the dispatch tracker.
    ``strategy``: a class to run instead of the registered one (benchmarks of variants).
    """

    def __init__(
        self,
        layout: Layout,
        workload: Workload,
        device: torch.device | None = None,
        strategy: type[Strategy] | None = None,
    ) -> None:
        cls = strategy or get_strategy(layout.strategy)
        rank = dist.get_rank() if dist.is_initialized() else 0
        world = dist.get_world_size() if dist.is_initialized() else 1
        if world != layout.world_size:
            raise LayoutError(f"{layout.describe()} needs {layout.world_size} ranks, this world has {world}")
        self.layout, self.workload = layout, workload
        self.device = device or local_device()
        self.fake = fake_mode_active()
        self.mesh = Mesh(cls.mesh_dims(layout), rank, channels=cls.channels)
        self.strategy: Strategy = cls(layout, workload, self.mesh, self.device)
        self.model: nn.Module = self.strategy.build()
        self.train = workload.mode == "train"
        # The parameters' own dtype: FSDP keeps float32 master shards under a bf16 policy.
        param_dtype = next(self.model.parameters()).dtype
        self.optimizer = build_optimizer(self.model.parameters(), param_dtype) if self.train else None
        tokens, targets = make_batch(
            workload.model, layout.data_degree * workload.batch, workload.seq_len, workload.seed, self.device
        )
        local = self.strategy.shard_batch(tokens, targets)
        # Own copies of this rank's shard: views would keep every rank's copy of the global batch
        # alive (dp x micro-batch x S token ids and targets; 256 MiB at dp 128 and 128K).
        self.batch: LocalBatch = dataclasses.replace(
            local, tokens=local.tokens.clone(), targets=local.targets.clone()
        )

    @property
    def world(self) -> comm.Group:
        return self.mesh.group(*self.mesh.names)

    def step(self, tracker: MemoryTracker | None = None):
        if self.workload.mode == "decode":
            return self.decode_run(tracker)
        return self.train_step(tracker) if self.train else self.infer_step()

    def train_step(self, tracker: MemoryTracker | None = None) -> Tensor:
        """One training step; returns the global mean loss. ``tracker`` classifies activations."""
        self.optimizer.zero_grad(set_to_none=True)
        autograd = tracker.track_autograd(self.model) if tracker is not None else nullcontext()
        with autograd:
            with comm.phase("forward"):
                loss = self.strategy.loss(self.model, self.batch)
            if tracker is not None:
                tracker.mark_activations()
            with comm.phase("backward"):
                loss.backward()
        with comm.phase("optimizer"):
            self.strategy.sync_grads(self.model)
            self.optimizer.step()
        with comm.phase("forward"):
            return self.strategy.reduce_loss(loss)

    @torch.no_grad()
    def infer_step(self) -> Tensor:
        """Prefill forward: the logits of this rank's tokens, in the strategy's layout."""
        with comm.phase("forward"):
            return self.strategy.logits(self.model, self.batch)

    @torch.no_grad()
    def decode_run(
        self,
        tracker: MemoryTracker | None = None,
        timed: bool = False,
        count_flops: bool = False,
        meter: EnergyMeter | None = None,
        graphs: DecodeGraphs | None = None,
    ) -> DecodeOutput:
        """Allocate the cache, prefill, then ``decode_tokens`` greedy steps (module doc). ``timed``:
        each part after a barrier, its seconds (and with ``meter`` its joules) kept. ``graphs``:
        the steps replayed as CUDA graphs over the graphs' own persistent cache."""
        self._meter = meter if timed else None
        s = self.strategy
        cache = graphs.cache if graphs is not None else s.allocate_cache()
        if tracker is not None:
            tracker.register(cache.tensors(), "kv_cache")
        out = DecodeOutput([], [], cache_bytes=cache.nbytes)
        with self._scope(out, "prefill", timed, count_flops), comm.phase("forward"):
            tokens, logits = s.prefill(self.model, self.batch, cache)
        out.tokens.append(tokens)
        out.logits.append(logits)
        for step in range(self.workload.decode_tokens):
            with self._scope(out, "steps", timed, count_flops), comm.phase("decode"):
                if graphs is not None:
                    logits = graphs.step(tokens, step)
                else:
                    logits = s.decode_step(self.model, tokens, cache, step)
                tokens = s.next_tokens(logits)
            out.tokens.append(tokens)
            out.logits.append(logits)
        return out

    @contextmanager
    def _scope(self, out: DecodeOutput, name: str, timed: bool, count_flops: bool) -> Iterator[None]:
        """Time a part of a decode run on this rank (barrier first), or count its FLOPs."""
        if count_flops:
            with FlopCounterMode(display=False) as counter:
                yield
            out.flops[name] = out.flops.get(name, 0) + counter.get_total_flops()
            return
        if timed:
            comm.barrier(self.world)
        joules = self._meter.read() if self._meter is not None else None
        start = time.perf_counter()
        yield
        if timed:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            out.times_s.append(time.perf_counter() - start)
            if joules is not None:
                out.energy_j[name] = out.energy_j.get(name, 0.0) + self._meter.read() - joules

    def measured_step(self, capacity_bytes: int | None = None, trace: bool = False) -> StepMeasurement:
        """One step with collectives counted (tspbench's own as issued, torch's wrappers' at
        dispatch level) and peak memory measured (the dispatch tracker; on a GPU the allocator's
        peak beside it); with ``trace`` its ops and collectives recorded in program order."""
        recorder = StepRecorder(self.mesh.rank, self.mesh.labels()) if trace else None
        with comm.counting() as log, C10dCounter(log, self.mesh.labels()) as c10d:
            with self._allocator_peak() as peak, MemoryTracker(capacity_bytes) as tracker:
                tracker.register_model(self.model, self.optimizer)
                tracker.register(self.strategy.resident_tensors(), "other")
                tracker.register([self.batch.tokens, self.batch.targets, self.batch.positions], "other")
                tracker.reset_peak()
                with self._recording(recorder), record_kernels() as kernels:
                    out = self.step(tracker)
            memory = tracker.report() if peak is None else peak.report(tracker.report())
        loss = out.item() if self.train and not self.fake else None
        state = persistent_bytes(self.model, self.optimizer)
        step_trace = recorder.trace() if recorder is not None else None
        return StepMeasurement(
            loss, list(log.records), memory, out, state, c10d.records, step_trace, tuple(sorted(kernels))
        )

    @contextmanager
    def _recording(self, recorder: StepRecorder | None) -> Iterator[None]:
        """The recorder over the step (innermost: it sees each op first), layers marked."""
        if recorder is None:
            yield
            return
        with recorder, mark_layers(self.model, recorder):
            yield

    def _allocator_peak(self) -> CudaPeak | nullcontext:
        """On a real GPU the allocator's peak (the tracker gives the categories beside it)."""
        return CudaPeak(self.device) if self.device.type == "cuda" and not self.fake else nullcontext()

    def counted_flops(self) -> int:
        """FLOPs of one step on this rank, by torch's FlopCounterMode. A step of its own: the
        counter's module hooks keep tensors alive under recomputation, so it must never share
        a step with the memory measurement."""
        with FlopCounterMode(display=False) as counter:
            self.step()
        return counter.get_total_flops()

    def timed_steps(self, n: int, clocks: list[dict[str, float] | None] | None = None) -> list[float]:
        """Wall time of ``n`` steps, each the slowest rank's (barrier before, max after); into
        ``clocks``, where this rank's time went in each (tspbench.measure.schedstat)."""
        times = []
        for _ in range(n):
            comm.barrier(self.world)
            start = time.perf_counter()
            with schedstat.Spent() as spent:
                self.step()
            if clocks is not None:
                clocks.append(spent.seconds)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=self.device)
            if self.world.size > 1:
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=self.world.pg)
            times.append(float(elapsed.item()))
        return times
