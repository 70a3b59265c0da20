"""The backtest's fit: the calibrated profiles' one fitted figure, and the profile written from it
(``tspbench check backtest --fit [--write]``).

A calibrated profile is its hardware's Hopper-measured profile with the figures of
``FITTED_KEYS`` set from the published entries marked ``calibration`` (``calibrated_compile``
under torch.compile): only figures a measurement on the GPU could set (calibrate measures
element-wise passes), each naming its entries. ``fit_profiles`` is the fit, ``calibrated_profile``
writes the profile from it. Apart from the rows (tspbench.checks.backtest) because it runs only
when a profile is refitted, and it prices through the same ``predict_point`` the rows do.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

import yaml

from tspbench.analytic.hardware import Hardware, find_profile
from tspbench.analytic.profile_choice import named_profile
from tspbench.checks.backtest import HOPPER_MEASURED, predict_point, tokens_per_gpu_per_step
from tspbench.checks.published import Entry, Published
from tspbench.core.errors import ExperimentError
from tspbench.core.files import read_input_text

# what a calibrated profile may set from the calibration entries: figures calibrate measures on
# a GPU (the element-wise passes of a training step), nothing else
FITTED_KEYS = ("elementwise_passes.train",)


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
    base = yaml.safe_load(read_input_text(find_profile(fit["from"])))
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
