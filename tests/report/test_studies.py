"""The scaling and micro-batch studies' words and tables (tspbench.report.studies) from
synthetic records: each layout's wall is the first micro-batch that does not fit, its largest
fitting micro-batch the one below, and a forward-only scaling study says why it is flat."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tspbench.report.studies import caption, scaling_note, walls, walls_table


def sweep(series: str, seq_len: int, tputs: dict[int, float | None]) -> list[dict]:
    """One layout's micro-batch points; None: out of memory."""
    return [
        {"series": series, "seq_len": seq_len, "batch": b, "status": "completed" if t else "oom", "tput": t}
        for b, t in tputs.items()
    ]


def test_each_layouts_wall_largest_and_best_from_synthetic_records() -> None:
    rows = sweep("tp8", 131072, {1: 100.0, 2: 120.0, 4: 130.0, 8: None, 16: None})
    rows += sweep("tsp8", 131072, {1: 80.0, 2: 90.0, 4: 95.0, 8: 99.0, 16: 97.0})  # best below the largest
    rows += sweep("sp8", 131072, {1: None, 2: None, 4: None, 8: None, 16: None})
    rows += sweep("tp8", 16384, {1: 50.0, 2: 60.0, 4: 70.0, 8: 80.0, 16: 90.0})
    df = pd.DataFrame(rows).assign(tput=lambda d: d["tput"].astype(float))
    got = walls(df).set_index(["seq_len", "series"])
    assert got.loc[(131072, "tp8"), ["wall", "largest", "tput_at_largest"]].tolist() == [8, 4, 130.0]
    assert got.loc[(131072, "tsp8"), ["largest", "tput_at_largest", "best_batch", "best_tput"]].tolist() == [
        16,
        97.0,
        8,
        99.0,
    ]
    assert np.isnan(got.loc[(131072, "tsp8"), "wall"])  # no wall below 16
    assert np.isnan(got.loc[(131072, "sp8"), "largest"])  # nothing fits
    assert got.loc[(16384, "tp8"), "largest"] == 16
    table = walls_table(df)
    assert "| 128K | tp8 | 8 | 4 | 130 | 130 | 4 |" in table
    assert "| 128K | tsp8 | none (fits 16) | 16 | 97 | 99 | 8 |" in table
    assert "| 128K | sp8 | 1 | none fits |" in table
    assert table.index("| 16K |") < table.index("| 128K |")  # a setting's layouts together, short first
    assert "wall" in caption("microbatch", df) and caption("memory_vs_seq", df) == ""


def test_a_forward_only_scaling_study_says_why_it_is_flat_a_training_one_what_bends_it() -> None:
    infer = pd.DataFrame({"mode": ["infer", "infer"], "world_size": [8, 16]})
    assert "Forward only" in scaling_note(infer) and "flat by construction" in scaling_note(infer)
    train = pd.DataFrame(
        {
            "mode": ["train"] * 2,
            "world_size": [8, 1024],
            "status": ["completed"] * 2,
            "tput": [2000.0, 1800.0],
            "series_mp": ["tsp8"] * 2,
            "crossing_axes": ["", "dp"],
            "internode_share": [0.0, 0.1],
            "hardware": ["mi300x"] * 2,
        }
    )
    note = scaling_note(train)
    assert "all-reduces the gradients over dp" in note and "NIC 45 GB/s per GPU on the mi300x profile" in note
    words = caption("scaling", train)
    assert "| tsp8 | 8 | 2,000 | 1,024 | 1,800 | 0.900 | dp | 10.0% |" in words
    assert scaling_note(train.drop(columns="internode_share")) == ""  # older records: nothing claimed
