"""What a projected verdict rests on: every profile figure the step's time reads, varied over the
range its provenance allows, and where the faster of two layouts changes.

A projection on a profile of datasheet and assumed figures (the MI300X's) is only as good as
those figures, and no MI300X can be measured here. So instead of one number, each figure that is
not measured is moved over a range its provenance sets, the rest held:

    assumed (or unstated, or carried from another device)   x0.5 to x2
    datasheet                                                x0.6 to x1 (a peak is an upper bound)
    measured                                                 within MEASURED_SPREAD either side

Each value is priced exactly as a hand-edited profile would be: a copy of the Hardware with one
figure changed (``Figure.at``), then the same ``predict`` path through the one price list
(tspbench.analytic.prices); nothing here prices anything itself. Two layouts at one point get,
per figure, the value where their tokens/s per GPU are equal (``break_evens``): inside the
figure's range (the verdict flips there), or past it (the verdict holds over the whole range,
and ``beyond`` says how far it would have to move).

The figures are those the closed-form step time of a GPU reads (tspbench.analytic.timing): the
GEMM and attention rates, HBM bandwidth, each link's bandwidth and latency, the collectives'
measured bandwidth and latency (the ring shift - send_recv, TSP's MLP ring - apart from the
group collectives, by group size), the overlap efficiency and the per-kernel and host costs.
Figures a GPU step does not read (memory, MFU's peak, a CPU host's contention tables) are left
out; a figure a profile sets to 0 (no cost) has nothing to scale and is left out too.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from tspbench.analytic.hardware import Collective, Hardware
from tspbench.analytic.predict import Prediction, predict
from tspbench.core.spec import Layout, Workload

RANGES = {"assumed": (0.5, 2.0), "datasheet": (0.6, 1.0)}
MEASURED_SPREAD = 0.1  # a measured figure's spread where the profile records none (calibrate: ~2-10%)
WIDE = (1 / 20, 20.0)  # how far past its range a break-even is looked for, as factors
RING = "send_recv"  # the collective of a ring shift (TSP's MLP weight ring)

Rescale = Callable[[Hardware, float], Hardware]  # the profile with the figure x factor


@dataclass(frozen=True)
class Figure:
    """One profile figure the step time reads, its value, where it comes from and its range."""

    key: str  # a name for the command line and the tables: 'gemm_tflops', 'ring_shift_gbs'
    label: str
    unit: str
    value: float
    provenance: str  # 'assumed', 'datasheet', 'measured' (the class; ``source`` the profile's words)
    source: str
    low: float  # the range, in the figure's unit
    high: float
    rescale: Rescale = field(compare=False, repr=False)
    cap: float | None = None  # a value the figure cannot pass (overlap efficiency: 1)

    def at(self, hw: Hardware, value: float) -> Hardware:
        """A copy of ``hw`` with this figure at ``value`` (every entry it stands for scaled
        alike), as editing the profile's YAML by hand would give."""
        return self.rescale(hw, value / self.value)


def provenance_class(text: str) -> str:
    """'measured', 'datasheet' or 'assumed' from a profile's provenance words: a figure part
    assumed ('datasheet and assumed', an assumed ratio) is assumed; so is one the profile does
    not state, or carries from another device without saying it was measured here."""
    words = text.strip().lower()
    if words.startswith("measured"):
        return "measured"
    if "assumed" in words or "carried" in words or words in ("", "unstated"):
        return "assumed"
    return "datasheet" if "datasheet" in words else "assumed"


def value_range(value: float, provenance: str, cap: float | None = None) -> tuple[float, float]:
    """The figure's range from its provenance class (module docstring), clipped at ``cap``."""
    low, high = RANGES.get(provenance, (1 - MEASURED_SPREAD, 1 + MEASURED_SPREAD))
    top = value * high if cap is None else min(cap, value * high)
    return value * low, top


def _scaled(**names: str) -> Rescale:
    """A rescale of scalar fields (keys) and their tables (values: a dict field, or '')."""

    def rescale(hw: Hardware, factor: float) -> Hardware:
        changes: dict[str, object] = {k: getattr(hw, k) * factor for k in names}
        for table in filter(None, names.values()):
            changes[table] = {k: v * factor for k, v in getattr(hw, table).items()}
        return replace(hw, **changes)

    return rescale


