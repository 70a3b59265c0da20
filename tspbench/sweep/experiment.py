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
    run: {warmup: 1, steps: 2, repeats: 1, timeout: 300}   # fake executor: fake_ranks: group | first
    executor: local                       # local | slurm | predict | fake
    cluster: local                        # slurm/<cluster>.yaml
    hardware: mi300x                      # for the predict executor (and the fake one's predictions)

Sweep values override the base in order: settings/layout < grid < zip; tspbench.sweep.points
expands them into points.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tspbench.core.bounds import MAX_CAPACITY_BYTES, MAX_COUNT, MAX_GPUS, MAX_SECONDS, MODEL_BOUNDS
from tspbench.core.errors import ExperimentError
from tspbench.core.names import AXES, DEVICES, DTYPES, EXECUTORS, MODES, RECOMPUTE_MODES
from tspbench.core.schema import (
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
from tspbench.core.spec import KV_EXCHANGES, MLP_EXCHANGES, PRESETS, SEED_RANGE, ModelConfig
from tspbench.core.units import parse_bytes
from tspbench.core.yamlfile import read_yaml
from tspbench.strategy import available

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


SETTINGS = {
    "batch": Field(INT, 1, minimum=1, maximum=MAX_COUNT),
    "seq_len": Field(INT, 512, minimum=1, maximum=MAX_COUNT),  # and at most the model's (points.py)
    "mode": Field(STR, "train", MODES),
    "recompute": Field(STR, "none", RECOMPUTE_MODES),
    "dtype": Field(STR, "float32", tuple(DTYPES)),
    "device": Field(STR, "cpu", DEVICES),
    "megatron_sp": Field(BOOL, False),
    "overlap": Field(BOOL, True),
    "kv_exchange": Field(STR, "allgather", KV_EXCHANGES),  # sp, fsdp_sp, tp_sp: ring, ulysses
    "mlp_exchange": Field(STR, "ring", MLP_EXCHANGES),  # tsp: broadcast
    "decode_tokens": Field(
        INT, 0, minimum=0, maximum=MAX_COUNT
    ),  # mode decode: greedy steps after the prefill (>= 1)
    "seed": Field(INT, 0, minimum=SEED_RANGE[0], maximum=SEED_RANGE[1]),  # what torch generators take
    "capacity": Field((str, int), None, nullable=True),  # simulated device memory on CPU: "256MiB"
}
LAYOUT = {
    "strategy": Field(STR, None, available, nullable=True),
    **{axis: Field(INT, 1, minimum=1, maximum=MAX_GPUS) for axis in AXES},
}
MODEL = {
    "preset": Field(STR, None, lambda: sorted(PRESETS), required=True),
    **{  # the same bounds as every model the CLI builds (tspbench.core.bounds, #45)
        f.name: Field(
            NUM if f.type in ("float", float) else INT,
            None,
            nullable=True,
            minimum=MODEL_BOUNDS[f.name][0],
            maximum=MODEL_BOUNDS[f.name][1],
        )
        for f in fields(ModelConfig)
        if f.name != "name"
    },
}
RUN = {
    "warmup": Field(INT, 1, minimum=0, maximum=MAX_COUNT),
    "steps": Field(INT, 2, minimum=1, maximum=MAX_COUNT),
    "repeats": Field(INT, 1, minimum=1, maximum=MAX_COUNT),
    "timeout": Field(
        NUM, 600.0, minimum=1, maximum=MAX_SECONDS
    ),  # seconds per point; an execution limit, not hashed
    # the fake executor: every rank of the first model-parallel group, or rank 0 alone (faster)
    "fake_ranks": Field(STR, "group", ("group", "first")),
    # each point's traced step kept beside its record (trace.npz: replayable on any profile)
    "trace": Field(BOOL, False),
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
# Settings a swept layout entry may carry beside its degrees (#43): a layout's own options
# (``{strategy: tp_sp, tp: 2, sp: 4, megatron_sp: true}``) swept for the layouts they apply to,
# where a grid axis would cross them with every layout and a zip list with every row.
LAYOUT_SETTINGS = ("recompute", "megatron_sp", "overlap", "kv_exchange", "mlp_exchange")
LAYOUT_ENTRY = {**LAYOUT, **{k: SETTINGS[k] for k in LAYOUT_SETTINGS}}


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
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.yaml"))
        hint = f"the YAML files in it: {', '.join(inside)}" if inside else "it holds no .yaml files"
        raise ExperimentError(f"{path}: is a folder, not an experiment file; {hint}")
    if not path.exists():  # a FIFO or device exists: read_yaml refuses it, saying so
        here = sorted(p.name for p in path.parent.glob("*.yaml")) if path.parent.is_dir() else []
        hint = f" (found there: {', '.join(here)})" if here else ""
        raise ExperimentError(f"{path}: no such experiment file{hint}")
    raw = read_yaml(path, ExperimentError)
    if not isinstance(raw, dict):
        raise ExperimentError(f"{path}: expected a mapping of {', '.join(TOP)} at the top level")
    return raw


def _validate(path: Path, raw: dict[str, Any], overrides: tuple[str, ...]) -> Experiment:
    top = check_mapping(raw, TOP, "")
    if len(top["name"]) > 128:  # a results folder and file names are made from it (#45)
        raise SchemaError("name", f"{len(top['name'])} characters: at most 128 (it names the results folder)")
    if not _NAME_RE.fullmatch(top["name"]):
        raise SchemaError("name", f"{top['name']!r} must be a folder name (letters, digits, _ . -)")
    model = {k: v for k, v in check_mapping(top["model"], MODEL, "model").items() if v is not None}
    settings = check_mapping(top["settings"], SETTINGS, "settings")
    check_capacity(settings["capacity"], "settings.capacity")
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


def check_capacity(value: Any, path: str) -> int | None:
    """A simulated device size: bytes (an integer) or a size text, at least 1 byte; None: none."""
    if value is None:
        return None
    try:
        nbytes = parse_bytes(value) if isinstance(value, str) else value
    except ValueError:
        nbytes = None
    if isinstance(value, bool) or not isinstance(nbytes, int) or nbytes < 1:
        raise SchemaError(path, f"not a size of at least 1 byte: {value!r} (e.g. 256MiB, 2GB, 1e9)")
    if nbytes > MAX_CAPACITY_BYTES:
        raise SchemaError(path, f"must be at most {MAX_CAPACITY_BYTES:,} bytes (1 PiB), got {value!r}")
    return nbytes


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
        return check_mapping(value, LAYOUT_ENTRY, path, fill=False)
    value = check_value(value, SWEEP_AXES[key], path)
    if key == "capacity":
        check_capacity(value, path)
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
