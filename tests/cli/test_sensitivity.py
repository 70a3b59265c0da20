"""``tspbench sensitivity``: the break-even values it prints are where a hand-edited profile flips
the faster layout (issue #44's check), and a bad layout or figure exits 2 naming it.

The check is independent of the module's own re-pricing: a copy of the shipped mi300x.yaml is
edited as a user would (the ring shift: every send_recv entry's bandwidth_gbs), loaded from disk
and priced by ``predict``; 1% either side of the printed value must give different faster
layouts, so the printed value is within 1% of the true break-even (the issue asks for 2%).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from cli_exit import exit_code

from tspbench.analytic.hardware import find_profile, load_hardware
from tspbench.analytic.predict import predict
from tspbench.cli.main import main
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.sweep.points import Point

SMALL = 0.01  # either side of the printed value
TSP, AGAINST = (
    Layout("tsp", tsp=8),
    {"tp(tp8)": Layout("tp", tp=8), "tp_sp(tp2 x sp4)": Layout("tp_sp", tp=2, sp=4)},
)
FIGURES = ("ring_shift_gbs", "gemm_tflops", "attention_tflops", "overlap_efficiency")


def _edited(tmp: Path, figure: str, value: float) -> Path:
    """mi300x.yaml with ``figure`` at ``value``, edited as a user would edit the file."""
    data = yaml.safe_load(find_profile("mi300x").read_text())
    if figure == "ring_shift_gbs":
        for entry in data["collectives"]:
            if entry["op"] == "send_recv":
                entry["bandwidth_gbs"] = value
    else:
        data[figure] = value
    path = tmp / f"mi300x-{figure}-{value:.6g}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _tsp_faster(profile: Path, other: Layout, seq_len: int) -> bool:
    workload = Workload(ModelConfig.preset("7b"), 1, seq_len, "train", "selective", "bfloat16", "cuda")
    hw = load_hardware(str(profile))
    return predict(TSP, workload, hw).tokens_per_s_per_gpu > predict(other, workload, hw).tokens_per_s_per_gpu


def _study(capsys: pytest.CaptureFixture[str], seq_len: int) -> dict:
    argv = ["sensitivity", "--model", "7b", "--seq-len", str(seq_len), "--hardware", "mi300x",
            "--recompute", "selective", "--layout", "tsp:8", "--against", "tp:8", "--against", "tp_sp:2x4",
            "--json"]  # fmt: skip
    for figure in FIGURES:
        argv += ["--figure", figure]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("seq_len", [16384, 131072])
def test_printed_break_even_is_where_a_hand_edited_profile_flips(
    seq_len: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    study = _study(capsys, seq_len)
    checked = 0
    for name, rows in study["against"].items():
        for row in rows:
            value = row["break_even"] or row["beyond"]
            if value is None:  # no flip anywhere searched: the ends of the range agree
                figure = next(f for f in study["swings"] if f["key"] == row["key"])
                ends = {_tsp_faster(_edited(tmp_path, row["key"], v), AGAINST[name], seq_len)
                        for v in (figure["low"], figure["high"])}  # fmt: skip
                assert len(ends) == 1, (name, row)
                continue
            below = _tsp_faster(_edited(tmp_path, row["key"], value * (1 - SMALL)), AGAINST[name], seq_len)
            above_value = (
                min(value * (1 + SMALL), 1.0) if row["key"] == "overlap_efficiency" else value * (1 + SMALL)
            )
            above = _tsp_faster(_edited(tmp_path, row["key"], above_value), AGAINST[name], seq_len)
            assert below != above, (seq_len, name, row)
            checked += 1
    assert checked >= 2  # the ring shift flips against both baselines (inside or past its range)


def test_the_ring_shift_flips_tsp_against_tp_within_its_range_at_128k(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """At 128K TSP 8 leads TP 8 on the shipped figures; a ring shift at half the assumed 48 GB/s
    (the low end of an assumed figure's range) loses the lead, so the verdict is not robust."""
    study = _study(capsys, 131072)
    ring = next(r for r in study["against"]["tp(tp8)"] if r["key"] == "ring_shift_gbs")
    assert ring["ratio"] > 1 > ring["ratio_low"]
    assert 24 < ring["break_even"] < 48


STORED = Path(__file__).resolve().parents[2] / "results" / "paper_throughput"


def _stored(run_id: str) -> tuple[Path, Point, float]:
    folder = STORED / run_id
    record = json.loads((folder / "result.json").read_text())
    return (
        folder,
        Point.from_json(json.loads((folder / "point.json").read_text())),
        record["tokens_per_s_per_gpu"],
    )


def test_two_stored_points_each_at_its_own_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each layout at its own settings: TSP 8 broadcasting its MLP shards at selective
    recomputation against FSDP+SP 8 at op-level (16K, paper_throughput, priced on mi300x). The
    ratio is the stored records' own, and every break-even is where a hand-edited profile,
    priced with each point's own workload, flips the faster."""
    (tsp_dir, tsp, tsp_speed), (fsdp_dir, fsdp, fsdp_speed) = _stored("1af1edbd4a"), _stored("d3d06d0b8b")
    assert (tsp.workload.recompute, tsp.workload.mlp_exchange, fsdp.workload.recompute) == (
        "selective", "broadcast", "op"
    )  # fmt: skip
    argv = ["sensitivity", "--layout", str(tsp_dir), "--against", str(fsdp_dir), "--json"]
    assert main([*argv, *(a for f in FIGURES for a in ("--figure", f))]) == 0
    study = json.loads(capsys.readouterr().out)
    ((name, rows),) = study["against"].items()
    assert name == "fsdp_sp sp8 at recompute op"
    assert study["layout"] == "tsp tsp8 mlp broadcast"
    assert rows[0]["ratio"] == pytest.approx(tsp_speed / fsdp_speed, rel=1e-9)

    def tsp_faster(profile: Path) -> bool:
        hw = load_hardware(str(profile))
        mine, theirs = predict(tsp.layout, tsp.workload, hw), predict(fsdp.layout, fsdp.workload, hw)
        return mine.tokens_per_s_per_gpu > theirs.tokens_per_s_per_gpu

    found = [(r["key"], r["break_even"] or r["beyond"]) for r in rows if r["break_even"] or r["beyond"]]
    assert len(found) == 3  # GEMM inside its range; the ring shift and attention past theirs
    for key, value in found:
        high = min(value * (1 + SMALL), 1.0) if key == "overlap_efficiency" else value * (1 + SMALL)
        below, above = (tsp_faster(_edited(tmp_path, key, v)) for v in (value * (1 - SMALL), high))
        assert below != above, (key, value)


def test_a_folder_without_a_point_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_code(["sensitivity", "--layout", str(tmp_path), "--against", "tp:8"]) == 2
    assert f"{str(tmp_path)!r}: no point.json there" in capsys.readouterr().err


def test_a_strategy_layout_without_a_seq_len_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["sensitivity", "--layout", "tsp:8"]) == 2
    assert "--seq-len: required" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--layout", "tp_sp:8"], "tp_sp:8"),
        (["--layout", "tsp:eight"], "tsp:eight"),
        (["--layout", "tsp:8", "--figure", "warp_speed"], "warp_speed"),
    ],
)
def test_bad_input_exits_2_naming_it(argv: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["sensitivity", "--seq-len", "4096", *argv]) == 2
    assert named in capsys.readouterr().err


def test_profile_copy_matches_the_shipped_one(tmp_path: Path) -> None:
    """The edit helper changes only what it names: an unedited copy prices as the shipped file."""
    data = yaml.safe_load(find_profile("mi300x").read_text())
    copy = tmp_path / "copy.yaml"
    copy.write_text(yaml.safe_dump(data))
    assert replace(load_hardware(str(copy)), name="x") == replace(load_hardware("mi300x"), name="x")
