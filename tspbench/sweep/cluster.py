"""Cluster profiles: ``slurm/NAME.yaml``, what the Slurm executor asks sbatch for.

Looked up by name in ./slurm, then in the repository's slurm/ folder; a path is used as it is.
Every key is checked (tspbench.core.schema) before anything is submitted.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tspbench.core.bounds import MAX_SECONDS
from tspbench.core.errors import UsageError
from tspbench.core.names import DEVICES
from tspbench.core.schema import INT, NUM, STR, Field, SchemaError, check_mapping
from tspbench.core.yamlfile import read_yaml
from tspbench.sweep.points import Point

PROFILE = {
    "description": Field(STR, ""),
    "partition": Field(STR, None, nullable=True),
    "account": Field(STR, None, nullable=True),
    # ranks per node (GPUs on cuda); the most nodes a job may span (else: sinfo)
    "gpus_per_node": Field(INT, None, minimum=1, maximum=4096, required=True),
    "nodes": Field(INT, None, nullable=True, minimum=1, maximum=2**17),
    "cpus_per_task": Field(INT, 1, minimum=1, maximum=4096),
    "mem": Field(STR, None, nullable=True),  # sbatch --mem per node, e.g. "0" (all) or "500G"
    "time": Field(INT, 60, minimum=1, maximum=525600),  # the most minutes one job may ask for
    "constraint": Field(STR, None, nullable=True),
    "device": Field(STR, "cuda", DEVICES),
    "array_parallelism": Field(INT, 64, minimum=1, maximum=100000),
    "extra": Field((dict,), None, nullable=True),  # more sbatch options: {qos: high, exclusive: true}
    "setup": Field((list,), None, nullable=True),  # shell lines before srun (module load, venv)
    "wait_timeout": Field(NUM, 86400, minimum=1, maximum=MAX_SECONDS),  # watched before detaching
    "poll": Field(NUM, 5, minimum=0.2, maximum=3600),  # seconds between queue polls
}
PROFILE_DIRS = (Path.cwd() / "slurm", Path(__file__).resolve().parents[2] / "slurm")


@dataclass(frozen=True)
class Profile:
    """A cluster profile, ``slurm/NAME.yaml`` (see PROFILE for the keys)."""

    name: str
    path: Path
    values: dict[str, Any] = field(repr=False)

    def __getattr__(self, key: str) -> Any:
        try:
            return self.values[key]
        except KeyError:
            raise AttributeError(key) from None

    def check_points(self, points: list[Point], experiment: Path) -> None:
        """Every point's device must be the cluster's: a CPU profile cannot run CUDA points."""
        for p in points:
            device = p.config["workload"]["device"]
            if device != self.device:
                raise UsageError(
                    f"{experiment}: settings.device {device!r} does not match cluster profile "
                    f"{self.path} (device {self.device!r}); change one of them"
                )

    def parameters(self, nodes: int, tasks_per_node: int, minutes: int, name: str) -> dict[str, Any]:
        """sbatch parameters for submitit's SlurmExecutor (None values left out)."""
        params = {
            "job_name": name,
            "partition": self.partition,
            "account": self.account,
            "nodes": nodes,
            "ntasks_per_node": tasks_per_node,
            "cpus_per_task": self.cpus_per_task,
            "gpus_per_node": tasks_per_node if self.device == "cuda" else None,
            "time": minutes,
            "mem": self.mem,
            "constraint": self.constraint,
            "setup": list(self.setup or []),
            "additional_parameters": dict(self.extra or {}),
            "srun_args": ["--kill-on-bad-exit=1"],
            "array_parallelism": self.array_parallelism,
        }
        return {k: v for k, v in params.items() if v is not None}


