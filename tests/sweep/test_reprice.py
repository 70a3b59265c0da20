"""Stored records re-price to themselves: the timeline and the analytic model of the code as it
is give the numbers committed beside each kept trace (``tspbench check reprice``: the results
store's tspbench.sweep.reprice, through the one re-price function tspbench.analytic.replayed
.reprice). A change to either model that is not followed by re-pricing the stored results fails
here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tspbench.analytic.hardware import load_hardware
from tspbench.checks import timeline_ops
from tspbench.sweep.reprice import reprice_run

RESULTS = Path(__file__).resolve().parents[2] / "results"
MODELLED = ("timeline_", "predicted_")  # the fields the two models give


def test_a_stored_fake_world_record_reprices_to_itself(tmp_path: Path) -> None:
    traces = sorted(RESULTS.glob("paper_scaling_fake/*/trace.npz"), key=lambda p: (p.stat().st_size, str(p)))
    run = tmp_path / traces[0].parent.name
    shutil.copytree(traces[0].parent, run)
    stored = json.loads((run / "result.json").read_text())
    modelled = [k for k, v in stored.items() if k.startswith(MODELLED) and isinstance(v, float)]
    assert "timeline_step_time_s" in modelled and "predicted_step_time_s" in modelled
    (run / "result.json").write_text(json.dumps({**stored, **dict.fromkeys(modelled, -1.0)}))

    assert reprice_run(run, with_predictions=True)

    again = json.loads((run / "result.json").read_text())
    assert again.keys() == stored.keys()
    for key in modelled:
        assert again[key] == pytest.approx(stored[key], rel=1e-9), key


@pytest.mark.parametrize("study", ["cpu_decode", "cpu_decode_fake"])
def test_a_stored_decode_record_reprices_its_predictions_without_a_trace(tmp_path: Path, study: str) -> None:
    """Decode records keep no trace; their decode-model fields still follow the committed profile."""
    source = sorted(RESULTS.glob(f"{study}/*/result.json"))[0].parent
    assert not (source / "trace.npz").exists()
    run = tmp_path / source.name
    shutil.copytree(source, run)
    stored = json.loads((run / "result.json").read_text())
    modelled = [k for k, v in stored.items() if k.startswith("predicted_") and isinstance(v, float)]
    assert "predicted_tpot_p50_s" in modelled
    (run / "result.json").write_text(json.dumps({**stored, **dict.fromkeys(modelled, -1.0)}))

    assert not reprice_run(run)  # no trace, no predictions asked for: nothing to re-price
    assert reprice_run(run, with_predictions=True)

    again = json.loads((run / "result.json").read_text())
    for key in modelled:
        assert again[key] == pytest.approx(stored[key], rel=1e-9), key


def test_the_stored_op_level_check_replays_to_itself(tmp_path: Path) -> None:
    """tspbench check timeline-ops --reprice: the committed op-level rows are what the stored
    traces replay to with the code as it is, on the profile the check calibrated in its run."""
    stored = json.loads((RESULTS / "timeline_check" / "ops.json").read_text())
    profile = RESULTS.parent / stored["hardware"]

    again = timeline_ops.reprice(RESULTS / "timeline_check", load_hardware(str(profile)))

    assert [r["layout"] for r in again] == [r["layout"] for r in stored["rows"]]
    for new, old in zip(again, stored["rows"], strict=True):
        for field in ("replayed_s", "replayed_alone_s", "error"):
            assert new[field] == pytest.approx(old[field], rel=1e-9), (old["layout"], field)
        assert new["schedule"]["replayed"] == pytest.approx(old["schedule"]["replayed"], rel=1e-9)
