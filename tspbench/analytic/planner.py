"""``tspbench plan``: every layout of a cluster, ranked by predicted throughput, and why the rest fail.

For a model, a GPU count and a sequence length: every registered strategy at every combination
of degrees whose product divides the GPU count (the rest is data parallel), predicted by
tspbench.analytic. A layout is rejected when it is indivisible (heads, vocabulary, sequence),
does not fit in memory, or (unless allowed) its model-parallel group spans nodes. Tuned
(``tune=True``), each layout is priced at every setting its strategy takes (``settings``: its
switches, and every recompute mode in training unless one is fixed) and ranked at its fastest
setting that fits; one that fits at none is rejected at its lowest peak. Also:

    crossover   the tokens per micro-batch above which TSP moves fewer bytes per step than TP
                at the same degree (both grow linearly in tokens: two points give the line)
    frontier    the longest sequence that fits, per strategy and model-parallel degree, up to
                the model's max_seq_len (the positions it serves: no longer answer is of use)

``plan_decode`` answers the decode question: every layout ranked by predicted TPOT at batch B
(tspbench.analytic.decode), rejected when it does not fit (the cache included) or is indivisible.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

from tspbench.analytic.decode import DecodePrediction, predict_decode
from tspbench.analytic.hardware import Hardware
from tspbench.analytic.predict import Prediction, predict
from tspbench.core.errors import LayoutError
from tspbench.core.names import RECOMPUTE_MODES
from tspbench.core.spec import KV_EXCHANGES, MLP_EXCHANGES, Layout, ModelConfig, Workload
from tspbench.core.units import format_bytes
from tspbench.strategy import get_strategy, iter_strategies


@dataclass
class Candidate:
    layout: Layout
    prediction: Prediction | None = None
    reason: str | None = None  # why it cannot run; None when it fits
    workload: Workload | None = None  # the setting priced (a tuned plan's winner)


@dataclass
class PlanResult:
    ranked: list[Candidate]
    rejected: list[Candidate]
    crossover_tokens: dict[int, float] = field(default_factory=dict)
    frontier: dict[str, dict[int, int]] = field(default_factory=dict)  # 0: not even 1,024 tokens fit
    frontier_cap: int = 0  # the model's max_seq_len: a frontier of this fits at least that much


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(gpus: int) -> list[Layout]:
    """Every strategy at every degree assignment (each axis >= 2) whose product divides ``gpus``."""
    out = []
    for cls in iter_strategies():
        if not cls.axes:
            out.append(Layout(cls.name, dp=gpus))
            continue
        choices = [d for d in divisors(gpus) if d > 1]
        for degrees in itertools.product(choices, repeat=len(cls.axes)):
            mp = math.prod(degrees)
            if gpus % mp == 0:
                out.append(Layout(cls.name, dp=gpus // mp, **dict(zip(cls.axes, degrees, strict=True))))
    return out


SWITCH_VALUES: dict[str, tuple[object, ...]] = {
    "megatron_sp": (False, True),
    "kv_exchange": KV_EXCHANGES,
    "mlp_exchange": MLP_EXCHANGES,
    "overlap": (True, False),
}


def settings(strategy: str, workload: Workload, fixed_recompute: bool = False) -> list[Workload]:
    """``workload`` at every value of every switch ``strategy`` takes (``Strategy.switches``) and,
    in training unless ``fixed_recompute``, every recompute mode: what a tuned plan tries."""
    keys = [k for k in SWITCH_VALUES if k in get_strategy(strategy).switches]
    tunes_recompute = workload.mode == "train" and not fixed_recompute
    modes = RECOMPUTE_MODES if tunes_recompute else (workload.recompute,)
    return [
        replace(workload, recompute=mode, **dict(zip(keys, values, strict=True)))
        for mode in modes
        for values in itertools.product(*(SWITCH_VALUES[k] for k in keys))
    ]


def evaluate_tuned(
    layout: Layout, workload: Workload, hw: Hardware, allow_cross_node: bool, fixed_recompute: bool
) -> Candidate:
    """``layout`` at its fastest setting that fits; else at the setting of its lowest peak."""
    tried = [
        evaluate(layout, w, hw, allow_cross_node)
        for w in settings(layout.strategy, workload, fixed_recompute)
    ]
    fits = [c for c in tried if c.reason is None]
    if fits:
        return max(fits, key=lambda c: c.prediction.tokens_per_s_per_gpu)
    priced = [c for c in tried if c.prediction is not None]
    return min(priced, key=lambda c: c.prediction.memory.peak_bytes) if priced else tried[0]


def evaluate(layout: Layout, workload: Workload, hw: Hardware, allow_cross_node: bool) -> Candidate:
    candidate = Candidate(layout, workload=workload)
    mp = layout.world_size // layout.dp
    if mp > hw.gpus_per_node and not allow_cross_node:
        candidate.reason = f"crosses nodes: model-parallel group of {mp} > {hw.gpus_per_node} GPUs per node"
        return candidate
    try:
        candidate.prediction = predict(layout, workload, hw)
    except LayoutError as exc:
        candidate.reason = f"indivisible: {exc}"
        return candidate
    if not candidate.prediction.fits:
        peak, usable = candidate.prediction.memory.peak_bytes, hw.usable_bytes
        candidate.reason = f"out of memory: {format_bytes(peak)} > {format_bytes(usable)} usable"
    return candidate


def plan(
    workload: Workload,
    gpus: int,
    hw: Hardware,
    allow_cross_node: bool = False,
    frontier_degrees: tuple[int, ...] | None = None,
    tune: bool = False,
    fixed_recompute: bool = False,
) -> PlanResult:
    """Every layout of ``gpus`` GPUs priced at ``workload`` (tuned: at its best setting, see the
    module docstring), the fitting ones ranked by tokens/s per GPU."""
    layouts = candidate_layouts(gpus)
    if tune:
        candidates = [evaluate_tuned(lay, workload, hw, allow_cross_node, fixed_recompute) for lay in layouts]
    else:
        candidates = [evaluate(lay, workload, hw, allow_cross_node) for lay in layouts]
    fits = [c for c in candidates if c.reason is None]
    fits.sort(key=lambda c: -c.prediction.tokens_per_s_per_gpu)
    degrees = frontier_degrees or tuple(d for d in (2, 4, 8, 16) if d <= min(gpus, hw.gpus_per_node))
    return PlanResult(
        ranked=fits,
        rejected=[c for c in candidates if c.reason is not None],
        crossover_tokens={d: crossover_tokens(workload, d) for d in degrees},
        frontier=memory_frontier(workload, hw, degrees),
        frontier_cap=workload.model.max_seq_len,
    )


def _comm(layout: Layout, workload: Workload) -> float:
    records = get_strategy(layout.strategy).comm_volume(layout, workload)
    return sum(r.bus_bytes for r in records)


def crossover_tokens(workload: Workload, degree: int) -> float:
    """Tokens per micro-batch (B x S) above which TSP's bytes per step fall below TP's, both at
    ``degree``; inf when TSP never moves less (e.g. when the head count does not divide)."""
    try:
        seqs = [2 * degree * 1024, 2 * degree * 4096]
        lines = []
        for lay in (Layout("tsp", tsp=degree), Layout("tp", tp=degree)):
            ys = [_comm(lay, replace(workload, seq_len=s, batch=1)) for s in seqs]
            slope = (ys[1] - ys[0]) / (seqs[1] - seqs[0])
            lines.append((ys[0] - slope * seqs[0], slope))
    except LayoutError:
        return math.inf
    (a_tsp, b_tsp), (a_tp, b_tp) = lines
    if b_tp <= b_tsp:
        return math.inf
    return max(0.0, (a_tsp - a_tp) / (b_tp - b_tsp))


def memory_frontier(
    workload: Workload, hw: Hardware, degrees: tuple[int, ...], limit: int | None = None
) -> dict[str, dict[int, int]]:
    """Longest sequence (a multiple of 1024, or ``limit`` itself) that fits, per strategy and
    model-parallel degree; ``limit`` defaults to the model's max_seq_len, the positions it serves."""
    limit = limit or workload.model.max_seq_len
    out: dict[str, dict[int, int]] = {}
    for cls in iter_strategies():
        out[cls.name] = {}
        for degree in degrees if cls.axes else (1,):
            layout = _single_node_layout(cls.name, cls.axes, degree)
            if layout is not None:
                out[cls.name][degree] = _longest_fitting(layout, workload, hw, limit)
    return out


