"""``tspbench plan --tune``: each layout ranked at its best setting.

The check is independent of the planner's own search: results/paper_throughput swept every
setting of each 8-GPU layout at 128K (a sweep of stored points, priced on mi300x, its best per
layout picked here from the records), so the tuned plan must rank each of those layouts at the
same tokens/s per GPU, by the same setting.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_exit import exit_code

from tspbench.analytic.hardware import load_hardware
from tspbench.analytic.planner import plan, settings
from tspbench.cli.main import main
from tspbench.core.spec import ModelConfig, Workload
from tspbench.sweep.store import load

STORED = Path(__file__).resolve().parents[2] / "results" / "paper_throughput"
AT_128K = Workload(ModelConfig.preset("7b"), 1, 131072, "train", "none", "bfloat16", "cuda")
SETTING = ["recompute", "megatron_sp", "kv_exchange", "mlp_exchange", "overlap"]


def _stored_best() -> dict[tuple, dict]:
    """Each 8-GPU layout's fastest completed record at 128K in the swept study."""
    df = load(STORED)
    df = df[(df["seq_len"] == 131072) & (df["world_size"] == 8) & (df["status"] == "completed")]
    best = df.loc[df.groupby(["strategy", "tp", "sp", "tsp", "fsdp"])["tokens_per_s_per_gpu"].idxmax()]
    return {(r["strategy"], r["tp"], r["sp"], r["tsp"], r["fsdp"]): r for r in best.to_dict("records")}


def test_the_tuned_plan_finds_the_best_setting_the_sweep_found() -> None:
    result = plan(AT_128K, 8, load_hardware("mi300x"), tune=True)
    ranked = {
        (c.layout.strategy, c.layout.tp, c.layout.sp, c.layout.tsp, c.layout.fsdp): c for c in result.ranked
    }
    stored = _stored_best()
    compared = [key for key in stored if key in ranked]  # tp_sp 1x8 and 8x1 are sp 8 and tp 8 here
    assert {k[0] for k in compared} == {"fsdp_sp", "tp_sp", "tsp"}
    for key in compared:
        won, record = ranked[key], stored[key]
        assert won.prediction.tokens_per_s_per_gpu == pytest.approx(
            record["tokens_per_s_per_gpu"], rel=1e-9
        ), key
        assert [getattr(won.workload, k) for k in SETTING] == [record[k] for k in SETTING], key


def test_tuning_tries_exactly_the_switches_a_strategy_takes() -> None:
    """TSP: MLP exchange x overlap x 4 recompute modes; TP: Megatron SP x 4; a fixed recompute
    mode, or a prefill, leaves the switches alone."""
    assert len(settings("tsp", AT_128K)) == 2 * 2 * 4
    assert len(settings("tp", AT_128K)) == 2 * 4
    assert len(settings("tp_sp", AT_128K)) == 2 * 3 * 4
    assert len(settings("fsdp", AT_128K)) == 4
    assert {w.recompute for w in settings("tp", AT_128K, fixed_recompute=True)} == {"none"}
    prefill = AT_128K.with_(mode="infer")
    assert {w.recompute for w in settings("sp", prefill)} == {"none"} and len(settings("sp", prefill)) == 3


def test_the_tuned_ranking_names_each_setting(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--gpus", "8", "--seq-len", "131072", "--tune", "--top", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "each layout at its best setting" in out
    assert "fsdp_sp(sp8)" in out and "recompute none, kv ulysses" in out
    assert main([*argv, "--json"]) == 0
    first = json.loads(capsys.readouterr().out)["ranked"][0]
    assert first["setting"]["kv_exchange"] == "ulysses" and first["setting"]["recompute"] == "none"


def test_a_fixed_recompute_mode_is_kept_while_tuning(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--gpus", "8", "--seq-len", "16384", "--tune", "--recompute", "full", "--json"]
    assert main(argv) == 0
    ranked = json.loads(capsys.readouterr().out)["ranked"]
    assert ranked and {r["setting"]["recompute"] for r in ranked} == {"full"}


def test_recompute_with_a_prefill_is_refused_naming_it() -> None:
    argv = ["plan", "--gpus", "8", "--seq-len", "16384", "--mode", "infer", "--recompute", "full"]
    assert exit_code(argv) == 2
