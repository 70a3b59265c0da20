"""The backtest against published GPU runs: the file parses, every entry the project can express
predicts on three profiles (shipped, Hopper-measured, calibrated) for time and memory, the
Hopper-measured profile carries the H200's measurement at the ratios it states, a calibrated
profile sets only the fitted figures and names their entries, the command is quick, the errors
are what they say, bad entries are one line."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
import yaml

from tspbench.analytic.hardware import find_profile, load_hardware
from tspbench.analytic.predict import predict
from tspbench.analytic.timeline import timeline
from tspbench.checks.backtest import HOPPER_MEASURED, PROFILE_KINDS, backtest_rows
from tspbench.checks.backtest_fit import FITTED_KEYS, calibrated_profile, fit_profiles
from tspbench.checks.backtest_score import summarize
from tspbench.checks.published import fake_record_path, load_published, read_fake_record
from tspbench.cli.main import main
from tspbench.core.errors import ExperimentError
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.core.trace import load_traces
from tspbench.report.backtest import markdown
from tspbench.strategy import check_layout

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
    workload = Workload(model, 2, 8192, "train", "op", "bfloat16", "cuda")
    profiles = {
        "assumed": "h100-96gb-500w",
        "measured": "h100-96gb-500w-hopper-measured",
        "calibrated": "h100-96gb-500w-calibrated",
    }
    for kind, profile in profiles.items():
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
    assert set(fits) == {"h100-96gb-500w-calibrated", "h100-96gb-500w-calibrated-compile"}
    for name, fit in fits.items():
        hw = load_hardware(name)
        assert hw.elementwise_passes["train"] == pytest.approx(fit["train_passes"], abs=0.05)
        provenance = hw.source_of("elementwise_passes")
        assert set(fit["entries"]) <= calibration and all(i in provenance for i in fit["entries"])
        assert not any(f"{i} " in provenance for i in tests)
    for s in summarize(list(rows.values())):
        role = "calibration" if s.sample == "in-sample" else "test"
        nothing_fitted = s.kind in ("assumed", "measured", "timeline")
        assert nothing_fitted or {rows[i]["role"] for i in s.ids} <= {role}, s


def _flat(data: dict, prefix: str = "") -> dict[str, object]:
    """{'elementwise_passes.train': 33.9, ...}: a profile's figures by dotted key."""
    out: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict) and key != "provenance":
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.mark.parametrize("name", ["h100-96gb-500w-calibrated", "h100-96gb-500w-calibrated-compile"])
def test_a_calibrated_profile_sets_only_measurable_figures_and_names_their_entries(published, name) -> None:
    """Every figure but the fitted ones (the training step's element-wise passes, which calibrate
    measures on a GPU) is the Hopper-measured profile's, provenance included; the fitted one's
    provenance says 'fitted' and names the calibration entry it came from, and that entry runs
    the way the profile is used (eager or torch.compile)."""
    measured = _flat(yaml.safe_load(find_profile(HOPPER_MEASURED["h100-96gb-500w"]).read_text()))
    calibrated = _flat(yaml.safe_load(find_profile(name).read_text()))
    changed = {k for k in measured.keys() | calibrated.keys() if measured.get(k) != calibrated.get(k)}
    assert changed - {"name", "description", "provenance"} <= set(FITTED_KEYS), changed
    assert set(FITTED_KEYS) == {"elementwise_passes.train"}  # the passes: what calibrate measures
    m_prov, c_prov = measured["provenance"], calibrated["provenance"]
    assert {k for k in m_prov.keys() | c_prov.keys() if m_prov.get(k) != c_prov.get(k)} == {
        "elementwise_passes"
    }
    fitted = c_prov["elementwise_passes"]
    assert fitted.startswith("fitted")
    named = [e for e in published.entries if e.id in fitted.replace(",", " ").replace(":", " ").split()]
    assert named and all(e.role == "calibration" for e in named), fitted
    assert all(e.compile == name.endswith("-compile") for e in named)


def test_fit_write_gives_the_committed_calibrated_profiles(published) -> None:
    """What 'backtest --fit --write' writes is the committed profile: every figure the same,
    the fitted passes within what the fit moves by between model revisions (0.05)."""
    for name, fit in fit_profiles(published).items():
        written = _flat(yaml.safe_load(calibrated_profile(name, fit)))
        committed = _flat(yaml.safe_load(find_profile(name).read_text()))
        assert written.keys() == committed.keys()
        for key in written.keys() - {"description", "provenance", "elementwise_passes.train"}:
            assert written[key] == committed[key], key
        assert written["elementwise_passes.train"] == pytest.approx(
            committed["elementwise_passes.train"], abs=0.05
        )
        assert written["provenance"].keys() == committed["provenance"].keys()


H200 = REPO / "results" / "h200"


