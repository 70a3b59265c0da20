"""Cluster profiles: ``slurm/NAME.yaml``, what the Slurm executor asks sbatch for.

Looked up by name in ./slurm, then in the repository's slurm/ folder; a path is used as it is.
Every key is checked (tspbench.core.schema) before anything is submitted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tspbench.core.errors import UsageError
from tspbench.core.names import DEVICES
from tspbench.core.schema import INT, NUM, STR, Field, SchemaError, check_mapping
from tspbench.core.yamlfile import read_yaml
from tspbench.sweep.points import Point

PROFILE = {
    "description": Field(STR, ""),
    "partition": Field(STR, None, nullable=True),
    "account": Field(STR, None, nullable=True),
    "gpus_per_node": Field(INT, None, minimum=1, required=True),  # ranks per node (GPUs on cuda)
    "nodes": Field(INT, None, nullable=True, minimum=1),  # the most nodes a job may span (else: sinfo)
    "cpus_per_task": Field(INT, 1, minimum=1),
    "mem": Field(STR, None, nullable=True),  # sbatch --mem per node, e.g. "0" (all) or "500G"
    "time": Field(INT, 60, minimum=1),  # the most minutes one job may ask for
    "constraint": Field(STR, None, nullable=True),
    "device": Field(STR, "cuda", DEVICES),
    "array_parallelism": Field(INT, 64, minimum=1),
    "extra": Field((dict,), None, nullable=True),  # more sbatch options: {qos: high, exclusive: true}
    "setup": Field((list,), None, nullable=True),  # shell lines before srun (module load, venv)
    "wait_timeout": Field(NUM, 86400, minimum=1),  # seconds the sweep watches before detaching
    "poll": Field(NUM, 5, minimum=0.2),  # seconds between queue polls
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


def profile_names() -> list[str]:
    return sorted({p.stem for d in PROFILE_DIRS if d.is_dir() for p in d.glob("*.yaml")})


def load_profile(name: str) -> Profile:
    """``NAME`` -> slurm/NAME.yaml (here, then in the repository); a path is used as it is."""
    if name.endswith((".yaml", ".yml")) or os.sep in name:
        path = Path(name)
    else:
        path = next((d / f"{name}.yaml" for d in PROFILE_DIRS if (d / f"{name}.yaml").is_file()), Path(name))
    if not path.is_file():
        raise UsageError(f"cluster profile {name!r} not found; known: {', '.join(profile_names()) or 'none'}")
    raw = read_yaml(path)
    try:
        values = check_mapping(raw, PROFILE, "")
        for key, value in (values["extra"] or {}).items():
            if not isinstance(value, (str, int, float, bool)):
                raise SchemaError(f"extra.{key}", f"sbatch option values are scalars, got {value!r}")
        if not all(isinstance(line, str) for line in values["setup"] or []):
            raise SchemaError("setup", "expected a list of shell lines (strings)")
    except SchemaError as exc:
        raise UsageError(f"{path}: {exc}") from None
    return Profile(path.stem, path, values)
