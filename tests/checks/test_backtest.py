"""The backtest against published GPU runs (#22): the file parses, every entry the project can
express predicts, the command is quick, the errors are what they say, bad entries are one line."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import yaml

from tspbench.analytic.hardware import load_hardware
from tspbench.analytic.predict import predict
from tspbench.analytic.timeline import timeline
from tspbench.checks.backtest import backtest_rows, fit_profiles, summarize
from tspbench.checks.published import fake_record_path, load_published, read_fake_record
from tspbench.cli.main import main
from tspbench.core.errors import ExperimentError
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.core.trace import load_traces

REPO = Path(__file__).resolve().parents[2]
FILE = REPO / "results" / "published" / "published.yaml"


@pytest.fixture(scope="module")
def published():
    return load_published(FILE)


@pytest.fixture(scope="module")
def rows(published):
    return {r["id"]: r for r in backtest_rows(published, FILE.parent)}


def test_every_entry_parses_with_its_source_and_every_expressible_one_predicts(published, rows) -> None:
    assert len(published.entries) >= 6
    for e in published.entries:
        assert e.source["url"].startswith("https://") and e.source["where"], e.id
        assert e.hardware["power_limit_w"] and e.hardware["interconnect"], e.id
    predicted = published.predicted()
    assert any(e.expressed_as["tp"] > 1 for e in predicted), "a TP entry is predicted"
    assert any(e.layout["cp"] > 1 for e in published.entries), "a sequence-sharded entry is listed"
    for e in predicted:
        row = rows[e.id]
        assert row["calibrated_tokens_per_s_per_gpu"] > 0 and row["calibrated_dominant"], e.id
        record = read_fake_record(FILE.parent, *e.point())
        assert record is not None and record["status"] == "completed", (
            f"{e.id}: run tspbench backtest --execute"
        )
        assert row["fake_allocated_gib"] == pytest.approx(record["peak_memory_bytes"] / 2**30)
        if row["assumed_profile"] is not None:  # the timeline replays on the assumed profile
            assert row["assumed_timeline_tokens_per_s_per_gpu"] > 0, f"{e.id}: no stored trace"
        else:
            assert row["assumed_timeline_tokens_per_s_per_gpu"] is None, e.id
    assert any(rows[e.id]["assumed_profile"] for e in predicted), "a timeline is replayed"
    for e in published.entries:
        if not e.predicted:
            assert rows[e.id]["not_predicted"] and "calibrated_error" not in rows[e.id]


def test_the_published_numbers_agree_with_the_sources_own_mfu() -> None:
    """torchtitan's text says 33% MFU without compile and 39% with, for Table 1: its FLOPs per
    token (6 x parameters without the embedding + 12 l h q t, the causal square counted whole)
    times the published tokens/s over 989 TFLOP/s give them back only at 8,192 tokens."""
    h, layers, heads, vocab = 4096, 32, 32, 128256
    params = layers * (2 * h * h + 2 * h * 1024 + 3 * h * 14336 + 2 * h) + vocab * h + h  # output kept
    per_token = 6 * params + 12 * layers * heads * (h // heads) * 8192
    assert 5762 * per_token / 989e12 == pytest.approx(0.337, abs=0.001)
    assert 6667 * per_token / 989e12 == pytest.approx(0.390, abs=0.001)
    assert 5762 * (per_token - 12 * layers * h * (8192 - 2048)) / 989e12 < 0.29  # not 2,048 tokens


def test_the_error_is_predicted_over_published_minus_one(rows) -> None:
    """Derived here without the backtest: the step's tokens per GPU (local batch x sequence)
    over the model's step time, against Table 1's 5,762 tokens/s/GPU."""
    model = ModelConfig(4096, 32, 32, 8, 14336, vocab_size=128256, rope_theta=500000.0, name="llama3.1-8b")
    workload = Workload(model, 2, 8192, "train", "selective", "bfloat16", "cuda")
    for kind, profile in (("assumed", "h100-96gb-500w"), ("calibrated", "h100-96gb-500w-calibrated")):
        step = predict(Layout("fsdp", fsdp=8), workload, load_hardware(profile)).step_time_s
        assert rows["tt-8b-fsdp8"][f"{kind}_error"] == pytest.approx(2 * 8192 / step / 5762 - 1, rel=1e-9)
    traces, _ = load_traces(
        fake_record_path(FILE.parent, Layout("fsdp", fsdp=8), workload).with_suffix(".npz")
    )
    step = timeline(traces, load_hardware("h100-96gb-500w"), 8).step_s
    assert rows["tt-8b-fsdp8"]["assumed_timeline_error"] == pytest.approx(
        2 * 8192 / step / 5762 - 1, rel=1e-9
    )
    compiled = rows["tt-8b-fsdp8-compile"]
    assert compiled["assumed_error"] is None  # the assumed profile models no torch.compile
    assert compiled["calibrated_profile"] == "h100-96gb-500w-calibrated-compile"


def test_calibrated_profiles_hold_the_fit_of_their_calibration_entries_only(published, rows) -> None:
    fits = fit_profiles(published)
    calibration = {e.id for e in published.entries if e.role == "calibration"}
    tests = {e.id for e in published.entries if e.role == "test"}
    for name, fit in fits.items():
        hw = load_hardware(name)
        assert hw.elementwise_passes["train"] == pytest.approx(fit["train_passes"], abs=0.05)
        provenance = hw.source_of("elementwise_passes")
        assert set(fit["entries"]) <= calibration and all(i in provenance for i in fit["entries"])
        assert not any(f"entry {i} " in provenance for i in tests)
    for s in summarize(list(rows.values())):
        role = "calibration" if s.sample == "in-sample" else "test"
        nothing_fitted = s.kind in ("assumed", "timeline")
        assert nothing_fitted or {rows[i]["role"] for i in s.ids} <= {role}, s


def test_backtest_command_prints_the_table_and_writes_it_quickly(tmp_path: Path, capsys) -> None:
    start = time.perf_counter()
    assert main(["backtest", "--out", str(tmp_path)]) == 0
    assert time.perf_counter() - start < 60
    out = capsys.readouterr().out
    assert "tt-8b-fsdp8 " in out and "out-of-sample" in out and "in-sample" in out
    for name in ("backtest.csv", "backtest.md", "backtest.png", "backtest.svg"):
        assert (tmp_path / name).stat().st_size > 0
    assert "| tt-8b-fsdp8-tp8-compile | test |" in (tmp_path / "backtest.md").read_text()


def _entry0(raw: dict) -> dict:
    return raw["entries"][0]


E0 = r"entries\[0\]\."
BAD = [
    (lambda r: _entry0(r)["measured"].pop("tokens_per_s_per_gpu"), E0 + r"measured\.tokens_\w+: required"),
    (lambda r: _entry0(r).update(global_batch=17), E0 + r"global_batch: 17 is not local_batch 2 x"),
    (lambda r: _entry0(r).update(float8=True), E0 + r"float8: float8 GEMMs are not modelled"),
    (lambda r: _entry0(r).update(batchsize=2), E0 + r"batchsize: unknown key"),
    (lambda r: _entry0(r)["hardware"].update(profile="h200"), E0 + r"hardware\.profile: .h200. is not in"),
    (lambda r: _entry0(r).update(role="train"), E0 + r"role: 'train' is not one of"),
    (lambda r: _entry0(r)["expressed_as"].update(fsdp=4), E0 + r"expressed_as: a layout of 4 GPUs"),
    (lambda r: _entry0(r)["expressed_as"].update(strategy="zero"), E0 + r"expressed_as: .*unknown strategy"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "message"), BAD)
def test_a_malformed_entry_is_one_line_naming_the_file_and_key(
    tmp_path: Path, capsys, change, message
) -> None:
    raw = copy.deepcopy(yaml.safe_load(FILE.read_text()))
    change(raw)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ExperimentError, match=rf"bad\.yaml: {message}"):
        load_published(bad)
    assert main(["backtest", "--file", str(bad), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.yaml" in err
