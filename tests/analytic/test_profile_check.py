"""Hardware profiles are checked by meaning, not only by shape (#45): a count that is a fraction,
a share above 1, a bandwidth that prices a step at inf s, an unknown collective op, provenance
that is not a mapping are one line naming the file and the key, read directly or through an
experiment's ``hardware:``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cli_exit import exit_code

from tspbench.analytic.hardware import SHIPPED, available_hardware, load_hardware
from tspbench.core.errors import HardwareError

BAD = [
    ("gpus_per_node", 0.5, "gpus_per_node: expected an integer"),
    ("cores_per_node", 2.5, "cores_per_node: expected an integer"),
    ("provenance", ["a", "b"], "provenance: expected a mapping"),
    ("collectives", 5, "collectives: expected a list"),
    ("inter_node_bandwidth_gbs", 5e-324, "inter_node_bandwidth_gbs: must be in [1e-06"),
    ("gemm_tflops", 1e300, "gemm_tflops: must be in [1e-06, 100000]"),
    ("memory_bytes", 12, "memory_bytes: must be in"),
    ("contention", {2: 50}, "contention.2: must be in (0, 1]"),
    ("contention", {0.5: 0.5}, "contention key: expected an integer"),
    ("step_contention", {"gemm": {4: 3.0}}, "step_contention.gemm.4: must be in (0, 1]"),
    ("reserved_overhead_fraction", 7, "reserved_overhead_fraction: must be in (0, 1]"),
]
BAD_COLLECTIVES = [
    ({"op": "all_shuffle"}, "collectives[0].op: must be one of all_reduce"),
    ({"group_size": 1.5}, "collectives[0].group_size: expected an integer"),
    ({"group_size": 16}, "collectives[0].group_size: must be an integer in [1, 8]"),
    ({"bandwidth_gbs": float("inf")}, "collectives[0].bandwidth_gbs: expected a finite number"),
]


def profile_with(tmp_path: Path, **changes: object) -> Path:
    data = yaml.safe_load((SHIPPED / "h100.yaml").read_text())
    data.update(changes)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_every_shipped_profile_passes() -> None:
    for name in available_hardware():
        load_hardware(name)


@pytest.mark.parametrize(("key", "value", "says"), BAD)
def test_a_value_that_means_nothing_names_the_file_and_key(
    key: str, value: object, says: str, tmp_path: Path
) -> None:
    path = profile_with(tmp_path, **{key: value})
    with pytest.raises(HardwareError) as caught:
        load_hardware(str(path))
    assert str(caught.value).startswith(f"{path}: ") and says in str(caught.value), caught.value


@pytest.mark.parametrize(("change", "says"), BAD_COLLECTIVES)
def test_a_collective_out_of_meaning_is_named(change: dict, says: str, tmp_path: Path) -> None:
    entry = {"op": "all_reduce", "group_size": 2, "world_size": 8, "latency_us": 10, "bandwidth_gbs": 360}
    path = profile_with(tmp_path, collectives=[{**entry, **change}])
    with pytest.raises(HardwareError) as caught:
        load_hardware(str(path))
    assert says in str(caught.value), caught.value


def test_through_an_experiment_the_message_names_the_key(tmp_path: Path, capsys) -> None:
    path = profile_with(tmp_path, gpus_per_node=0.5)
    study = tmp_path / "study.yaml"
    study.write_text(
        f"name: s\nhardware: {path}\nmodel: {{preset: small}}\n"
        "settings: {batch: 1, seq_len: 512, mode: train, recompute: none, dtype: float32, device: cpu}\n"
        "sweep:\n  zip:\n    - layout: [{strategy: tsp, tsp: 2}]\n"
    )
    argv = ["run", str(study), "--executor", "predict", "--results", str(tmp_path / "r")]
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert "gpus_per_node: expected an integer, got 0.5" in err and len(err.strip().splitlines()) == 1, err
