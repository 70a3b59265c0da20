"""TSP's first weight broadcast of each attention pass, before and after the pass before issues it.

Two traced fake-world points of the same command, one run on the code before the prefetch and
one after (results/timeline_check/tsp_prefetch/{before,after}/: result.json and trace.npz, the
commands in that folder's README.md), replayed on their record's profile. Writes gantt.png (the
second layer's forward on rank 0, as the report draws it, one panel each) and summary.json
(step time, exposed broadcast time, hidden fractions) beside them.

    tspbench check tsp-prefetch [results/timeline_check/tsp_prefetch]
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from tspbench.core.files import read_input_text
from tspbench.report.gantt import panel, panels_figure, replay

FIELDS = (
    "timeline_step_time_s",
    "timeline_exposed_broadcast_s",
    "timeline_hidden_fraction_broadcast",
    "timeline_weights_hidden_fraction",
    "peak_memory_bytes",
)


def tsp_prefetch(folder: Path) -> dict[str, dict]:
    """gantt.png and summary.json from ``folder``'s two traced points; returns the summary."""
    panels, summary = [], {}
    for side in ("before", "after"):
        record = json.loads(read_input_text(folder / side / "result.json"))
        row = pd.Series({**record, "run_dir": str(folder / side), "series": side, "run_id": side})
        summary[side] = {k: record[k] for k in FIELDS}
        panels.append(panel(row, replay(row)))
    fig = panels_figure(
        panels,
        "GPU",
        f"TSP {record['tsp']}, {record['model']}, {record['seq_len']:,} tokens, {record['mode']}: the second"
        f" layer's forward before and after the prefetch\nfake-world traces replayed on the"
        f" {record['timeline_hardware']} profile",
    )
    fig.savefig(folder / "gantt.png", dpi=120)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
