"""Run folders whose files cannot be trusted, found and named by path, and moved aside.

A run folder's point.json, status.json and result.json (see tspbench.sweep.store) are written
atomically, so they are never torn by tspbench itself; but a disk, a sync tool or a hand edit
can still leave one that does not parse, or parses to the wrong shape. Such a folder is damaged:
``status`` lists it, ``report`` leaves it out and names it (exit 2), and ``run`` moves its files into
``corrupt-<time>/`` inside the folder (nothing is overwritten) and runs the point again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tspbench.core.errors import DamagedFileError, UsageError
from tspbench.core.files import read_input_text
from tspbench.core.names import STATUSES
from tspbench.core.records import record_problem

RUN_FILES = ("point.json", "status.json", "result.json")
POINT_SECTIONS = ("layout", "model", "workload", "measure")


@dataclass
class RunFiles:
    """What one run folder holds, and what is wrong with it (one "PATH: problem" per bad file)."""

    run: Path
    point: dict[str, Any] | None = None
    status: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def present(self) -> bool:
        return any((self.run / name).exists() for name in RUN_FILES)


class DamagedResults(UsageError):
    """Run folders whose files cannot be read; the message names the first and counts the rest."""

    def __init__(self, damaged: list[RunFiles]) -> None:
        self.damaged = damaged
        problems = [p for d in damaged for p in d.problems]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(
            f"{problems[0]}{more}; `tspbench status` lists them, `tspbench run` moves them aside "
            "and runs those points again"
        )


def _read(path: Path) -> tuple[Any, str | None]:
    """(the parsed JSON or None if absent, what is wrong with it or None)."""
    if not os.path.lexists(path):
        return None, None
    try:
        text = read_input_text(path)  # a regular file of bounded size (#45)
    except DamagedFileError as exc:
        return None, f"cannot be read ({str(exc).removeprefix(f'{path}: ')})"
    try:
        return json.loads(text), None
    except ValueError as exc:
        return None, f"not valid JSON ({exc})"
    except RecursionError:  # [[[[...]]]] a hundred thousand deep: the parser's stack, not a record
        return None, "not valid JSON (nested deeper than a record is)"


def _point_problem(point: Any, folder: str) -> str | None:
    config = point.get("config") if isinstance(point, dict) else None
    if not isinstance(config, dict) or not all(isinstance(config.get(k), dict) for k in POINT_SECTIONS):
        return f"not a point (expected a mapping with run_id and config.{{{', '.join(POINT_SECTIONS)}}})"
    if point.get("run_id") != folder:
        return f"its run_id {point.get('run_id')!r} is not the folder's name {folder!r}"
    return None


def read_run(run: Path) -> RunFiles:
    """Read and check a run folder's files."""
    files = RunFiles(run)
    point, bad = _read(run / "point.json")
    if bad is None and point is not None:
        bad = _point_problem(point, run.name)
    if bad is None and point is None and files.present:
        bad = "missing"
    if bad is None:
        files.point = point
    else:
        files.problems.append(f"{run / 'point.json'}: {bad}")

    status, bad = _read(run / "status.json")
    if (
        bad is None
        and status is not None
        and (not isinstance(status, dict) or status.get("status") not in STATUSES)
    ):
        bad = f"not a status (expected a mapping with status: one of {', '.join(STATUSES)})"
    if bad is None:
        files.status = status
    else:
        files.problems.append(f"{run / 'status.json'}: {bad}")

    result, bad = _read(run / "result.json")
    if bad is None and result is not None and not isinstance(result, dict):
        bad = "not a record (expected a mapping)"
    if bad is None and isinstance(result, dict):
        bad = record_problem(result)  # a wrong type or inf in a field: damaged, named (#45)
    if bad is None and isinstance(result, dict) and result.get("status", "completed") not in STATUSES:
        bad = f"status: expected one of {', '.join(STATUSES)}, got {result['status']!r:.80}"
    if bad is None and result is None and (files.status or {}).get("status") == "completed":
        bad = "missing, though status.json says completed"
    if bad is None:
        files.result = result
    else:
        files.problems.append(f"{run / 'result.json'}: {bad}")
    return files


def quarantine(run: Path) -> Path:
    """Move the folder's point.json, status.json and result.json into ``corrupt-<UTC time>/``
    (logs and env.json stay); returns that folder."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    aside = run / f"corrupt-{stamp}"
    aside.mkdir()
    for name in RUN_FILES:
        if (run / name).exists():
            os.replace(run / name, aside / name)
    return aside
