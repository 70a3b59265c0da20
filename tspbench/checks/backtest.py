"""The backtest: every published run of the test set (tspbench.checks.published) predicted with
the shipped profiles, and how far off the project is.

For each entry and each profile of its hardware:

    tokens/s/GPU   predicted = the step's tokens per GPU / the predicted step time
    error          predicted / published - 1 (positive: the model is too optimistic)
    terms          the step's time by what it is spent on, and the two that dominate
    memory         the fake world's executed peak (allocated: live tensors, results/published/
                   fake/), the model's peak, and what the profile assumes the caching allocator
                   reserves on top (``reserved_overhead_fraction``): published runs often give
                   reserved memory (torchtitan logs max_reserved)

Two profiles predict each hardware (the file's ``profiles``): ``assumed``, the shipped
assumptions with nothing fitted, so every entry is out of sample for it; and ``calibrated``
(``calibrated_compile`` under torch.compile), whose fitted numbers come from the entries marked
``calibration`` and are scored on the ``test`` entries. ``fit_passes`` is the fit, so the
numbers in those profiles can be re-derived (``tspbench check backtest --fit``).

Time comes from one function, ``predict_point``: swap the time model there and every column
follows.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from tspbench.analytic.hardware import Hardware
from tspbench.analytic.predict import Prediction, predict
from tspbench.analytic.profile_choice import named_profile
from tspbench.checks.published import Entry, Published, fake_record_path, read_fake_record
from tspbench.core.errors import DamagedFileError, ExperimentError
from tspbench.core.spec import Layout, Workload
from tspbench.core.trace import load_traces
from tspbench.measure.replayed import reprice

T = TypeVar("T")

GIB = 2**30
PROFILE_KINDS = ("assumed", "calibrated")


def predict_point(layout: Layout, workload: Workload, hw: Hardware) -> Prediction:
    """The one place the backtest gets a step's time (and memory) from: the analytic model."""
    return predict(layout, workload, hw)


def profile_for(published: Published, entry: Entry, kind: str) -> str | None:
    """The profile that predicts ``entry`` as ``kind`` (assumed or calibrated); None where that
    profile cannot: the assumed profiles model no torch.compile."""
    names = published.profiles[entry.hardware["profile"]]
    if entry.compile:
        return names["calibrated_compile"] if kind == "calibrated" else None
    return names[kind]


def tokens_per_gpu_per_step(layout: Layout, workload: Workload) -> int:
    """Tokens a step trains, per GPU: every data-parallel rank takes ``batch`` sequences."""
    return layout.data_degree * workload.batch * workload.seq_len // layout.world_size


def step_terms(p: Prediction) -> dict[str, float]:
    """The predicted step's seconds by what they are spent on (they add up to the step)."""
    t = p.time
    return {
        "GEMM": t.gemm_s,
        "attention": t.attention_s,
        "element-wise": t.elementwise_s,
        "exposed comm": t.comm_exposed_s,
        "overlap shortfall": t.hidden_exposed_s,
    }


