"""report.frame with the sequence axis's K/V exchanges (#48): SP 8 under ring attention and SP 8
under the all-gather are two layouts in every table and figure, and a record stored before the
field existed reads as the all-gather. Synthetic predicted records: no executor runs."""

from __future__ import annotations

import pandas as pd
from matplotlib.lines import Line2D

from tspbench.report import figures
from tspbench.report.frame import context, prepare
from tspbench.report.legend import EXCHANGES, LAYOUTS, exchange_of, split_exchange, with_exchange
from tspbench.report.style import SeriesStyle
from tspbench.report.tables import summary_table


def records(exchanges: list[object], seqs: tuple[int, ...] = (1024, 2048)) -> pd.DataFrame:
    """Predicted sp 4 records, one per (exchange, seq); None leaves the field out of the record
    (a record stored before #48), as pandas reads a column some records lack."""
    rows = []
    for k, exchange in enumerate(exchanges):
        for seq in seqs:
            row = {"strategy": "sp", "sp": 4, "world_size": 4, "seq_len": seq, "batch": 1, "mode": "train",
                   "recompute": "none", "dtype": "float32", "model": "small", "device": "cpu",
                   "source": "predicted", "status": "completed", "hardware": "cpu"}  # fmt: skip
            row["peak_memory_bytes"] = (k + 1) * seq * 2**18
            if exchange is not None:
                row["kv_exchange"] = exchange
            rows.append(row)
    return pd.DataFrame(rows)


def test_exchange_labels_round_trip_and_default_to_allgather() -> None:
    assert [exchange_of(v) for v in (None, float("nan"), "", "ring")] == ["allgather"] * 3 + ["ring"]
    assert with_exchange("sp8", "allgather") == "sp8"
    assert with_exchange("sp8", "ring") == "sp8 (ring)" and with_exchange("sp8", "ulysses") == "sp8 (Ulysses)"
    assert with_exchange("sp8", "striped") == "sp8 (striped)"  # one this table lacks still reads apart
    for name in EXCHANGES:
        assert split_exchange(with_exchange("tp_sp tp2 x sp4", name)) == ("tp_sp tp2 x sp4", name)


def test_series_and_summary_tell_exchanges_apart_and_old_records_read_as_allgather() -> None:
    df = prepare(records([None, "ring", "ulysses"]))  # None: the field absent, an older record
    assert list(dict.fromkeys(df["series"])) == ["sp4", "sp4 (ring)", "sp4 (Ulysses)"]  # the legend's order
    assert set(df["kv_exchange"]) == {"allgather", "ring", "ulysses"}
    table = summary_table(df)
    assert list(table.columns[:3]) == ["strategy", "degrees", "kv_exchange"]
    assert list(table["kv_exchange"][::2]) == ["allgather", "ring", "ulysses"]


def test_records_without_exchanges_keep_their_table_and_labels() -> None:
    df = prepare(records([None]))
    assert "kv_exchange" not in summary_table(df).columns  # stored reports regenerate byte for byte
    assert set(df["series"]) == {"sp4"}
    style = SeriesStyle([("sp4", "sp"), ("tp_sp tp2 x sp2", "tp_sp")], ["sp", "tp_sp"])
    # no exchange shown: each layout takes its strategy's own dash from the layouts' table
    assert style.dash == {"sp4": LAYOUTS["sp"].dash, "tp_sp tp2 x sp2": LAYOUTS["tp_sp"].dash}


def test_figure_legend_has_one_entry_per_exchange_each_its_own_dash() -> None:
    df = prepare(records(["allgather", "ring", "ulysses"]))
    fig = figures.memory_vs_seq(df, context(df))
    assert fig is not None
    handles = [h for h in fig.legends[0].legend_handles if isinstance(h, Line2D)]
    lines = {h.get_label(): h for h in handles if h.get_label().startswith("sp4")}
    assert list(lines) == ["sp4", "sp4 (ring)", "sp4 (Ulysses)"]
    assert len({h.get_color() for h in lines.values()}) == 1  # one layout: one color
    assert len({str(h._dash_pattern) for h in lines.values()}) == 3  # solid, dashed, dotted


def test_layouts_keep_their_shades_and_exchanges_their_dashes() -> None:
    series = [(with_exchange(layout, e), "tp_sp") for layout in ("tp_sp tp4 x sp2", "tp_sp tp2 x sp4")
              for e in ("allgather", "ring")]  # fmt: skip
    style = SeriesStyle(series, ["tp_sp"])
    dark, light = style.color["tp_sp tp4 x sp2"], style.color["tp_sp tp2 x sp4"]
    assert dark != light and style.color["tp_sp tp2 x sp4 (ring)"] == light
    ring = EXCHANGES["ring"].dash
    assert style.dash["tp_sp tp4 x sp2 (ring)"] == style.dash["tp_sp tp2 x sp4 (ring)"] == ring
    assert style.line("tp_sp tp4 x sp2")["linestyle"] == "-"


def test_every_switch_set_away_from_its_default_names_its_own_series() -> None:
    """#43: tp8 with and without Megatron SP, tsp8 with the ring or the broadcast MLP exchange, are
    two lines of a figure and two rows of a table, not one."""
    rows = pd.DataFrame(
        [
            {"strategy": "tp", "tp": 8, "megatron_sp": False},
            {"strategy": "tp", "tp": 8, "megatron_sp": True},
            {"strategy": "tsp", "tsp": 8, "mlp_exchange": "broadcast", "overlap": False},
            {"strategy": "tsp", "tsp": 8, "kv_exchange": None},
        ]
    ).assign(status="completed", source="predicted", mode="train", seq_len=1024, batch=1, world_size=8)
    labels = set(prepare(rows)["series"])
    assert labels == {"tp8", "tp8 + Megatron SP", "tsp8 + MLP broadcast, no overlap", "tsp8"}
    table = summary_table(prepare(rows))  # and a column for each switch some row sets, none for the rest
    assert {"megatron_sp", "overlap", "mlp_exchange"} <= set(table.columns) and "kv_exchange" not in table
    assert list(table["megatron_sp"]) == [False, True, False, False]
