"""The backtest: every published run of the test set (tspbench.checks.published) predicted with
three profiles of its hardware, and how far off the project is.

For each entry and each profile:

    tokens/s/GPU   predicted = the step's tokens per GPU / the predicted step time
    error          predicted / published - 1 (positive: the model is too optimistic)
    terms          the step's time by what it is spent on (GEMM, attention, element-wise, launch,
                   exposed comm: they add up to the step), and the two that dominate
    memory         the model's peak (allocated: live tensors) and what the profile assumes the
                   caching allocator reserves on top (``reserved_overhead_fraction``), against the
                   published figure (torchtitan logs max_reserved); beside it the fake world's
                   executed peak (results/published/fake/)

The three profiles (``PROFILE_KINDS``):

    assumed      "shipped": the published hardware's facts from its source and h100.yaml's
                 assumed fractions, nothing fitted, so every entry is out of sample
    measured     "Hopper-measured": every rate carried from the H200 measured here (the same
                 SMs) at a stated ratio, the 500 W limit an assumption on the GEMM rate; nothing
                 fitted, every entry out of sample (``HOPPER_MEASURED``: published.yaml names the
                 other two)
    calibrated   the Hopper-measured profile with the figures of ``FITTED_KEYS`` set from the
                 entries marked ``calibration`` (``calibrated_compile`` under torch.compile) and
                 scored on the ``test`` entries; only figures a measurement on the GPU could set
                 (calibrate measures element-wise passes), each naming its entries.
                 ``fit_profiles`` is the fit, ``calibrated_profile`` writes the profile from it
                 (``tspbench check backtest --fit --write``)

Neither the shipped nor the Hopper-measured profile models torch.compile (nothing measured a
compiled step), so a compiled entry has a calibrated prediction only. Where both the
Hopper-measured and the calibrated profile predict an entry, the row names the terms that differ
and by how much (``differing_terms``), and whether the two disagree by more than ``DISAGREE``.

Time comes from one function, ``predict_point``: swap the time model there and every column
follows.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tspbench.analytic import prices
from tspbench.analytic.hardware import Hardware, find_profile
from tspbench.analytic.predict import Prediction, predict
from tspbench.analytic.profile_choice import named_profile
from tspbench.analytic.replayed import reprice
from tspbench.analytic.timing import ranks_per_node
from tspbench.checks.published import Entry, Published, fake_record_path, read_fake_record
from tspbench.core.errors import DamagedFileError, ExperimentError
from tspbench.core.spec import Layout, Workload
from tspbench.core.trace import load_traces
from tspbench.costs.kernels import step_kernels

T = TypeVar("T")

GIB = 2**30
PROFILE_KINDS = ("assumed", "measured", "calibrated")
# published hardware -> its Hopper-measured profile (published.yaml's ``profiles`` names the
# shipped and the calibrated ones)
HOPPER_MEASURED = {"h100-96gb-500w": "h100-96gb-500w-hopper-measured"}
# what a calibrated profile may set from the calibration entries: figures calibrate measures on
# a GPU (the element-wise passes of a training step), nothing else
FITTED_KEYS = ("elementwise_passes.train",)
DISAGREE = 0.10  # calibrated vs Hopper-measured tokens/s: beyond it, the two disagree
TERMS = ("GEMM", "attention", "element-wise", "launch", "exposed comm")


def predict_point(layout: Layout, workload: Workload, hw: Hardware) -> Prediction:
    """The one place the backtest gets a step's time (and memory) from: the analytic model."""
    return predict(layout, workload, hw)


def profile_for(published: Published, entry: Entry, kind: str, eager: bool = False) -> str | None:
    """The profile that predicts ``entry`` as ``kind`` (one of ``PROFILE_KINDS``); None where
    that profile cannot: only the calibrated ones model torch.compile. ``eager``: the kind's
    profile as if the entry ran eagerly (its memory: compile changes none the model counts)."""
    key = entry.hardware["profile"]
    names = published.profiles[key]
    if entry.compile and not eager:
        return names["calibrated_compile"] if kind == "calibrated" else None
    return HOPPER_MEASURED.get(key) if kind == "measured" else names[kind]


