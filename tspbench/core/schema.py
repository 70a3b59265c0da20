"""The schema machinery behind experiment files and cluster profiles: typed keys with defaults
and allowed values, checked with errors that name the key path (``sweep.grid.seq_len[2]``) and
the closest valid key; and ``--set key.path=value`` overrides applied to the raw YAML tree.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from tspbench.core.yamlfile import DuplicateKeyError, parse_yaml


class SchemaError(ValueError):
    """A bad value at ``path`` (dotted key path); wrapped into ExperimentError with the file."""

    def __init__(self, path: str, message: str) -> None:
        self.path, self.message = path, message
        super().__init__(f"{path}: {message}" if path else message)


@dataclass(frozen=True)
class Field:
    """One key of the schema: accepted types, default, allowed values or bounds."""

    types: tuple[type, ...]
    default: Any = None
    choices: Callable[[], Sequence[str]] | Sequence[str] | None = None
    minimum: float | None = None
    nullable: bool = False
    maximum: float | None = None
    required: bool = False

    def allowed(self) -> Sequence[str] | None:
        return self.choices() if callable(self.choices) else self.choices


INT, NUM, STR, BOOL = (int,), (int, float), (str,), (bool,)


def check_value(value: Any, spec: Field, path: str) -> Any:
    """``value`` if it fits ``spec``, else SchemaError naming ``path`` and what is allowed."""
    if value is None:
        if spec.nullable or (spec.default is None and not spec.required):
            return None
        raise SchemaError(path, f"must be set ({_describe(spec)})")
    if isinstance(value, bool) and bool not in spec.types:
        raise SchemaError(path, f"expected {_describe(spec)}, got {_shown(value)}")
    if not isinstance(value, spec.types):
        raise SchemaError(path, f"expected {_describe(spec)}, got {type(value).__name__} {_shown(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise SchemaError(path, f"must be a finite number, got {_shown(value)}")
    allowed = spec.allowed()
    if allowed is not None and value not in allowed:
        raise SchemaError(path, f"{_shown(value)} is not one of: {', '.join(map(str, allowed))}")
    if spec.minimum is not None and value < spec.minimum:
        raise SchemaError(path, f"must be >= {_bound(spec.minimum)}, got {_shown(value)}")
    if spec.maximum is not None and value > spec.maximum:
        raise SchemaError(path, f"must be <= {_bound(spec.maximum)}, got {_shown(value)}")
    return value


def _shown(value: Any, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error is one line, whatever the value."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _bound(limit: float) -> str:
    """0, 1, 0.5 and 18446744073709551614 as written, not 1.84467e+19."""
    if isinstance(limit, float) and limit.is_integer() and abs(limit) < 2**53:
        limit = int(limit)  # 2592000 seconds, not 2.592e+06
    return str(limit) if isinstance(limit, int) else f"{limit:g}"


def _describe(spec: Field) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true/false", dict: "a mapping"}
    names[list] = "a list"
    kinds = " or ".join(names[t] for t in spec.types if not (t is int and float in spec.types))
    allowed = spec.allowed()
    return f"one of: {', '.join(map(str, allowed))}" if allowed is not None else kinds


def check_mapping(data: Any, spec: dict[str, Field], path: str, fill: bool = True) -> dict[str, Any]:
    """Check every key of ``data`` against ``spec``; unknown keys name the closest valid one."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SchemaError(path, f"expected a mapping of {', '.join(spec)}, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        where = join_path(path, str(key))
        if key not in spec:
            raise SchemaError(where, unknown_key(str(key), spec))
        out[key] = check_value(value, spec[key], where)
    for key, f in spec.items():
        if key not in out:
            if f.required:
                raise SchemaError(join_path(path, key), f"required key is missing ({_describe(f)})")
            if fill:
                out[key] = f.default
    return out


def unknown_key(key: str, allowed: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key; {hint}allowed: {', '.join(allowed)}"


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


_KEY_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[\d+\])*")


def apply_override(raw: dict[str, Any], item: str) -> None:
    """``key.path=value`` (``sweep.zip[0].layout[1].tp=2``); the value is parsed as YAML."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not _KEY_PATH.fullmatch(key):
        raise SchemaError("", f"--set {item!r}: expected KEY.PATH=VALUE, e.g. settings.seq_len=1024")
    try:
        value = parse_yaml(text) if text.strip() else None
    except DuplicateKeyError as exc:
        raise SchemaError(key, f"--set {item!r}: {exc.problem}") from None
    except yaml.YAMLError:
        value = text
    steps = [name or int(index) for name, index in re.findall(r"([A-Za-z_]\w*)|\[(\d+)\]", key)]
    node: Any = raw
    for pos, step in enumerate(steps):
        if isinstance(step, int) and not (isinstance(node, list) and step < len(node)):
            raise SchemaError(key, f"--set: there is no list item [{step}] here")
        if isinstance(step, str) and not isinstance(node, dict):
            raise SchemaError(key, f"--set: {step!r} is not inside a mapping")
        if pos == len(steps) - 1:
            node[step] = value
        else:
            if isinstance(step, str) and not isinstance(node.get(step), (dict, list)):
                node[step] = {}
            node = node[step]