# What a value may be before it reaches the job script (#45): text that sbatch reads as one word
_WORDS = {
    "partition": re.compile(r"[A-Za-z0-9_.,-]+"),
    "account": re.compile(r"[A-Za-z0-9_.,-]+"),
    "constraint": re.compile(r"[A-Za-z0-9_.,&|*\[\]():-]+"),
    "mem": re.compile(r"[0-9]+[KMGT]?"),
}
_OPTION = re.compile(r"[a-z][a-z0-9_-]*")  # an sbatch long option's name
_EXTRA_VALUE = re.compile(r"[A-Za-z0-9_.,:=+@%/&|*\[\]()-]+")
# sbatch options the executor computes per point, or that a profile key sets: in extra: they
# would silently override the job shape the summary reports
_COMPUTED = {
    "nodes": "computed per point from gpus_per_node", "ntasks": "computed per point",
    "ntasks_per_node": "computed per point from gpus_per_node", "gpus_per_node": "the profile key",
    "gpus": "computed per point", "time": "the profile key time (the most minutes)",
    "array": "computed per submission", "job_name": "computed per experiment",
    "output": "submitit's", "error": "submitit's", "cpus_per_task": "the profile key",
    "partition": "the profile key", "account": "the profile key", "mem": "the profile key",
    "constraint": "the profile key", "wrap": "the job script's",
}  # fmt: skip


def _check_extra(key: str, value: Any) -> None:
    """One ``extra:`` sbatch option: a known-shaped name, a value that is one word of safe
    characters (no newline, quote, space or ;), a finite positive number, or true (a flag)."""
    where = f"extra.{key}"
    if not _OPTION.fullmatch(key):
        raise SchemaError(where, "not an sbatch option name (lowercase letters, digits, - and _)")
    if key.replace("-", "_") in _COMPUTED:
        raise SchemaError(where, f"set by tspbench ({_COMPUTED[key.replace('-', '_')]}), not in extra:")
    if value is True:
        return
    if value is False or value is None:
        raise SchemaError(where, "a flag is true or left out (sbatch has no --option=False)")
    if isinstance(value, (int, float)):
        if not (math.isfinite(value) and 0 <= value <= 2**31 - 1):
            raise SchemaError(where, f"must be a finite number in [0, 2147483647], got {value!r}")
        return
    if not isinstance(value, str) or not _EXTRA_VALUE.fullmatch(value):
        raise SchemaError(
            where,
            f"{value!r}: one word of letters, digits and {_EXTRA_VALUE.pattern[13:-2]} (no spaces, "
            "quotes, newlines or ;): it is written into the job script",
        )


def profile_names() -> list[str]:
    return sorted({p.stem for d in PROFILE_DIRS if d.is_dir() for p in d.glob("*.yaml")})


def load_profile(name: str) -> Profile:
    """``NAME`` -> slurm/NAME.yaml (here, then in the repository); a path is used as it is."""
    if name.endswith((".yaml", ".yml")) or os.sep in name:
        path = Path(name)
    else:
        path = next((d / f"{name}.yaml" for d in PROFILE_DIRS if (d / f"{name}.yaml").is_file()), Path(name))
    if not path.exists():  # a FIFO or device: read_yaml refuses it, saying what it is
        raise UsageError(f"cluster profile {name!r} not found; known: {', '.join(profile_names()) or 'none'}")
    raw = read_yaml(path)
    try:
        values = check_mapping(raw, PROFILE, "")
        for key in ("partition", "account", "constraint", "mem"):
            if values[key] is not None and not _WORDS[key].fullmatch(values[key]):
                raise SchemaError(key, f"{values[key]!r} is not a Slurm {key} ({_WORDS[key].pattern})")
        for key, value in (values["extra"] or {}).items():
            _check_extra(str(key), value)
        for i, line in enumerate(values["setup"] or []):
            if not isinstance(line, str) or "\n" in line or "\0" in line:
                raise SchemaError(f"setup[{i}]", f"expected one shell line (text, no newline), got {line!r}")
    except SchemaError as exc:
        raise UsageError(f"{path}: {exc}") from None
    return Profile(path.stem, path, values)