def dominant(terms: dict[str, float], n: int = 2) -> str:
    """'GEMM 59%, element-wise 21%': the ``n`` largest terms and their share of the step."""
    total = sum(terms.values())
    top = sorted(terms.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{name} {seconds / total:.0%}" for name, seconds in top)


def error(predicted: float | None, published: float | None) -> float | None:
    """predicted / published - 1, or None when either is missing."""
    if predicted is None or not published:
        return None
    return predicted / published - 1


# ----------------------------------------------------------------------------- rows


def backtest_rows(published: Published, results: Path) -> list[dict[str, Any]]:
    """One row per entry: what was published, and (for predicted entries) each profile's
    prediction, its error and terms, and the memory figures."""
    cache: dict[str, Hardware] = {}
    return [_row(published, e, results, cache) for e in published.entries]


def _row(published: Published, e: Entry, results: Path, cache: dict[str, Hardware]) -> dict[str, Any]:
    m = e.measured
    row: dict[str, Any] = {
        "id": e.id,
        "role": e.role,
        "source": source_text(e),
        "gpus": e.hardware["gpus"],
        "published_layout": e.published_layout,
        "seq_len": e.seq_len,
        "local_batch": e.local_batch,
        "activation_checkpointing": e.raw["activation_checkpointing"],
        "compile": e.compile,
        "float8": e.raw["float8"],
        "published_tokens_per_s_per_gpu": m["tokens_per_s_per_gpu"],
        "published_memory_gib": m["memory_gib"],
        "published_memory_kind": m["memory_kind"],
        "predicted": e.predicted,
        "not_predicted": e.not_predicted,
    }
    if not e.predicted:
        return row
    layout, workload = e.point()
    row.update(expressed_as=layout.describe(), recompute=workload.recompute)
    damaged: list[str] = []  # stored files that did not read back: left out, named in the row
    for kind in PROFILE_KINDS:
        name = profile_for(published, e, kind)
        row.update(_time_columns(kind, name, layout, workload, m["tokens_per_s_per_gpu"], cache))
        tps = m["tokens_per_s_per_gpu"]
        row.update(_timeline_columns(kind, name, layout, workload, results, tps, cache, damaged))
    row.update(_memory_columns(published, e, layout, workload, results, cache, damaged))
    if damaged:  # only then: the stored backtest.csv keeps its columns
        row["damaged"] = list(dict.fromkeys(damaged))
    return row


def _stored(read: Callable[[], T], damaged: list[str]) -> T | None:
    """``read()``, or None when the stored file is damaged (its one line appended to ``damaged``)."""
    try:
        return read()
    except DamagedFileError as exc:
        damaged.append(str(exc))
        return None


def _hardware(name: str, cache: dict[str, Hardware]) -> Hardware:
    if name not in cache:
        cache[name] = named_profile(name)
    return cache[name]


def _time_columns(
    kind: str,
    name: str | None,
    layout: Layout,
    workload: Workload,
    published: float,
    cache: dict[str, Hardware],
) -> dict[str, Any]:
    if name is None:
        return {f"{kind}_profile": None, f"{kind}_tokens_per_s_per_gpu": None, f"{kind}_error": None}
    p = predict_point(layout, workload, _hardware(name, cache))
    tps = tokens_per_gpu_per_step(layout, workload) / p.step_time_s
    terms = step_terms(p)
    return {
        f"{kind}_profile": name,
        f"{kind}_tokens_per_s_per_gpu": tps,
        f"{kind}_error": error(tps, published),
        f"{kind}_step_s": p.step_time_s,
        **{f"{kind}_{_slug(t)}_s": s for t, s in terms.items()},
        f"{kind}_dominant": dominant(terms),
    }


def _timeline_columns(
    kind: str,
    name: str | None,
    layout: Layout,
    workload: Workload,
    results: Path,
    published: float,
    cache: dict[str, Hardware],
    damaged: list[str],
) -> dict[str, Any]:
    """The timeline's tokens/s/GPU: the stored traced step (beside its fake record) replayed on
    the profile; None without a profile or a trace."""
    path = fake_record_path(results, layout, workload).with_suffix(".npz")
    stored = _stored(lambda: load_traces(path), damaged) if name and path.is_file() else None
    if stored is None:
        return {f"{kind}_timeline_tokens_per_s_per_gpu": None, f"{kind}_timeline_error": None}
    traces, _ = stored
    step = reprice({"world_size": layout.world_size}, traces, _hardware(name, cache)).step_s
    tps = tokens_per_gpu_per_step(layout, workload) / step
    return {
        f"{kind}_timeline_step_s": step,
        f"{kind}_timeline_tokens_per_s_per_gpu": tps,
        f"{kind}_timeline_error": error(tps, published),
    }


def _memory_columns(
    published: Published,
    e: Entry,
    layout: Layout,
    workload: Workload,
    results: Path,
    cache: dict[str, Hardware],
    damaged: list[str],
) -> dict[str, Any]:
    """Allocated peaks (fake world, model) and the reserved memory the calibrated profile (every
    predicted entry has one) assumes on top of the fake world's (else the model's) peak."""
    hw = _hardware(str(profile_for(published, e, "calibrated")), cache)
    fake = _stored(lambda: read_fake_record(results, layout, workload), damaged)
    fake_peak = fake.get("peak_memory_bytes") if fake and fake.get("status") == "completed" else None
    model_peak = predict_point(layout, workload, hw).memory.peak_bytes
    reserved = hw.reserved_bytes(fake_peak if fake_peak is not None else model_peak)
    kind = e.measured["memory_kind"]
    compared = reserved if kind == "reserved" else (fake_peak or model_peak)
    return {
        "fake_allocated_gib": None if fake_peak is None else fake_peak / GIB,
        "fake_record": None if fake is None else fake.get("status"),
        "model_allocated_gib": model_peak / GIB,
        "reserved_overhead_fraction": hw.reserved_overhead_fraction,
        "predicted_reserved_gib": reserved / GIB,
        "memory_error": error(compared / GIB, e.measured["memory_gib"]),
        # the published run ran: a predicted out-of-memory is a miss too
        "fits": reserved <= hw.usable_bytes,
    }


def _slug(term: str) -> str:
    return term.replace("-", "").replace(" ", "_")


def source_text(e: Entry) -> str:
    """'pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 1, row FSDP'."""
    s = e.source
    where = f"{s['repo']} {s['path']}" if s["repo"] else s["paper"]
    return f"{where}, {s['where']}"


# ----------------------------------------------------------------------------- errors by role


@dataclass(frozen=True)
class ErrorSummary:
    """Errors of one profile kind over one group of entries."""

    kind: str  # assumed or calibrated (the analytic model's time), or timeline (on the assumed)
    sample: str  # "in-sample" (calibration entries, calibrated profile) or "out-of-sample"
    ids: list[str]
    errors: list[float]

    @property
    def median_abs(self) -> float | None:
        return statistics.median(abs(x) for x in self.errors) if self.errors else None

    @property
    def worst(self) -> float | None:
        return max(self.errors, key=abs) if self.errors else None


def summarize(rows: list[dict[str, Any]]) -> list[ErrorSummary]:
    """Throughput errors in and out of sample: the assumed profiles fitted nothing, so all
    their entries are out of sample; the calibrated ones are in sample on the calibration
    entries only."""
    out = []
    for kind in PROFILE_KINDS:
        groups = (
            {"out-of-sample": "test"}
            if kind == "assumed"
            else {"in-sample": "calibration", "out-of-sample": "test"}
        )
        for sample, role in groups.items():
            scored = [
                r for r in rows
                if r.get(f"{kind}_error") is not None and (kind == "assumed" or r["role"] == role)
            ]  # fmt: skip
            out.append(
                ErrorSummary(kind, sample, [r["id"] for r in scored], [r[f"{kind}_error"] for r in scored])
            )
    # the timeline on the assumed profiles: nothing of it was fitted to these runs
    timed = [r for r in rows if r.get("assumed_timeline_error") is not None]
    out.append(
        ErrorSummary(
            "timeline",
            "out-of-sample",
            [r["id"] for r in timed],
            [r["assumed_timeline_error"] for r in timed],
        )
    )
    return out


# ----------------------------------------------------------------------------- the fit


def with_train_passes(hw: Hardware, passes: float) -> Hardware:
    return replace(hw, elementwise_passes={**hw.elementwise_passes, "train": passes})


def fit_passes(entry: Entry, hw: Hardware, lo: float = 0.5, hi: float = 1000.0) -> float:
    """The element-wise passes per training step (the only number the calibrated profiles
    change) at which ``hw`` predicts ``entry``'s published tokens/s/GPU. Predicted throughput
    falls as the passes grow, so bisection finds it."""
    layout, workload = entry.point()
    target = entry.measured["tokens_per_s_per_gpu"]
    tokens = tokens_per_gpu_per_step(layout, workload)

    def tps(passes: float) -> float:
        return tokens / predict_point(layout, workload, with_train_passes(hw, passes)).step_time_s

    if not tps(hi) <= target <= tps(lo):
        raise ValueError(f"{entry.id}: no element-wise passes in [{lo}, {hi}] reach {target} tokens/s/GPU")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tps(mid) > target else (lo, mid)
    return (lo + hi) / 2


def fit_profiles(published: Published) -> dict[str, dict[str, Any]]:
    """Per profile to calibrate: the passes each calibration entry implies on the assumed
    profile, and their median (the number the calibrated profile holds)."""
    fits: dict[str, dict[str, Any]] = {}
    for e in published.predicted():
        if e.role != "calibration":
            continue
        names = published.profiles[e.hardware["profile"]]
        target = names["calibrated_compile"] if e.compile else names["calibrated"]
        try:
            passes = fit_passes(e, named_profile(names["assumed"]))
        except ValueError as exc:
            raise ExperimentError(f"{published.path}: {exc}") from None
        fit = fits.setdefault(target, {"from": names["assumed"], "entries": {}})
        fit["entries"][e.id] = passes
    for fit in fits.values():
        fit["train_passes"] = statistics.median(fit["entries"].values())
    return fits
