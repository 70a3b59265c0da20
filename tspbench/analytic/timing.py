"""The time model of one step, per rank: what runs, at which rate, and what runs behind what.

    compute  =   GEMM FLOPs / GEMM rate / share   (Hardware.step_gemm_rate: as the profiled step ran them)
               + attention FLOPs / attention rate / attention share
                                  rectangles (a query chunk against the keys before it) and
                                  square causal blocks apart, each at the rate measured for its
                                  size (the zigzag chunk; the square's side)
               + element-wise bytes / memory bandwidth / share
               + kernels x op_overhead_us / share   each GEMM and attention kernel, and each
                                  element-wise kernel where its bytes are counted (measured
                                  passes are device time, their kernels' fixed cost in it);
                                  kernels counted from the model's code (tspbench.costs.kernels)
               + host: ops (kernels and views) x host_overhead_us, and where a GPU's host
                 launching them at launch_us each is slower than the device, the difference
               share: the rank's share of its device, 1 on a GPU; on a CPU host whose ranks
               outnumber its cores, what calibrate measured them to get running GEMMs (and,
               apart, attention) all at once
    comm     = sum over the step's collectives of count x (latency + bus bytes / bandwidth), each
               at the figures measured for its op and group size (else the link it spans:
               ranks are placed model-parallel innermost, so a group wider than a node crosses
               the NIC); batched calls (the gradient all-reduces, issued async together) at
               their batched latency
             + waits x sync  where ranks share a host's cores, a blocking call after compute
               also waits for its peers, which drifted apart while they computed: once per
               call and once per phase's batch, each at the wait calibrate's ``sync_us``
               measured after the same length of compute (compute / waits; 0 on GPUs:
               nothing measured, nothing added)
    step     = compute + exposed + (1 - eta) hidden + max(0, eta hidden - compute)
             where a hidden collective declares the compute it can hide behind (its Traffic's
             window: TSP's weight shards, each behind the GEMMs of the shard in hand), what
             outlasts that window is exposed, call by call, and only the rest counts as hidden;
             the calls of one phase in flight in the same named window share the link, so
             their times add before the window hides them

"Hidden" is what the strategy's schedule overlaps with compute (its Traffic says so: TSP's
weight shards behind its GEMMs, gradient reduces and accumulators riding the ring, DDP's
bucketed gradient all-reduce behind backward); "exposed" is on the critical path (activation
all-reduces, K/V gathers, a gradient all-reduce issued after backward). eta is the profile's
measured overlap efficiency: the fraction of hidden traffic that truly runs under compute (on a
CPU host whose cores are all busy computing, gloo's transfers cannot run anywhere else).

Element-wise bytes: every op that is not a GEMM or attention (norms, RoPE, the gated product,
residual adds, copies, the loss, AdamW). A datasheet profile counts them from the code the step
runs: the model's operators in the strategy's per-rank shapes and what the strategy's own code
adds (Strategy.elementwise_step_bytes, tspbench.costs.elementwise), and what the optimizer's
implementation moves per parameter (tspbench.model.optim.step_bytes_per_element). A profile that
measured them (``calibrate``, on a CPU: the element-wise ops' time of a single-device step at
the measured bandwidth) or fitted them (``backtest --fit``) gives ``elementwise_passes`` instead:
passes over the activations a block computes (Strategy.elementwise_layer_bytes), per layer,
one forward's more under full recomputation, and over the parameter bytes for AdamW (counted
when the profile gives no optimizer passes). Measured passes are calibrate's device time of a
single-device step over the bytes of that step, in its dtype (bf16 on a GPU).

Per-kernel and host costs as the timeline prices them op by op (tspbench.analytic.replay_costs),
from a count of the step's kernels (tspbench.costs.kernels: the model's own ops, exact for dp;
what a strategy's own code adds is not counted).
"""

from __future__ import annotations

from dataclasses import dataclass

from tspbench.analytic import prices
from tspbench.analytic.hardware import ASSUMED_PASSES, Hardware
from tspbench.core.spec import Layout, Workload
from tspbench.costs.elementwise import ElementwiseWork
from tspbench.costs.flops import FlopTerms
from tspbench.costs.kernels import StepKernels, step_kernels
from tspbench.dist.mesh import Mesh
from tspbench.model.optim import step_bytes_per_element
from tspbench.strategy.traffic import Traffic


