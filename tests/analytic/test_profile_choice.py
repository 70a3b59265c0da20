"""Which hardware profile a point is priced on (tspbench.analytic.profile_choice).

The rule, branch by branch, with the reason each records; then each point's profile loaded once
(its YAML parsed once) whichever command prices it - ``bench`` measured and ``--fake``,
``predict``, a sweep's predicted and measured points - and the record's analytic time, timeline
and MFU all on that one profile, which the record names (``hardware_choice``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tspbench.analytic import hardware
from tspbench.analytic.profile_choice import choose_profile, profile_name
from tspbench.cli.main import main
from tspbench.sweep.store import load

PROFILES = Path(hardware.__file__).parent / "profiles"


@pytest.mark.parametrize(
    ("named", "experiment", "device", "device_name", "label", "why", "of_device"),
    [
        ("h100", "a100", "cuda", "NVIDIA H200", "h100", "the profile named", True),
        (None, "a100", "cuda", "NVIDIA H200", "a100", "the experiment's hardware", True),
        (None, None, "cuda", "NVIDIA H200", "h200", "matched by the device name 'NVIDIA H200'", True),
        (None, None, "cpu", "x86_64", "cpu", "this kind of host", True),
        ("mi300x", None, "cpu", "x86_64", "mi300x", "the profile named", False),  # no MFU: not the device
    ],
)
def test_a_measured_point_is_priced_on_the_named_profile_else_its_devices(
    named: str | None,
    experiment: str | None,
    device: str,
    device_name: str,
    label: str,
    why: str,
    of_device: bool,
) -> None:
    choice = choose_profile(
        named, device=device, device_name=device_name, experiment=experiment, measured=True
    )
    assert (choice.label, choice.reason, choice.of_device) == (label, f"{label} profile ({why})", of_device)
    assert choice.hardware.name == label


def test_a_gpu_no_profile_describes_is_priced_on_the_papers_and_says_to_name_one() -> None:
    choice = choose_profile(None, device="cuda", device_name="Some Future GPU", measured=True)
    assert choice.label == "mi300x" and not choice.of_device
    assert "'Some Future GPU'" in choice.reason and "--hardware" in choice.reason


@pytest.mark.parametrize(
    ("named", "experiment", "device", "label", "why"),
    [
        ("h100", "a100", "cuda", "h100", "the profile named"),
        (None, "a100", "cuda", "a100", "the experiment's hardware"),
        (None, None, "cuda", "mi300x", "the paper's GPU, for a simulated one"),
        (None, None, "cpu", "cpu", "a fake CPU world: this kind of host"),
    ],
)
def test_a_fake_or_predicted_point_on_the_named_else_the_experiments_else_the_papers(
    named: str | None, experiment: str | None, device: str, label: str, why: str
) -> None:
    # a simulated GPU is never matched by the name of the device the fake world runs on
    choice = choose_profile(
        named, device=device, device_name="NVIDIA H200", experiment=experiment, measured=False
    )
    assert (choice.label, choice.reason) == (label, f"{label} profile ({why})")


def test_a_profile_given_by_path_is_named_by_its_path(tmp_path: Path) -> None:
    """A record stores the path (``timeline_hardware``), which loads it again; not the profile's name."""
    data = yaml.safe_load((PROFILES / "cpu.yaml").read_text())
    path = tmp_path / "my-node.yaml"
    path.write_text(yaml.safe_dump({**data, "name": "my-node"}))
    choice = choose_profile(str(path), device="cpu", measured=True)
    assert choice.label == str(path) and choice.hardware.name == "my-node" and choice.of_device


def test_a_stored_record_is_repriced_on_the_profile_it_names() -> None:
    assert profile_name({"timeline_hardware": "h100", "hardware": "a100", "device": "cuda"}) == "h100"
    assert profile_name({"hardware": "a100", "device": "cuda"}) == "a100"
    assert profile_name({"device": "cuda"}) == "mi300x"
    assert profile_name({"device": "cpu"}) == "cpu"


# ----------------------------------------------------------------------------- one load per point


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every profile file parsed from here on (tspbench.analytic.hardware.load_hardware's read)."""
    parsed: list[Path] = []
    read = hardware.read_yaml

    def counted(path: Path, *args: object) -> object:
        parsed.append(path)
        return read(path, *args)

    monkeypatch.setattr(hardware, "read_yaml", counted)
    return parsed


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_predict_loads_its_profile_once(loads: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(["predict", "--strategy", "tp", "--tp", "2"], capsys)
    assert out["hardware"] == "mi300x" and [p.stem for p in loads] == ["mi300x"]


def test_bench_fake_loads_once_and_prices_model_and_timeline_on_it(
    loads: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    record = run_json(["bench", "--fake", "--strategy", "tp", "--tp", "2", "--dtype", "bfloat16"], capsys)
    assert record["status"] == "completed" and [p.stem for p in loads] == ["mi300x"]
    assert record["hardware_choice"] == "mi300x profile (the paper's GPU, for a simulated one)"
    assert record["predicted_hardware"] == record["timeline_hardware"] == "mi300x"
    assert record["predicted_step_time_s"] > 0 and record["timeline_step_time_s"] > 0


def test_a_predicted_sweep_point_loads_its_profile_once(
    loads: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = sweep_point(tmp_path, "executor: predict\nhardware: h100\n")
    assert [p.stem for p in loads] == ["h100"]
    assert (
        record["hardware"] == "h100"
        and record["hardware_choice"] == "h100 profile (the experiment's hardware)"
    )


@pytest.mark.slow
def test_a_measured_bench_is_priced_on_one_profile_loaded_once(
    loads: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    record = run_json(["bench", "--strategy", "dp", "--steps", "1", "--warmup", "1"], capsys)
    assert record["status"] == "completed" and [p.stem for p in loads] == ["cpu"]
    one_profile(record, "cpu profile (this kind of host)")


@pytest.mark.slow
def test_a_measured_sweep_point_is_priced_on_one_profile_loaded_once(
    loads: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = sweep_point(tmp_path, "executor: local\nrun: {warmup: 1, steps: 1, timeout: 120}\n")
    assert record["status"] == "completed" and [p.stem for p in loads] == ["cpu"]
    one_profile(record, "cpu profile (this kind of host)")


def one_profile(record: dict, reason: str) -> None:
    """The analytic time, the timeline and MFU of a measured record all on the profile it names."""
    assert record["hardware_choice"] == reason
    assert record["predicted_hardware"] == record["timeline_hardware"] == "cpu"
    assert record["mfu_peak_source"].startswith(reason)
    assert record["predicted_step_time_s"] > 0 and record["timeline_step_time_s"] > 0 and record["mfu"] > 0


def sweep_point(tmp_path: Path, settings: str) -> dict:
    """The record of a one-point sweep (the tiny model, DP on one CPU rank), run in this process."""
    path = tmp_path / "one.yaml"
    path.write_text(
        "name: one\nmodel: {preset: tiny}\nsettings: {seq_len: 64, device: cpu, dtype: float32}\n"
        f"layout: {{strategy: dp}}\n{settings}"
    )
    assert main(["run", str(path), "--results", str(tmp_path / "results")]) == 0
    (record,) = load(tmp_path / "results" / "one").to_dict("records")
    return record