def tokens_per_gpu_per_step(layout: Layout, workload: Workload) -> int:
    """Tokens a step trains, per GPU: every data-parallel rank takes ``batch`` sequences."""
    return layout.data_degree * workload.batch * workload.seq_len // layout.world_size


def step_terms(p: Prediction) -> dict[str, float]:
    """The predicted step's seconds by what they are spent on (they add up to the step):
    ``launch`` is every kernel's fixed cost (``op_overhead_us``) and the host's time, taken out
    of the kind it was charged with; ``exposed comm`` includes the overlap's shortfall."""
    t, hw = p.time, p.hardware
    k = step_kernels(p.workload)
    ranks = ranks_per_node(p.layout, hw)
    counted = 0 if hw.elementwise_passes else k.elementwise  # measured passes hold their fixed cost
    fixed = [
        prices.kernel_overhead_seconds(hw, n) / share
        for n, share in ((k.gemm, t.share), (k.attention, hw.attention_share(ranks)), (counted, t.share))
    ]
    return {
        "GEMM": t.gemm_s - fixed[0],
        "attention": t.attention_s - fixed[1],
        "element-wise": t.elementwise_s - fixed[2],
        "launch": sum(fixed) + t.host_s,
        "exposed comm": t.comm_exposed_s + t.hidden_exposed_s,
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


def differing_terms(row: dict[str, Any], share: float = 0.005) -> str | None:
    """'element-wise +0.289 s (+30%)': the terms of the calibrated step that differ from the
    Hopper-measured one by more than ``share`` of its step, largest first, each in seconds and
    as a change of that term ('none' where none does); None unless both profiles predict it."""
    if row.get("measured_step_s") is None or row.get("calibrated_step_s") is None:
        return None
    parts = []
    for term in TERMS:
        was, now = row[f"measured_{slug(term)}_s"], row[f"calibrated_{slug(term)}_s"]
        if abs(now - was) > share * row["measured_step_s"]:
            change = f" ({now / was - 1:+.0%})" if was else ""
            parts.append((abs(now - was), f"{term} {now - was:+.3f} s{change}"))
    return ", ".join(text for _, text in sorted(parts, reverse=True)) or "none"


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
    tps = m["tokens_per_s_per_gpu"]
    for kind in PROFILE_KINDS:
        name = profile_for(published, e, kind)
        hw = None if name is None else _hardware(name, cache)
        row.update(_time_columns(kind, name, hw, layout, workload, tps))
        eager = profile_for(published, e, kind, eager=True)  # memory: compile changes none counted
        if eager is not None:  # a hardware with no Hopper-measured profile has no such column
            row.update(_memory_columns(kind, _hardware(eager, cache), e, layout, workload))
        row.update(_timeline_columns(kind, hw, layout, workload, results, tps, damaged))
    row.update(_fake_memory_columns(published, e, layout, workload, results, cache, damaged))
    row["calibrated_vs_measured"] = error(
        row["calibrated_tokens_per_s_per_gpu"], row["measured_tokens_per_s_per_gpu"]
    )
    row["terms_differ"] = differing_terms(row)
    row["disagree"] = (
        row["calibrated_vs_measured"] is not None and abs(row["calibrated_vs_measured"]) > DISAGREE
    )
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
    kind: str, name: str | None, hw: Hardware | None, layout: Layout, workload: Workload, published: float
) -> dict[str, Any]:
    """The profile's prediction, its error, its terms, and the figures that price them (the
    step's GEMM rate, the attention rate of the entry's causal square, HBM, the passes)."""
    if hw is None:
        return {f"{kind}_profile": None, f"{kind}_tokens_per_s_per_gpu": None, f"{kind}_error": None}
    p = predict_point(layout, workload, hw)
    tps = tokens_per_gpu_per_step(layout, workload) / p.step_time_s
    terms = step_terms(p)
    return {
        f"{kind}_profile": name,
        f"{kind}_tokens_per_s_per_gpu": tps,
        f"{kind}_error": error(tps, published),
        f"{kind}_step_s": p.step_time_s,
        **{f"{kind}_{slug(t)}_s": s for t, s in terms.items()},
        f"{kind}_dominant": dominant(terms),
        f"{kind}_gemm_tflops": hw.step_gemm_rate,
        f"{kind}_attention_tflops": prices.attention_tflops(hw, True, workload.seq_len),
        f"{kind}_hbm_gbs": hw.hbm_bandwidth_gbs,
        f"{kind}_train_passes": hw.elementwise_passes.get("train"),  # None: bytes counted from the code
    }