def _collectives(keep: Callable[[Collective], bool], attr: str) -> Rescale:
    def rescale(hw: Hardware, factor: float) -> Hardware:
        scaled = [replace(c, **{attr: getattr(c, attr) * factor}) if keep(c) else c for c in hw.collectives]
        if attr == "latency_us":  # a batched call's latency moves with its latency
            scaled = [
                replace(c, batched_latency_us=c.batched_latency_us * factor)
                if keep(c) and c.batched_latency_us
                else c
                for c in scaled
            ]
        return replace(hw, collectives=scaled)

    return rescale


def figures(hw: Hardware) -> list[Figure]:
    """Every figure of ``hw`` that a GPU step's time reads and that is not 0 (module docstring)."""
    gemm_key = "step_gemm_tflops" if hw.step_gemm_tflops else "gemm_tflops"
    rows: list[tuple[str, str, str, float, str, Rescale, float | None]] = [
        ("gemm_tflops", "GEMM rate", "TFLOP/s", hw.step_gemm_rate, gemm_key,
         _scaled(gemm_tflops="", **({"step_gemm_tflops": ""} if hw.step_gemm_tflops else {})), None),
        ("attention_tflops", "attention rate" + ("" if _own_causal(hw) else " (causal: 2x)"), "TFLOP/s",
         hw.attention_tflops, "attention_tflops", _attention(hw), None),
        ("hbm_bandwidth_gbs", "HBM bandwidth", "GB/s", hw.hbm_bandwidth_gbs, "hbm_bandwidth_gbs",
         _scaled(hbm_bandwidth_gbs="elementwise_by_op"), None),
        ("overlap_efficiency", "overlap efficiency", "", hw.overlap_efficiency, "overlap_efficiency",
         _scaled(overlap_efficiency=""), 1.0),
    ]  # fmt: skip
    if _own_causal(hw):
        rows.append(("attention_causal_tflops", "causal attention rate", "TFLOP/s", hw.causal_tflops(),
                     "attention_causal_tflops", _scaled(attention_causal_tflops="attention_causal_by_size"),
                     None))  # fmt: skip
    for key, label, unit in (
        ("intra_node_bandwidth_gbs", "link in a node (unlisted collectives)", "GB/s"),
        ("intra_node_latency_us", "latency in a node (unlisted collectives)", "us"),
        ("inter_node_bandwidth_gbs", "link across nodes", "GB/s"),
        ("inter_node_latency_us", "latency across nodes", "us"),
        ("op_overhead_us", "fixed cost per kernel", "us"),
        ("host_overhead_us", "host cost per op", "us"),
        ("launch_us", "host launch per op", "us"),
    ):
        rows.append((key, label, unit, getattr(hw, key), key, _scaled(**{key: ""}), None))
    rows += _collective_rows(hw)
    out = []
    for key, label, unit, value, source_key, rescale, cap in rows:
        if not value or value <= 0:
            continue
        source = hw.source_of(source_key)
        cls = provenance_class(source)
        low, high = value_range(value, cls, cap)
        out.append(Figure(key, label, unit, value, cls, source, low, high, rescale, cap))
    return out


def _attention(hw: Hardware) -> Rescale:
    """The attention rate's rescale: the rectangles', and the causal squares' where they follow it."""
    if _own_causal(hw):
        return _scaled(attention_tflops="attention_by_size")
    return _scaled(attention_tflops="attention_by_size", attention_causal_tflops="attention_causal_by_size")


def _own_causal(hw: Hardware) -> bool:
    """Whether the profile gives causal attention its own rate (else it is 2x the rectangle's)."""
    return bool(hw.attention_causal_tflops or hw.attention_causal_by_size)


