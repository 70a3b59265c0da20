"""Each layout at its best beside its default (#43), on synthetic records: the fastest feasible
setting is picked and named, an OOM never wins, and a layout that was not swept says so."""

from __future__ import annotations

import pandas as pd

from tspbench.report.best import best_against_default, best_rows, best_view, markdown_lines, winner


def record(strategy: str, tput: float | None, status: str = "completed", **settings: object) -> dict:
    degrees = {"dp": 1, "tp": 1, "sp": 1, "tsp": 1, "fsdp": 1, {"tp_sp": "tp"}.get(strategy, strategy): 4}
    base = {"strategy": strategy, **degrees, "seq_len": 16384, "batch": 1, "mode": "train", "world_size": 4,
            "recompute": "selective", "megatron_sp": False, "overlap": True, "status": status,
            "tokens_per_s_per_gpu": tput, "peak_memory_bytes": 2**30 * (tput or 200) / 10}  # fmt: skip
    return {**base, **settings}


RECORDS = pd.DataFrame(
    [
        record("tp_sp", 100.0),
        record("tp_sp", 130.0, megatron_sp=True),
        record("tp_sp", 999.0, "oom", recompute="none"),  # faster on paper, but it does not fit
        record("tsp", 150.0),
        record("tsp", 140.0, mlp_exchange="broadcast"),
        record("tsp", 90.0, overlap=False),
        record("fsdp_sp", 80.0),  # no sweep
    ]
)


def by_layout(table: pd.DataFrame) -> dict[str, pd.Series]:
    return {r["strategy"]: r for _, r in table.iterrows()}


def test_the_fastest_feasible_setting_wins_and_is_named() -> None:
    rows = by_layout(best_against_default(RECORDS))
    assert rows["tp_sp"]["best"] == 130.0 and rows["tp_sp"]["default"] == 100.0
    assert rows["tp_sp"]["won"] == "megatron_sp true"
    assert rows["tp_sp"]["gain"] == 1.3 and rows["tp_sp"]["tried"] == 3


def test_the_default_that_is_best_reads_default() -> None:
    assert by_layout(best_against_default(RECORDS))["tsp"]["won"] == "default"


def test_a_layout_without_a_sweep_reads_default_only() -> None:
    row = by_layout(best_against_default(RECORDS))["fsdp_sp"]
    assert row["won"] == "default only" and row["best"] == row["default"] == 80.0


def test_an_oom_is_never_best_and_nothing_fits_says_so() -> None:
    oom = pd.DataFrame([record("tp", None, "oom"), record("tp", None, "oom", megatron_sp=True)])
    row = best_against_default(oom).iloc[0]
    assert row["won"] == "no setting fits" and pd.isna(row["best"])
    assert len(best_rows(oom)) == 1 and not best_rows(oom).iloc[0]["megatron_sp"]  # the default, OOM


def test_memory_study_picks_the_lowest_peak() -> None:
    rows = by_layout(best_against_default(RECORDS, "memory"))
    assert rows["tsp"]["won"] == "overlap false"  # 90 -> the smallest synthetic peak


def test_best_rows_keep_one_per_layout_and_shape() -> None:
    best = best_rows(RECORDS)
    assert sorted(best["tokens_per_s_per_gpu"]) == [80.0, 130.0, 150.0]


def test_winner_against_missing_default_compares_with_the_defaults() -> None:
    row = pd.Series(record("tp", 1.0, recompute="none", kv_exchange="allgather", mlp_exchange="ring"))
    assert winner(row, None) == "recompute none"


def test_markdown_names_source_and_winner() -> None:
    text = "\n".join(markdown_lines(RECORDS, "paper_throughput", "projected for MI300X (analytic model)"))
    assert "projected for MI300X" in text and "| tp_sp tp4 | 16K |" in text and "megatron_sp true" in text
    assert "default only" in text and "1.30x" in text


def test_a_memory_figure_draws_each_layouts_lowest_peak_per_recompute_mode() -> None:
    """paper_memory's panels stay one per recompute mode, each layout at its lowest peak there;
    a study of the K/V exchanges alone (paper_memory_kv) keeps a line per exchange."""
    rows = pd.DataFrame([
        record("tp_sp", 100.0, recompute="none"),  # 10 GiB
        record("tp_sp", 50.0, recompute="none", megatron_sp=True),  # 5 GiB: the lowest under none
        record("tp_sp", 40.0, recompute="full"),  # alone in its panel
        record("tsp", 30.0, recompute="none"),
    ]).assign(degrees="d", source="predicted")  # fmt: skip
    view = best_view(rows, "paper_memory")
    assert view is not None
    picked = {(r["strategy"], r["recompute"]): r["peak_memory_bytes"] / 2**30 for _, r in view.iterrows()}
    assert picked == {("tp_sp", "none"): 5.0, ("tp_sp", "full"): 4.0, ("tsp", "none"): 3.0}
    exchanges = pd.DataFrame([record("sp", 10.0), record("sp", 9.0, kv_exchange="ring")]).assign(degrees="d")
    assert best_view(exchanges, "paper_memory_kv") is None


def test_the_per_replica_name_of_a_best_line_names_no_exchange() -> None:
    """A scaling figure names a layout per replica (series_mp); at its best the K/V exchange may
    change along the line, so 'sp8 (Ulysses)' would name one setting for a line of several."""
    rows = pd.DataFrame([record("sp", 10.0, sp=8), record("sp", 12.0, sp=8, kv_exchange="ulysses")])
    rows = rows.assign(degrees="sp8", series_mp=["sp8", "sp8 + Megatron SP (Ulysses)"], source="predicted")
    view = best_view(rows, "paper_scaling_train")
    assert view is not None and list(view["series_mp"]) == ["sp8"] and list(view["series"]) == ["sp8"]
