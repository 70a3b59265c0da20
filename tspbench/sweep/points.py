"""Expanding an experiment into points: every combination of its sweep values, resolved, hashed.

A point whose layout is impossible for its workload (``check_layout``) is skipped and listed
with its reason; an axis value that never gives a valid point is an error, since it can only
be a mistake.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tspbench.core.errors import LayoutError, WorkloadError
from tspbench.core.records import point_record
from tspbench.core.schema import SchemaError
from tspbench.core.spec import Layout, ModelConfig, Workload, recompute_problem, switch_words
from tspbench.core.units import degrees_text
from tspbench.strategy import check_layout
from tspbench.sweep.experiment import LAYOUT, Experiment, check_capacity, model_config

SOURCE_OF_METHOD = {"measure": "measured", "fake": "fake", "predict": "predicted"}  # point config -> record


@dataclass(frozen=True)
class Point:
    """One resolved point. ``config`` is hashed into ``run_id``; ``timeout`` and ``trace`` are
    not (raising a limit, or keeping the traced step, must rerun the same point, not add one)."""

    run_id: str
    experiment: str
    index: int
    config: dict[str, Any]
    timeout: float
    origin: tuple[str, ...] = field(default=(), compare=False)
    trace: bool = field(default=False, compare=False)  # keep the traced step beside the record

    def trace_path(self, run_dir: Path) -> Path | None:
        """Where this point's traces go in its run folder, if it keeps them."""
        return run_dir / "trace.npz" if self.trace else None

    @property
    def layout(self) -> Layout:
        return Layout(**self.config["layout"])

    @property
    def workload(self) -> Workload:
        return Workload(ModelConfig(**self.config["model"]), **self.config["workload"])

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def nodes(self, gpus_per_node: int) -> int:
        return math.ceil(self.world_size / gpus_per_node)

    def tasks_per_node(self, gpus_per_node: int) -> int:
        return min(self.world_size, gpus_per_node)

    @property
    def label(self) -> str:
        """'3f2a9c01de tsp tsp4 seq 2048 batch 1 train recompute none': how progress lines name it."""
        return f"{self.run_id} {describe(self.config)}"

    def base_record(self) -> dict[str, Any]:
        """The identifying part of a record, as bench writes it (for points that never measured)."""
        source = SOURCE_OF_METHOD.get(self.config["method"], "measured")
        return {**point_record(self.layout, self.workload, source), **self.config["measure"]}

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "experiment": self.experiment,
            "index": self.index,
            "world_size": self.world_size,
            "timeout": self.timeout,
            "origin": list(self.origin),
            "trace": self.trace,
            "config": self.config,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Point:
        keys = ("run_id", "experiment", "index", "config", "timeout")
        return cls(*(data[k] for k in keys), tuple(data.get("origin", ())), bool(data.get("trace", False)))