def _collective_rows(hw: Hardware) -> list[tuple[str, str, str, float, str, Rescale, None]]:
    """The measured collectives, as figures: the ring shift (send_recv) apart from the group
    collectives, whose bandwidth is one figure per group size and latency one figure."""
    calls = hw.collectives
    rows = []
    ring = [c for c in calls if c.op == RING]
    is_ring = lambda c: c.op == RING  # noqa: E731
    if ring:
        rows.append(("ring_shift_gbs", "ring shift bandwidth (send_recv)", "GB/s",
                     max(c.bandwidth_gbs for c in ring), "collectives",
                     _collectives(is_ring, "bandwidth_gbs"), None))  # fmt: skip
        rows.append(("ring_shift_latency_us", "ring shift latency", "us", max(c.latency_us for c in ring),
                     "collectives", _collectives(is_ring, "latency_us"), None))  # fmt: skip
    group = [c for c in calls if c.op != RING]
    for n in sorted({c.group_size for c in group}):
        mine = [c for c in group if c.group_size == n]
        of_n = _collectives(lambda c, n=n: c.op != RING and c.group_size == n, "bandwidth_gbs")
        rows.append((f"collective_{n}_gbs", f"collective bandwidth, groups of {n}", "GB/s",
                     max(c.bandwidth_gbs for c in mine), "collectives", of_n, None))  # fmt: skip
    if group:
        rows.append(("collective_latency_us", "collective latency", "us", max(c.latency_us for c in group),
                     "collectives", _collectives(lambda c: c.op != RING, "latency_us"), None))  # fmt: skip
    return rows


def figure_named(hw: Hardware, key: str) -> Figure:
    """The figure ``key`` of ``hw``, or a ValueError listing the figures it has."""
    known = {f.key: f for f in figures(hw)}
    if key not in known:
        raise ValueError(f"no figure {key!r} in profile {hw.name}; it has: {', '.join(known)}")
    return known[key]


# ----------------------------------------------------------------------------- one layout's swing


@dataclass(frozen=True)
class Swing:
    """A layout's step time with one figure at each end of its range, the rest held."""

    figure: Figure
    base_s: float
    low_s: float  # the figure at ``figure.low``
    high_s: float  # at ``figure.high``

    @property
    def span_s(self) -> float:
        return abs(self.high_s - self.low_s)


def priced(layout: Layout, workload: Workload, hw: Hardware) -> Prediction:
    """The one predict path every number here goes through (a hand-edited profile goes too)."""
    return predict(layout, workload, hw)


def swings(layout: Layout, workload: Workload, hw: Hardware, chosen: Sequence[Figure] = ()) -> list[Swing]:
    """Each figure's swing of ``layout``'s step time (the tornado), largest first."""
    base = priced(layout, workload, hw).step_time_s
    rows = [
        Swing(f, base, *(priced(layout, workload, f.at(hw, v)).step_time_s for v in (f.low, f.high)))
        for f in (chosen or figures(hw))
    ]
    return sorted(rows, key=lambda s: -s.span_s)


@dataclass(frozen=True)
class Band:
    """The range of a point's tokens/s per GPU as each figure not measured moves over its range,
    one at a time, the rest held: the envelope of the tornado's ends, not every figure at once
    (2 prices per figure, where the joint corners would need 2^n)."""

    low: float
    base: float
    high: float

    @property
    def width(self) -> float:
        return self.high - self.low


def band(layout: Layout, workload: Workload, hw: Hardware, chosen: Sequence[Figure] = ()) -> Band:
    """``layout``'s tokens/s per GPU with each unmeasured figure of ``hw`` (or of ``chosen``) at
    either end of its range: what a projected figure's band draws. A measured figure stays: the
    band is what the profile's assumptions leave open, so a profile measured throughout has none."""
    base = priced(layout, workload, hw).tokens_per_s_per_gpu
    moved = [f for f in (chosen or figures(hw)) if f.provenance != "measured"]
    ends = [
        priced(layout, workload, f.at(hw, v)).tokens_per_s_per_gpu for f in moved for v in (f.low, f.high)
    ]
    return Band(min([base, *ends]), base, max([base, *ends]))


# ----------------------------------------------------------------------------- two layouts' break-even


@dataclass(frozen=True)
class BreakEven:
    """Where the faster of layouts a and b changes as one figure moves, the rest held."""

    figure: Figure
    ratio: float  # a's tokens/s per GPU over b's at the profile's value (> 1: a faster)
    value: float | None  # the figure's value where they are equal, inside its range; None: none
    beyond: float | None  # the nearest such value past the range (within WIDE x); None: none there
    ratio_low: float  # the ratio with the figure at each end of its range
    ratio_high: float

    @property
    def flips(self) -> bool:
        return self.value is not None


