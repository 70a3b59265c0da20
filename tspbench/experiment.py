"""Experiment files: the schema (here, in code), validation, ``--set`` overrides and expansion.

An experiment YAML holds values only; every key it may use is declared below with its type,
default and allowed values. Everything is checked before anything runs, and a bad value is one
line naming the file, the key path (``sweep.grid.seq_len[2]``) and what is allowed::

    name: quickstart                      # folder under the results directory
    model: {preset: small}                # plus ModelConfig overrides, e.g. vocab_size: 1024
    settings: {seq_len: 512, dtype: float32, capacity: 256MiB}   # the base point (SETTINGS)
    layout: {strategy: tp, tp: 4}         # the base layout (LAYOUT)
    sweep:
      grid: {seq_len: [512, 1024]}        # product of every axis ...
      zip:                                # ... times each zip group, whose lists move together
        - layout: [{strategy: dp, dp: 4}, {strategy: tp_sp, tp: 2, sp: 2}]
    run: {warmup: 1, steps: 2, repeats: 1, timeout: 300}
    executor: local                       # local | slurm | predict
    cluster: local                        # slurm/<cluster>.yaml
    hardware: mi300x                      # for the predict executor

Sweep values override the base in order: settings/layout < grid < zip. A point whose layout is
impossible for its workload (``check_layout``) is skipped and listed with its reason; an axis
value that never gives a valid point is an error, since it can only be a mistake.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from tspbench.cli import UsageError, parse_bytes
from tspbench.mesh import AXES, Layout, LayoutError
from tspbench.model import PRESETS, RECOMPUTE_MODES, ModelConfig
from tspbench.optim import DTYPES
from tspbench.schema import (
    BOOL,
    INT,
    NUM,
    STR,
    Field,
    SchemaError,
    apply_override,
    check_mapping,
    check_value,
    join_path,
    unknown_key,
)
from tspbench.strategy import MODES, Workload, available, check_layout

EXECUTORS = ("local", "slurm", "predict")
DEVICES = ("cpu", "cuda")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class ExperimentError(UsageError):
    """Bad experiment input: one line naming the file and key path; the CLI exits 2."""


SETTINGS = {
    "batch": Field(INT, 1, minimum=1),
    "seq_len": Field(INT, 512, minimum=1),
    "mode": Field(STR, "train", MODES),
    "recompute": Field(STR, "none", RECOMPUTE_MODES),
    "dtype": Field(STR, "float32", tuple(DTYPES)),
    "device": Field(STR, "cpu", DEVICES),
    "megatron_sp": Field(BOOL, False),
    "overlap": Field(BOOL, True),
    "seed": Field(INT, 0),
    "capacity": Field((str, int), None, nullable=True),  # simulated device memory on CPU: "256MiB"
}
LAYOUT = {
    "strategy": Field(STR, None, available, nullable=True),
    **{axis: Field(INT, 1, minimum=1) for axis in AXES},
}
MODEL = {
    "preset": Field(STR, None, lambda: sorted(PRESETS), required=True),
    **{
        f.name: Field(NUM, None, nullable=True, minimum=0)
        if f.type in ("float", float)
        else Field(INT, None, nullable=True, minimum=1)
        for f in fields(ModelConfig)
        if f.name != "name"
    },
}
RUN = {
    "warmup": Field(INT, 1, minimum=0),
    "steps": Field(INT, 2, minimum=1),
    "repeats": Field(INT, 1, minimum=1),
    "timeout": Field(NUM, 600.0, minimum=1),  # seconds per point; an execution limit, not hashed
}
TOP = {
    "name": Field(STR, None, required=True),
    "description": Field(STR, ""),
    "model": Field((dict,), None, required=True),
    "settings": Field((dict,), None, nullable=True),
    "layout": Field((dict,), None, nullable=True),
    "sweep": Field((dict,), None, nullable=True),
    "run": Field((dict,), None, nullable=True),
    "executor": Field(STR, "local", EXECUTORS),
    "cluster": Field(STR, None, nullable=True),
    "hardware": Field(STR, None, nullable=True),
}
SWEEP = {"grid": Field((dict,), None, nullable=True), "zip": Field((list,), None, nullable=True)}
SWEEP_AXES = {**SETTINGS, **LAYOUT}  # plus "layout": a mapping of LAYOUT keys


# ----------------------------------------------------------------------------- the experiment


@dataclass(frozen=True)
class Experiment:
    """A validated experiment file (values in their checked, default-filled form)."""

    path: Path
    name: str
    description: str
    model: dict[str, Any]
    settings: dict[str, Any]
    layout: dict[str, Any]
    grid: dict[str, list[Any]]
    zips: list[dict[str, list[Any]]]
    run: dict[str, Any]
    executor: str
    cluster: str | None
    hardware: str | None
    overrides: tuple[str, ...] = ()

    def error(self, exc: SchemaError) -> ExperimentError:
        return _located(self.path, self.overrides, exc)


def load_experiment(path: str | Path, overrides: Sequence[str] = ()) -> Experiment:
    """Read, override (``key.path=value``) and validate an experiment file."""
    path = Path(path)
    raw = _read_yaml(path)
    try:
        for item in overrides:
            apply_override(raw, item)
        return _validate(path, raw, tuple(overrides))
    except SchemaError as exc:
        raise _located(path, tuple(overrides), exc) from None


def _located(path: Path, overrides: tuple[str, ...], exc: SchemaError) -> ExperimentError:
    keys = [(o, o.split("=", 1)[0].strip()) for o in overrides]
    by_set = [o for o, key in keys if exc.path and (exc.path.startswith(key) or key.startswith(exc.path))]
    origin = f" (set by --set {by_set[-1]})" if by_set else ""
    return ExperimentError(f"{path}: {exc}{origin}")


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        here = sorted(p.name for p in path.parent.glob("*.yaml")) if path.parent.is_dir() else []
        hint = f" (found there: {', '.join(here)})" if here else ""
        raise ExperimentError(f"{path}: no such experiment file{hint}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ExperimentError(f"{path}: not valid YAML{where}: {problem}") from None
    if not isinstance(raw, dict):
        raise ExperimentError(f"{path}: expected a mapping of {', '.join(TOP)} at the top level")
    return raw


def _validate(path: Path, raw: dict[str, Any], overrides: tuple[str, ...]) -> Experiment:
    top = check_mapping(raw, TOP, "")
    if not _NAME_RE.fullmatch(top["name"]):
        raise SchemaError("name", f"{top['name']!r} must be a folder name (letters, digits, _ . -)")
    model = {k: v for k, v in check_mapping(top["model"], MODEL, "model").items() if v is not None}
    settings = check_mapping(top["settings"], SETTINGS, "settings")
    _check_capacity(settings["capacity"], "settings.capacity")
    layout = check_mapping(top["layout"], LAYOUT, "layout")
    sweep = check_mapping(top["sweep"], SWEEP, "sweep")
    grid = _check_axes(sweep["grid"] or {}, "sweep.grid")
    zips = [_check_zip(group, f"sweep.zip[{i}]") for i, group in enumerate(sweep["zip"] or [])]
    _check_no_overlap(grid, zips)
    run = check_mapping(top["run"], RUN, "run")
    run["timeout"] = float(run["timeout"])
    model_config(model)  # the overrides must make a valid model
    return Experiment(
        path, top["name"], top["description"], model, settings, layout, grid, zips, run,
        top["executor"], top["cluster"], top["hardware"], overrides,
    )  # fmt: skip


def model_config(model: dict[str, Any]) -> ModelConfig:
    overrides = {k: v for k, v in model.items() if k != "preset"}
    try:
        return ModelConfig.preset(model["preset"], **overrides)
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise SchemaError("model", str(exc)) from None


def _check_capacity(value: Any, path: str) -> int | None:
    if value is None or isinstance(value, int):
        return value
    try:
        return parse_bytes(value)
    except Exception:
        raise SchemaError(path, f"not a size: {value!r} (e.g. 256MiB, 2GB, 1e9)") from None


def _check_axes(axes: dict[str, Any], path: str, length: int | None = None) -> dict[str, list[Any]]:
    """Each axis a non-empty list of values valid for its key (``layout``: LAYOUT mappings)."""
    out = {}
    for key, values in axes.items():
        where = join_path(path, str(key))
        if key not in SWEEP_AXES and key != "layout":
            raise SchemaError(where, unknown_key(str(key), [*SWEEP_AXES, "layout"]))
        if not isinstance(values, list) or not values:
            raise SchemaError(where, f"expected a non-empty list of values, got {values!r}")
        if length is not None and len(values) != length:
            raise SchemaError(where, f"zip lists must have equal lengths: {len(values)} values, not {length}")
        out[key] = [_check_axis_value(key, v, f"{where}[{i}]") for i, v in enumerate(values)]
    return out


def _check_axis_value(key: str, value: Any, path: str) -> Any:
    if key == "layout":
        return check_mapping(value, LAYOUT, path, fill=False)
    value = check_value(value, SWEEP_AXES[key], path)
    if key == "capacity":
        _check_capacity(value, path)
    return value


def _check_zip(group: Any, path: str) -> dict[str, list[Any]]:
    if not isinstance(group, dict) or not group:
        raise SchemaError(path, "expected a mapping of axis -> list of values (lists of equal length)")
    first = next(iter(group.values()))
    return _check_axes(group, path, len(first) if isinstance(first, list) else None)


def _axis_fields(key: str, values: list[Any]) -> set[str]:
    return {k for v in values for k in v} if key == "layout" else {key}


def _check_no_overlap(grid: dict[str, list[Any]], zips: list[dict[str, list[Any]]]) -> None:
    """One field, one axis: two axes setting the same key would silently override each other."""
    owner: dict[str, str] = {}
    axes = [(f"sweep.grid.{k}", k, v) for k, v in grid.items()]
    axes += [(f"sweep.zip[{i}].{k}", k, v) for i, g in enumerate(zips) for k, v in g.items()]
    for path, key, values in axes:
        for name in _axis_fields(key, values):
            if name in owner:
                raise SchemaError(path, f"{name!r} is already swept by {owner[name]}")
            owner[name] = path


# ----------------------------------------------------------------------------- expansion


@dataclass(frozen=True)
class Point:
    """One resolved point. ``config`` is hashed into ``run_id``; ``timeout`` is not (raising it
    and retrying a timed-out point must rerun the same point, not add a new one)."""

    run_id: str
    experiment: str
    index: int
    config: dict[str, Any]
    timeout: float
    origin: tuple[str, ...] = field(default=(), compare=False)

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

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "experiment": self.experiment,
            "index": self.index,
            "world_size": self.world_size,
            "timeout": self.timeout,
            "origin": list(self.origin),
            "config": self.config,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Point:
        keys = ("run_id", "experiment", "index", "config", "timeout")
        return cls(*(data[k] for k in keys), tuple(data.get("origin", ())))


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
        if key == "layout":
            layout.update(value)
        elif key in LAYOUT:
            layout[key] = value
        else:
            settings[key] = value
    capacity = _check_capacity(settings.pop("capacity"), "settings.capacity")
    config: dict[str, Any] = {
        "method": method,
        "layout": layout,
        "model": model_config(exp.model).to_dict(),
        "workload": settings,
        "measure": {**{k: exp.run[k] for k in ("warmup", "steps", "repeats")}, "capacity_bytes": capacity},
    }
    if method == "predict":
        config["hardware"] = hardware
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
        reason = _invalid(config)
        if reason is None:
            point = Point(run_id(config), exp.name, len(points), config, exp.run["timeout"], origin)
            points.append(point)
            valid_paths.update(origin)
        else:
            skipped.append(Skipped(origin, describe(config), reason))
            for path in origin or ("layout",):
                first_reason.setdefault(path, reason)
    never = [p for p in first_reason if p not in valid_paths]
    if never:
        raise exp.error(SchemaError(never[0], f"gives no valid point: {first_reason[never[0]]}"))
    return points, skipped


def _invalid(config: dict[str, Any]) -> str | None:
    if config["layout"]["strategy"] is None:
        return "no strategy: set layout.strategy or sweep a layout"
    try:
        point = Point("", "", 0, config, 0.0)
        check_layout(point.layout, point.workload)
    except LayoutError as exc:
        return str(exc)
    return None


def describe(config: dict[str, Any]) -> str:
    layout = config["layout"]
    degrees = "x".join(f"{a}{layout[a]}" for a in AXES if layout.get(a, 1) > 1) or "1"
    w = config["workload"]
    return f"{layout['strategy']} {degrees} seq {w['seq_len']} batch {w['batch']} {w['mode']}"