def test_the_hopper_measured_profile_carries_the_h200_at_the_ratios_it_states() -> None:
    """GEMM rates at the 500 W ratio (the NVL's 835 TFLOPS at 400 W and the SXM's 989.4 at 700 W,
    linear in power, at 500 W, over 989.4), FlashAttention-2 rates as the H200 measured them
    (causal squares counted whole: twice the causal FLOPs over the time), HBM at 2.4 / 4.8 TB/s,
    the per-op, launch and element-wise figures at 1; every carried figure says so and names its
    ratio."""
    h200, h100 = load_hardware("h200"), load_hardware(HOPPER_MEASURED["h100-96gb-500w"])
    power = (835 + (989.4 - 835) * (500 - 400) / (700 - 400)) / 989.4
    assert h100.gemm_tflops == pytest.approx(h200.gemm_tflops * power, rel=1e-5)
    assert h100.step_gemm_tflops == pytest.approx(h200.step_gemm_tflops * power, rel=1e-5)
    assert h100.hbm_bandwidth_gbs == pytest.approx(h200.hbm_bandwidth_gbs * 2.4 / 4.8, rel=1e-6)
    for key in ("op_overhead_us", "launch_us", "graph_kernel_us", "graph_replay_us", "elementwise_passes"):
        assert getattr(h100, key) == getattr(h200, key), key
    flash = {r["S"]: r for r in json.loads((H200 / "2026-12-04_19dc874/attention_kernels.json").read_text())}
    causal = {s: 2 * r["flops_fwd_bwd_causal"] / r["sdpa_flash_s"] / 1e12 for s, r in flash.items()}
    assert h100.attention_causal_by_size == pytest.approx(causal, rel=1e-4)
    assert h100.attention_causal_tflops == pytest.approx(causal[32768], rel=1e-4)
    rectangle = flash[32768]["flops_fwd_bwd_causal"] / 2 / flash[32768]["rect_flash_s"] / 1e12  # (S/2)^2
    assert h100.attention_tflops == pytest.approx(rectangle, rel=1e-3)
    assert h100.attention_kernel == "flash"  # what torchtitan's SDPA ran, not the H200's cuDNN
    for key in ("gemm_tflops", "step_gemm_tflops"):
        assert h100.source_of(key).startswith("carried") and "ratio 886.5 / 989.4" in h100.source_of(key)
    assert "500W power limit" in h100.source_of("gemm_tflops")  # the source's own words
    assert "ratio 2.4 / 4.8" in h100.source_of("hbm_bandwidth_gbs")
    for key in ("attention_tflops", "attention_causal_by_size", "op_overhead_us", "elementwise_passes"):
        assert h100.source_of(key).startswith("carried") and "ratio 1" in h100.source_of(key), key


def test_three_profiles_predict_every_entry_time_and_memory(published, rows) -> None:
    """Every predicted entry has the shipped, Hopper-measured and calibrated columns: a time on
    each profile that models the run (only the calibrated ones model torch.compile), and memory
    on all three: the model's peak against the published reserved memory, derived here."""
    for e in published.predicted():
        row, (layout, workload) = rows[e.id], e.point()
        for kind in PROFILE_KINDS:
            models_it = kind == "calibrated" or not e.compile
            assert (row[f"{kind}_tokens_per_s_per_gpu"] is not None) == models_it, (e.id, kind)
            hw = load_hardware(
                row[f"{kind}_profile"]
                or ("h100-96gb-500w-hopper-measured" if kind == "measured" else "h100-96gb-500w")
            )
            peak = predict(layout, workload, hw).memory.peak_bytes
            assert row[f"{kind}_model_allocated_gib"] == pytest.approx(peak / 2**30)
            if e.measured["memory_gib"] is not None:  # torchtitan publishes reserved memory
                reserved = peak * (1 + hw.reserved_overhead_fraction) / 2**30
                assert row[f"{kind}_memory_error"] == pytest.approx(reserved / e.measured["memory_gib"] - 1)
            if models_it:
                terms = [
                    row[f"{kind}_{t}_s"]
                    for t in ("GEMM", "attention", "elementwise", "launch", "exposed_comm")
                ]
                assert sum(terms) == pytest.approx(row[f"{kind}_step_s"], rel=1e-9), (e.id, kind)
    text = markdown(list(rows.values()), [])
    assert "| shipped | Hopper-measured | calibrated |" in text
    for e in published.predicted():
        line = next(x for x in text.splitlines() if x.startswith(f"| {e.id} | {e.role} |"))
        assert line.count("%)") == (1 if e.compile else 3), line


def test_the_calibrated_step_differs_from_the_measured_one_only_by_its_fitted_passes(rows) -> None:
    """Where both predict an entry, the calibrated step's extra seconds are the fitted passes'
    extra bytes (per layer, a block's activations) over the profile's HBM, derived here from the
    strategy's sizes, and the row names no other term."""
    row = rows["tt-8b-fsdp8"]
    model = ModelConfig(4096, 32, 32, 8, 14336, vocab_size=128256, rope_theta=500000.0, name="llama3.1-8b")
    workload = Workload(model, 2, 8192, "train", row["recompute"], "bfloat16", "cuda")
    layout = Layout("fsdp", fsdp=8)
    per_layer = check_layout(layout, workload).for_analysis(layout, workload).elementwise_layer_bytes()
    hw = load_hardware("h100-96gb-500w-calibrated")
    extra = (
        hw.elementwise_passes["train"]
        - load_hardware("h100-96gb-500w-hopper-measured").elementwise_passes["train"]
    )
    seconds = extra * 32 * per_layer / (hw.hbm_bandwidth_gbs * 1e9)
    assert row["calibrated_elementwise_s"] - row["measured_elementwise_s"] == pytest.approx(seconds, rel=1e-6)
    assert row["terms_differ"].startswith(f"element-wise {seconds:+.3f} s") and "," not in row["terms_differ"]
    assert row["disagree"] == (abs(row["calibrated_vs_measured"]) > 0.10)


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