@dataclass(frozen=True)
class StepTime:
    """Seconds of one step on one rank, by what they are spent on."""

    gemm_s: float
    attention_s: float
    elementwise_s: float
    comm_exposed_s: float  # collectives on the critical path
    comm_hidden_s: float  # collectives the schedule overlaps with compute (all of them)
    overlap_efficiency: float
    share: float  # the rank's share of its device
    host_s: float = 0.0  # the host's time per op, and where it is behind the device, the wait

    @property
    def compute_s(self) -> float:
        return self.gemm_s + self.attention_s + self.elementwise_s + self.host_s

    @property
    def hidden_exposed_s(self) -> float:
        """The part of the overlapped traffic that still costs time: what the device could not
        overlap (1 - eta) and what outlasts the compute it hides behind."""
        return prices.hidden_exposed(self.compute_s, self.comm_hidden_s, self.overlap_efficiency)

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_exposed_s + self.hidden_exposed_s

    def to_dict(self, prefix: str = "") -> dict[str, float]:
        return {
            f"{prefix}step_time_s": self.step_s,
            f"{prefix}compute_s": self.compute_s,
            f"{prefix}gemm_s": self.gemm_s,
            f"{prefix}attention_s": self.attention_s,
            f"{prefix}elementwise_s": self.elementwise_s,
            f"{prefix}comm_exposed_s": self.comm_exposed_s + self.hidden_exposed_s,
            f"{prefix}comm_hidden_s": self.comm_hidden_s - self.hidden_exposed_s,
        }


def ranks_per_node(layout: Layout, hw: Hardware) -> int:
    return hw.ranks_on_node(layout.world_size)


def compute_seconds(
    flops: FlopTerms,
    elementwise_bytes: float,
    hw: Hardware,
    ranks_on_node: int,
    kernels: StepKernels | None = None,
) -> tuple[float, float, float]:
    """(GEMM, attention, element-wise) seconds at the rank's share of its device, each with its
    ``kernels``' fixed cost (``prices.kernel_overhead_seconds``; None: none counted). Element-wise
    kernels count only where their bytes are counted: measured passes hold their fixed cost."""
    share, attention_share = hw.share(ranks_on_node), hw.attention_share(ranks_on_node)
    causal = flops.attention * flops.causal_fraction
    block = flops.causal_block
    attention = prices.attention_seconds(hw, flops.attention - causal, False, block)
    attention += prices.attention_seconds(hw, causal, True, block)
    k = kernels or StepKernels(0, 0, 0, 0)
    counted = 0 if hw.elementwise_passes else k.elementwise
    elementwise = prices.elementwise_seconds(elementwise_bytes, prices.elementwise_gbs(hw))
    fixed = prices.kernel_overhead_seconds
    return (
        prices.at_share(prices.gemm_seconds(hw, flops.gemm), share, fixed(hw, k.gemm)),
        prices.at_share(attention, attention_share, fixed(hw, k.attention)),
        prices.at_share(elementwise, share, fixed(hw, counted)),
    )


def crosses_nodes(mesh: Mesh, t: Traffic, gpus_per_node: int) -> bool:
    """Whether the group's ranks span nodes (ranks are placed row-major, model-parallel innermost)."""
    return prices.crosses_nodes(mesh.group(*t.axes).ranks, gpus_per_node)


def call_seconds(mesh: Mesh, t: Traffic, hw: Hardware) -> float:
    """One call of ``t``: latency + transfer on the link its group crosses."""
    inter = crosses_nodes(mesh, t, hw.gpus_per_node)
    n = mesh.size(*t.axes)
    return sum(prices.collective_seconds(hw, t.op, n, mesh.world_size, inter, t.msg_bytes, t.batched))


def comm_seconds(mesh: Mesh, traffic: list[Traffic], hw: Hardware, share: float = 1.0) -> tuple[float, float]:
    """(exposed, hidden) seconds of the step's collectives. Hidden calls with a window hide at
    most its GEMM seconds (at the rank's ``share`` of its device); the calls that share a named
    window (same phase) take turns on the link, so their times add before the window hides them.
    A blocking call queued behind a window waits for what its transfers still hold of the link
    when it is issued, beyond what the window already exposes."""
    exposed = hidden = 0.0
    windows: dict[tuple, list[tuple[Traffic, float]]] = {}
    queued: list[tuple[Traffic, float]] = []
    for t in traffic:
        n = mesh.size(*t.axes)
        if n == 1 or not t.count:
            continue
        call = call_seconds(mesh, t, hw)
        if not t.hidden:
            exposed += t.count * call
            queued += [(t, call)] if t.queue else []
            continue
        if t.window_flops is None:
            hidden += t.count * call
        if t.window:
            windows.setdefault((t.phase, t.window), []).append((t, call))
        elif t.window_flops is not None:
            windows[(t.phase, id(t))] = [(t, call)]
    spans = {key: window_span(calls, hw, share) for key, calls in windows.items()}
    for count, per_window, compute in spans.values():
        if compute is not None:
            under, over = prices.behind(per_window, compute)
            hidden += count * under
            exposed += count * over
    for t, _ in queued:
        if (t.phase, t.queue) in spans:
            count, per_window, compute = spans[(t.phase, t.queue)]
            ahead = prices.behind(per_window, gemm_window_seconds(t.queue_flops, hw, share))[1]
            exposed += min(count, t.count) * (ahead - (max(0.0, per_window - compute) if compute else 0.0))
    return exposed, hidden


