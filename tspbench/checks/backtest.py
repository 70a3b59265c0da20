"""The backtest's rows: every published run of the test set (tspbench.checks.published)
predicted with three profiles of its hardware, and how far off the project is.

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
    calibrated   the Hopper-measured profile with one figure fitted to the entries marked
                 ``calibration`` and scored on the ``test`` entries (the fit and the profile
                 written from it: tspbench.checks.backtest_fit)

Neither the shipped nor the Hopper-measured profile models torch.compile (nothing measured a
compiled step), so a compiled entry has a calibrated prediction only. Where both the
Hopper-measured and the calibrated profile predict an entry, the row names the terms that differ
and by how much (``differing_terms``), and whether the two disagree by more than ``DISAGREE``.
The errors by sample, in and out: tspbench.checks.backtest_score.

Time comes from one function, ``predict_point``: swap the time model there and every column
follows (the fit prices through it too).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tspbench.analytic import prices
from tspbench.analytic.hardware import Hardware
from tspbench.analytic.predict import Prediction, predict
from tspbench.analytic.profile_choice import named_profile
from tspbench.analytic.replayed import reprice
from tspbench.analytic.timing import ranks_per_node
from tspbench.checks.published import Entry, Published, fake_record_path, read_fake_record
from tspbench.core.errors import DamagedFileError
from tspbench.core.spec import Layout, Workload
from tspbench.core.trace import load_traces
from tspbench.costs.kernels import step_kernels

T = TypeVar("T")

GIB = 2**30
PROFILE_KINDS = ("assumed", "measured", "calibrated")
# published hardware -> its Hopper-measured profile (published.yaml's ``profiles`` names the
# shipped and the calibrated ones)
HOPPER_MEASURED = {"h100-96gb-500w": "h100-96gb-500w-hopper-measured"}
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