def _memory_columns(kind: str, hw: Hardware, e: Entry, layout: Layout, workload: Workload) -> dict[str, Any]:
    """The model's peak on the profile and the memory compared with the published figure: the
    reserved memory the profile assumes on top where the source gives reserved."""
    peak = predict_point(layout, workload, hw).memory.peak_bytes
    reserved = hw.reserved_bytes(peak)
    compared = reserved if e.measured["memory_kind"] == "reserved" else peak
    return {
        f"{kind}_model_allocated_gib": peak / GIB,
        f"{kind}_predicted_memory_gib": compared / GIB,
        f"{kind}_memory_error": error(compared / GIB, e.measured["memory_gib"]),
        # the published run ran: a predicted out-of-memory is a miss too
        f"{kind}_fits": reserved <= hw.usable_bytes,
    }


def _timeline_columns(
    kind: str,
    hw: Hardware | None,
    layout: Layout,
    workload: Workload,
    results: Path,
    published: float,
    damaged: list[str],
) -> dict[str, Any]:
    """The timeline's tokens/s/GPU: the stored traced step (beside its fake record) replayed on
    the profile; None without a profile or a trace."""
    path = fake_record_path(results, layout, workload).with_suffix(".npz")
    stored = _stored(lambda: load_traces(path), damaged) if hw and path.is_file() else None
    if stored is None:
        return {f"{kind}_timeline_tokens_per_s_per_gpu": None, f"{kind}_timeline_error": None}
    traces, _ = stored
    step = reprice({"world_size": layout.world_size}, traces, hw).step_s
    tps = tokens_per_gpu_per_step(layout, workload) / step
    return {
        f"{kind}_timeline_step_s": step,
        f"{kind}_timeline_tokens_per_s_per_gpu": tps,
        f"{kind}_timeline_error": error(tps, published),
    }


def _fake_memory_columns(
    published: Published,
    e: Entry,
    layout: Layout,
    workload: Workload,
    results: Path,
    cache: dict[str, Hardware],
    damaged: list[str],
) -> dict[str, Any]:
    """The fake world's executed peak (allocated) and, with the calibrated profile's allocator
    overhead on top, the memory compared with the published figure."""
    hw = _hardware(str(profile_for(published, e, "calibrated")), cache)
    fake = _stored(lambda: read_fake_record(results, layout, workload), damaged)
    peak = fake.get("peak_memory_bytes") if fake and fake.get("status") == "completed" else None
    compared = None
    if peak is not None:
        compared = hw.reserved_bytes(peak) if e.measured["memory_kind"] == "reserved" else peak
    return {
        "fake_allocated_gib": None if peak is None else peak / GIB,
        "fake_record": None if fake is None else fake.get("status"),
        "fake_memory_error": None if compared is None else error(compared / GIB, e.measured["memory_gib"]),
    }