def speed_ratio(
    a: Layout, b: Layout, workload: Workload, hw: Hardware, against: Workload | None = None
) -> float:
    """a's tokens/s per GPU over b's on ``hw`` (> 1: a is faster); b runs ``against`` where given
    (its own recomputation and settings: each layout at its best), else ``workload``."""
    theirs = priced(b, against or workload, hw)
    return priced(a, workload, hw).tokens_per_s_per_gpu / theirs.tokens_per_s_per_gpu


def break_evens(
    a: Layout,
    b: Layout,
    workload: Workload,
    hw: Hardware,
    chosen: Sequence[Figure] = (),
    against: Workload | None = None,
) -> list[BreakEven]:
    """For each figure, where a and b are equally fast (``BreakEven``), in the figures' order; b
    runs ``against`` where given (as in ``speed_ratio``). A figure that moves neither layout's
    time at either end of its range is not searched past it."""
    rows = []
    for f in chosen or figures(hw):
        gap = _memo(_gap(a, b, workload, hw, f, against))
        inside = _nearest_root(gap, f.value, f.low, f.high)
        beyond = None
        moves = len({gap(v) for v in (f.value, f.low, f.high)}) > 1
        if inside is None and moves:
            top = f.value * WIDE[1] if f.cap is None else min(f.cap, f.value * WIDE[1])
            beyond = _nearest_root(gap, f.value, f.value * WIDE[0], top, inner=(f.low, f.high))
        ratios = [math.exp(gap(v)) for v in (f.value, f.low, f.high)]
        rows.append(BreakEven(f, ratios[0], inside, beyond, ratios[1], ratios[2]))
    return rows


def _gap(
    a: Layout, b: Layout, workload: Workload, hw: Hardware, f: Figure, against: Workload | None
) -> Callable[[float], float]:
    """log(a's speed / b's) with figure ``f`` at a value: 0 where they break even."""
    return lambda v: math.log(speed_ratio(a, b, workload, f.at(hw, v), against))


def _memo(fn: Callable[[float], float]) -> Callable[[float], float]:
    seen: dict[float, float] = {}
    return lambda v: seen[v] if v in seen else seen.setdefault(v, fn(v))


def _nearest_root(
    gap: Callable[[float], float],
    start: float,
    low: float,
    high: float,
    steps: int = 4,
    inner: tuple[float, float] | None = None,
) -> float | None:
    """The value nearest ``start`` in [low, high] where ``gap`` changes sign (scanned outward in
    ``steps`` log-spaced steps each way, then solved), or None. ``inner``: a range already
    searched, so the scan starts at its ends."""
    found = []
    for end in (high, low):
        origin = start if inner is None else (inner[1] if end > start else inner[0])
        if end <= 0 or (end > origin) != (end > start) or end == origin:
            continue
        grid = [origin * (end / origin) ** (k / steps) for k in range(steps + 1)]
        grid[-1] = end
        for v0, v1 in itertools.pairwise(grid):
            g0, g1 = gap(v0), gap(v1)
            if g0 == 0 or (g0 > 0) != (g1 > 0):
                found.append(v0 if g0 == 0 else _solve(gap, v0, v1, g0, g1))
                break
    return min(found, key=lambda v: abs(math.log(v / start)), default=None)


def _solve(
    gap: Callable[[float], float], v0: float, v1: float, g0: float, g1: float, rel: float = 1e-6
) -> float:
    """The root of ``gap`` between v0 and v1 (signs of g0, g1 differ): regula falsi in log(v),
    Illinois-damped (the gap is close to linear there, so a few steps do), to ``rel``."""
    x0, x1, side = math.log(v0), math.log(v1), 0
    for _ in range(60):
        x = x1 - g1 * (x1 - x0) / (g1 - g0)
        g = gap(math.exp(x))
        if g == 0 or abs(x1 - x0) < rel:
            return math.exp(x)
        if (g > 0) == (g1 > 0):
            x1, g1 = x, g
            g0 = g0 / 2 if side == 1 else g0
            side = 1
        else:
            x0, g0 = x, g
            g1 = g1 / 2 if side == -1 else g1
            side = -1
        if abs(x1 - x0) < rel:
            return math.exp(x)
    return math.exp(x)
