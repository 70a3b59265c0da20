"""A model is named for what it is wherever a name is shown (#46): a preset as it is keeps the
preset's name (and the committed records their run ids); a preset with fields changed is named
for the fields that changed, in its records and in its figures' titles, never as the preset."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib as mpl
import matplotlib.pyplot as plt
import pandas as pd
import pytest

from tspbench.cli.main import main
from tspbench.core.spec import ModelConfig
from tspbench.report import figures
from tspbench.report.frame import Context, context, prepare
from tspbench.report.style import RC
from tspbench.sweep.experiment import model_config
from tspbench.sweep.points import run_id
from tspbench.sweep.store import load

ROOT = Path(__file__).resolve().parents[2]
# the 13B-class model: 7b with five fields changed, written out by hand in field order
CUSTOM = "{preset: 7b, n_layers: 48, hidden: 5120, n_heads: 40, n_kv_heads: 8, ffn_hidden: 13824}"
CUSTOM_NAME = "7b+hidden5120,layers48,heads40,kv_heads8,ffn13824"


def test_a_changed_preset_is_named_for_its_changes_and_an_unchanged_one_as_the_preset() -> None:
    custom = ModelConfig.preset("7b", n_layers=48, hidden=5120, n_heads=40, n_kv_heads=8, ffn_hidden=13824)
    assert custom.name == CUSTOM_NAME
    assert ModelConfig.preset("7b").name == "7b"
    assert ModelConfig.preset("7b", vocab_size=32000, n_layers=32).name == "7b"  # the preset's own values
    assert ModelConfig.preset("small", vocab_size=1024).name == "small+vocab1024"
    assert ModelConfig.preset("small", rope_theta=500000.0).name == "small+rope_theta500000"


def test_committed_points_keep_their_models_names_and_run_ids() -> None:
    """Every point committed under results/ rebuilt from its preset's name alone: the same model
    (name included) and so the same run id, its folder's name: nothing stored is orphaned."""
    points = sorted((ROOT / "results").rglob("point.json"))
    assert len(points) > 100
    for path in points:
        point = json.loads(path.read_text())
        model = point["config"]["model"]
        assert model_config({"preset": model["name"]}).to_dict() == model, path
        assert run_id(point["config"]) == point["run_id"] == path.parent.name, path


@pytest.mark.slow
def test_a_custom_models_records_and_titles_name_it(tmp_path: Path) -> None:
    study = tmp_path / "custom.yaml"
    study.write_text(
        f"name: custom13b\nmodel: {CUSTOM}\nhardware: mi300x\nexecutor: predict\n"
        "settings: {batch: 1, mode: train, recompute: selective, dtype: bfloat16, device: cuda}\n"
        "sweep:\n  grid: {seq_len: [4096, 8192]}\n  zip:\n    - layout: [{strategy: tsp, tsp: 8}]\n"
    )
    assert main(["run", str(study), "--results", str(tmp_path / "results")]) == 0
    records = pd.read_csv(tmp_path / "results" / "custom13b" / "records.csv")
    assert len(records) == 2 and set(records["model"]) == {CUSTOM_NAME}
    assert set(records["model_hidden"]) == {5120} and set(records["model_n_layers"]) == {48}
    df = prepare(load(tmp_path / "results" / "custom13b"))
    with mpl.rc_context(RC):
        fig = figures.memory_vs_seq(df, context(df))
    title = fig.get_suptitle()
    plt.close(fig)
    assert f"model {CUSTOM_NAME}" in title and "preset" not in title


def test_an_unchanged_presets_title_still_says_preset() -> None:
    df = pd.DataFrame({"model": ["7b", "7b"], "mode": ["train", "train"], "dtype": ["bfloat16"] * 2})
    ctx = Context("projected for MI300X", "GPU", ["tsp"])
    assert ctx.title("peak", df) == "peak\n7b preset, train, bfloat16 - projected for MI300X"
    cut = df.assign(model=["7b-4layers", "7b-4layers"])  # named by cut_to: not a preset as it is
    assert ctx.title("peak", cut) == "peak\nmodel 7b-4layers, train, bfloat16 - projected for MI300X"