def _single_node_layout(name: str, axes: tuple[str, ...], degree: int) -> Layout | None:
    """The layout of ``degree`` GPUs; a 2-D mesh as square as possible (T = 2 for degree 8: 2 x 4)."""
    if not axes:
        return Layout(name)
    if len(axes) == 1:
        return Layout(name, **{axes[0]: degree})
    inner = max((d for d in divisors(degree) if d * d <= degree), default=1)
    if inner == 1:
        return None
    return Layout(name, **{axes[0]: degree // inner, axes[1]: inner})


def _fits(layout: Layout, workload: Workload, hw: Hardware, seq: int) -> bool:
    try:
        return predict(layout, replace(workload, seq_len=seq), hw).fits
    except LayoutError:
        return False


def _longest_fitting(layout: Layout, workload: Workload, hw: Hardware, limit: int) -> int:
    """``limit`` when it fits, else the longest multiple of 1024 below it that fits (bisected:
    a peak grows with the sequence), 0 when not even 1024 does."""
    step = 1024
    if limit < step or not _fits(layout, workload, hw, step):
        return 0
    if _fits(layout, workload, hw, limit):
        return limit
    lo, hi = step, -(-limit // step) * step  # lo fits, hi (at or past limit) does not
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        lo, hi = (mid, hi) if _fits(layout, workload, hw, mid) else (lo, mid)
    return lo


# ----------------------------------------------------------------------------- decode


@dataclass
class DecodeCandidate:
    layout: Layout
    prediction: DecodePrediction | None = None
    reason: str | None = None  # why it cannot decode here; None when it fits


@dataclass
class DecodePlan:
    """Layouts ranked by predicted TPOT (p50) at one batch, and why the others cannot run."""

    ranked: list[DecodeCandidate]
    rejected: list[DecodeCandidate]


def plan_decode(
    model: ModelConfig,
    gpus: int,
    hw: Hardware,
    batch: int,
    context: int,
    decode_tokens: int,
    dtype: str = "bfloat16",
    allow_cross_node: bool = False,
) -> DecodePlan:
    """ "Which layout decodes fastest at batch B?": every layout of ``gpus`` ranked by TPOT.
    Context and generated tokens beyond what the model serves are refused first (WorkloadError,
    as ``predict --mode decode``); the ranking's time does not grow with ``decode_tokens``."""
    Workload(model, batch, context, "decode", dtype=dtype, decode_tokens=decode_tokens)  # checks itself
    candidates = []
    for layout in candidate_layouts(gpus):
        candidate = DecodeCandidate(layout)
        mp = layout.world_size // layout.dp
        if mp > hw.gpus_per_node and not allow_cross_node:
            candidate.reason = (
                f"crosses nodes: model-parallel group of {mp} > {hw.gpus_per_node} GPUs per node"
            )
        else:
            try:
                candidate.prediction = predict_decode(layout, model, batch, context, decode_tokens, dtype, hw)
            except LayoutError as exc:
                candidate.reason = f"indivisible: {exc}"
        p = candidate.prediction
        if p is not None and not p.fits:
            candidate.reason = (
                f"out of memory: {format_bytes(p.peak_bytes)} > {format_bytes(hw.usable_bytes)} usable"
            )
        candidates.append(candidate)
    fits = sorted((c for c in candidates if c.reason is None), key=lambda c: c.prediction.tpot_s())
    return DecodePlan(fits, [c for c in candidates if c.reason is not None])