def run_id(config: dict[str, Any]) -> str:
    """10 hex digits of sha256 over the canonical JSON of the resolved point."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


@dataclass(frozen=True)
class Skipped:
    """A combination of sweep values that cannot run, and why."""

    origin: tuple[str, ...]
    description: str
    reason: str


def _options(exp: Experiment) -> list[list[tuple[str, dict[str, Any]]]]:
    """Per axis (grid axes, then zip groups), its choices as (key path, {key: value})."""
    axes = [[(f"sweep.grid.{k}[{i}]", {k: v}) for i, v in enumerate(vs)] for k, vs in exp.grid.items()]
    for g, group in enumerate(exp.zips):
        n = len(next(iter(group.values())))
        paths = [", ".join(f"sweep.zip[{g}].{k}[{i}]" for k in group) for i in range(n)]
        axes.append([(paths[i], {k: vs[i] for k, vs in group.items()}) for i in range(n)])
    return axes


def _resolve(exp: Experiment, choice: dict[str, Any], method: str, hardware: str | None) -> dict[str, Any]:
    settings, layout = dict(exp.settings), dict(exp.layout)
    for key, value in choice.items():
        if key == "layout":  # an entry's settings (LAYOUT_SETTINGS) go with its degrees
            layout.update({k: v for k, v in value.items() if k in LAYOUT})
            settings.update({k: v for k, v in value.items() if k not in LAYOUT})
        elif key in LAYOUT:
            layout[key] = value
        else:
            settings[key] = value
    capacity = check_capacity(settings.pop("capacity"), "settings.capacity")
    if settings.get("kv_exchange") == "allgather":  # the default: stored run ids stay as they were
        del settings["kv_exchange"]
    if settings.get("mlp_exchange") == "ring":  # the same
        del settings["mlp_exchange"]
    config: dict[str, Any] = {
        "method": method,
        "layout": layout,
        "model": model_config(exp.model).to_dict(),
        "workload": settings,
        "measure": {**{k: exp.run[k] for k in ("warmup", "steps", "repeats")}, "capacity_bytes": capacity},
    }
    if method == "predict" or (method == "fake" and hardware):
        config["hardware"] = hardware
    if method == "fake":
        config["fake_ranks"] = exp.run["fake_ranks"]
    return config


def expand(
    exp: Experiment, method: str = "measure", hardware: str | None = None
) -> tuple[list[Point], list[Skipped]]:
    """Every point of the sweep (in grid-then-zip order) and the combinations skipped as invalid.

    Raises ExperimentError if some sweep value never yields a valid point.
    """
    points, skipped = [], []
    valid_paths: set[str] = set()
    first_reason: dict[str, str] = {}
    for combo in itertools.product(*_options(exp)):
        origin = tuple(path for path, _ in combo)
        choice = {k: v for _, values in combo for k, v in values.items()}
        config = _resolve(exp, choice, method, hardware)
        invalid = _invalid(config)
        if invalid is None:
            point = Point(
                run_id(config), exp.name, len(points), config, exp.run["timeout"], origin, exp.run["trace"]
            )
            points.append(point)
            valid_paths.update(origin)
        else:
            reason, section = invalid
            skipped.append(Skipped(origin, describe(config), reason))
            for path in origin or (section,):
                first_reason.setdefault(path, reason)
    never = [p for p in first_reason if p not in valid_paths]
    if never:
        raise exp.error(SchemaError(never[0], f"gives no valid point: {first_reason[never[0]]}"))
    return points, skipped


def _invalid(config: dict[str, Any]) -> tuple[str, str] | None:
    """Why the point cannot run, and the section of the file to blame when no sweep value
    made it (a workload problem is the settings', a layout problem the layout's); or None."""
    if config["layout"]["strategy"] is None:
        return "no strategy: set layout.strategy or sweep a layout", "layout"
    workload = config["workload"]
    problem = recompute_problem(workload["recompute"], (workload["mode"],))
    if problem:
        return f"recompute {workload['recompute']!r}: {problem}", "settings.recompute"
    try:
        point = Point("", "", 0, config, 0.0)
        model, tokens = point.workload.model, workload["seq_len"] + (workload.get("decode_tokens") or 0)
        if tokens > model.max_seq_len:  # what predict and bench refuse, a sweep too (#45)
            served = f"the {model.max_seq_len:,} positions {model.name} serves"
            return f"seq_len + decode_tokens {tokens:,} is more than {served}", "settings"
        check_layout(point.layout, point.workload)
    except WorkloadError as exc:
        return str(exc), "settings"
    except LayoutError as exc:
        return str(exc), "layout"
    return None


def describe(config: dict[str, Any]) -> str:
    """'tsp tsp4 x dp2 seq 2048 batch 1 train recompute full', 'tp tp2 megatron_sp seq 512 batch 1
    infer': a switch set away from its default is named, so two settings never read alike."""
    layout, w = config["layout"], config["workload"]
    degrees = degrees_text(layout["strategy"] or "", layout)
    mode = f"train recompute {w['recompute']}" if w["mode"] == "train" else w["mode"]
    exchange = "".join(f" {word}" for word in switch_words(w))
    return f"{layout['strategy']} {degrees}{exchange} seq {w['seq_len']} batch {w['batch']} {mode}"