def window_span(
    calls: list[tuple[Traffic, float]], hw: Hardware, share: float
) -> tuple[int, float, float | None]:
    """(occurrences, seconds of its transfers per occurrence, seconds of compute it hides behind
    or None where unbounded) of one named window."""
    count = max(t.count for t, _ in calls)
    per_window = sum(t.count * call for t, call in calls) / count
    bounds = [t.window_flops for t, _ in calls if t.window_flops is not None]
    return count, per_window, (gemm_window_seconds(max(bounds), hw, share) if bounds else None)


def gemm_window_seconds(flops: float, hw: Hardware, share: float) -> float:
    """The GEMMs a window's transfers hide behind, at the rank's share of its device."""
    return prices.at_share(prices.gemm_seconds(hw, flops), share)


def sync_seconds(mesh: Mesh, traffic: list[Traffic], hw: Hardware, compute_s: float) -> float:
    """What the step's waits on peers cost: each after compute_s / waits of compute, on average."""
    waits = sync_calls(mesh, traffic)
    ranks = hw.ranks_on_node(mesh.world_size)
    return waits * prices.peer_wait_seconds(hw, ranks, compute_s / waits) if waits else 0.0


def sync_calls(mesh: Mesh, traffic: list[Traffic]) -> int:
    """Times a rank waits on its peers: once per collective call (a hidden one's wait too), once
    per phase for its batched calls (issued together, waited on together)."""
    calls = [t for t in traffic if mesh.size(*t.axes) > 1 and t.count]
    return sum(t.count for t in calls if not t.batched) + len({t.phase for t in calls if t.batched})


def elementwise_bytes(workload: Workload, work: ElementwiseWork, hw: Hardware) -> float:
    """Bytes the step's element-wise ops move (see the module docstring): counted from the code,
    or on a profile that measured or fitted its passes, those passes over what a block computes."""
    passes = hw.elementwise_passes
    if not passes:
        return float(work.counted + optimizer_bytes(workload, work, hw))
    block = passes.get(workload.mode, ASSUMED_PASSES[workload.mode])
    if workload.mode == "train" and workload.recompute in ("full", "op"):  # op: its element-wise ops too
        block += passes.get("infer", ASSUMED_PASSES["infer"])  # each block's forward runs again
    activations = block * workload.model.n_layers * work.layer
    return float(activations + optimizer_bytes(workload, work, hw))


def optimizer_bytes(workload: Workload, work: ElementwiseWork, hw: Hardware) -> float:
    """What AdamW's step moves: the profile's passes over the parameter bytes where it measured
    (or fitted) them, else what the implementation the code picks moves per element."""
    if workload.mode != "train":
        return 0.0
    if "optimizer" in hw.elementwise_passes:
        return hw.elementwise_passes["optimizer"] * work.params
    elt = work.param_element_size
    return float(work.params // elt * step_bytes_per_element(elt, workload.device == "cuda"))


def step_time(
    layout: Layout,
    workload: Workload,
    hw: Hardware,
    flops: FlopTerms,
    mesh: Mesh,
    traffic: list[Traffic],
    work: ElementwiseWork,
) -> StepTime:
    """The step's time on ``hw`` from a strategy's FLOPs, traffic and sizes."""
    ranks = ranks_per_node(layout, hw)
    share = hw.share(ranks)
    elementwise = elementwise_bytes(workload, work, hw)
    kernels = step_kernels(workload)
    gemm, attention, other = compute_seconds(flops, elementwise, hw, ranks, kernels)
    host = prices.at_share(prices.host_seconds(hw, kernels.ops, gemm + attention + other), share)
    exposed, hidden = comm_seconds(mesh, traffic, hw, share)
    exposed += sync_seconds(mesh, traffic, hw, gemm + attention + other + host)
    return StepTime(gemm, attention, other, exposed, hidden, hw.overlap_efficiency, share, host)