def slug(term: str) -> str:
    """A term in a column name: 'exposed comm' -> 'exposed_comm', 'element-wise' -> 'elementwise'."""
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

    kind: str  # a PROFILE_KINDS (the analytic model's time), or timeline (on the shipped profile)
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
    """Throughput errors in and out of sample: the shipped and the Hopper-measured profiles
    fitted nothing, so all their entries are out of sample; the calibrated ones are in sample on
    the calibration entries only."""
    out = []
    for kind in PROFILE_KINDS:
        fitted = kind == "calibrated"
        groups = {"in-sample": "calibration", "out-of-sample": "test"} if fitted else {"out-of-sample": None}
        for sample, role in groups.items():
            scored = [r for r in rows if r.get(f"{kind}_error") is not None and role in (None, r["role"])]
            out.append(
                ErrorSummary(kind, sample, [r["id"] for r in scored], [r[f"{kind}_error"] for r in scored])
            )
    # the timeline on the shipped profiles: nothing of it was fitted to these runs
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
    """The element-wise passes per training step (``FITTED_KEYS``: the only number a calibrated
    profile changes) at which ``hw`` predicts ``entry``'s published tokens/s/GPU. Predicted
    throughput falls as the passes grow, so bisection finds it."""
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
    """Per profile to calibrate: the passes each calibration entry implies on its hardware's
    Hopper-measured profile, their median (the number the calibrated profile holds), and the
    entries by id."""
    fits: dict[str, dict[str, Any]] = {}
    for e in published.predicted():
        if e.role != "calibration":
            continue
        key = e.hardware["profile"]
        names = published.profiles[key]
        target = names["calibrated_compile"] if e.compile else names["calibrated"]
        if key not in HOPPER_MEASURED:
            raise ExperimentError(f"{published.path}: {e.id}: no Hopper-measured profile of {key} to fit on")
        try:
            passes = fit_passes(e, named_profile(HOPPER_MEASURED[key]))
        except ValueError as exc:
            raise ExperimentError(f"{published.path}: {exc}") from None
        fit = fits.setdefault(target, {"from": HOPPER_MEASURED[key], "entries": {}, "described": {}})
        fit["entries"][e.id] = passes
        fit["described"][e.id] = _described(e)
    for fit in fits.values():
        fit["train_passes"] = statistics.median(fit["entries"].values())
    return fits


def _described(e: Entry) -> str:
    """'tt-8b-fsdp128 (FSDP 128, eager; 5,605 tokens/s/GPU, benchmarks/llama3_h100_202412_torchtitan.md)'."""
    run = "torch.compile" if e.compile else "eager"
    tps = e.measured["tokens_per_s_per_gpu"]
    where = e.source["path"] or e.source["paper"]
    return f"{e.id} ({e.published_layout}, {run}; {tps:,.0f} tokens/s/GPU, {where})"


def calibrated_profile(name: str, fit: dict[str, Any]) -> str:
    """The calibrated profile ``name`` as YAML: the Hopper-measured profile it was fitted on,
    every figure and provenance as there, but for the ``FITTED_KEYS`` (the training step's
    element-wise passes, 2 decimals), whose provenance names the entries that set them."""
    base = yaml.safe_load(find_profile(fit["from"]).read_text())
    passes = round(fit["train_passes"], 2)
    entries = "; ".join(f"{fit['described'][i]}: {v:.2f}" for i, v in fit["entries"].items())
    carried = {k: v for k, v in base["elementwise_passes"].items() if k != "train"}
    data = {
        **base,
        "name": name,
        "description": (
            f"{fit['from']} with one figure set from published runs: the element-wise passes of a "
            f"training step ({passes}), fitted to the calibration entries {', '.join(fit['entries'])} "
            "(results/published/published.yaml). A figure calibrate measures on a GPU (the "
            "element-wise device time of the step that runs, as passes over its bytes), not a free "
            "factor; every other figure is the Hopper-measured profile's. Score it on the test entries only."
        ),
        "elementwise_passes": {**base["elementwise_passes"], "train": passes},
        "provenance": {
            **base["provenance"],
            "elementwise_passes": (
                f"fitted (to published runs, not measured here): train {passes}, the median of what "
                f"each calibration entry gives on {fit['from']}: {entries} (tspbench check backtest "
                f"--fit); the rest ({', '.join(f'{k} {v}' for k, v in carried.items())}) carried as "
                f"{fit['from']}. Measurable: the element-wise device time of the step torchtitan "
                "runs (its op-level recomputation; its fused kernels under torch.compile) over that "
                "step's bytes"
            ),
        },
    }
    head = f"# Written by tspbench check backtest --fit --write from {fit['from']}.yaml: edit that.\n"
    return head + yaml.safe_dump(data, sort_keys=False, width=100, allow_unicode=True)
