"""Project experiments/paper_decode.yaml with the analytic decode model, for MI300X and H100.

    .venv/bin/python tools/decode_projection.py [--out results/paper_decode] [--hardware mi300x h100]

Writes ``<out>/records.csv`` (one projected record per point and profile: the columns of
tspbench.analytic.decode.DecodePrediction.record beside the point's) and ``<out>/report/``
(tspbench.report's tables and figures, the decode figures among them). Every number in them is
projected by the model, not measured.

Why a tool and not ``tspbench run --executor predict``: the sweep learns mode "decode" and its
``decode_tokens`` key from the decode mechanism (issue #15, another branch). Once both are
merged, ``tspbench run experiments/paper_decode.yaml --executor predict`` gives the same
records through tspbench.analytic.decode.decode_record; this tool reads the YAML's values
directly (the grid of batches and the zip of layouts) and calls the same model.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import pandas as pd
import yaml

from tspbench.analytic.decode import predict_decode
from tspbench.core.names import AXES
from tspbench.core.spec import Layout, ModelConfig
from tspbench.report.build import report_experiment
from tspbench.sweep.store import write_atomic

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = REPO / "experiments" / "paper_decode.yaml"


def points(path: Path) -> tuple[dict, list[tuple[Layout, int]]]:
    """The experiment's settings and its (layout, batch) points: the batch grid x the layout zip."""
    data = yaml.safe_load(path.read_text())
    layouts = [Layout(**entry) for entry in data["sweep"]["zip"][0]["layout"]]
    batches = data["sweep"]["grid"]["batch"]
    return data, [(lay, b) for b, lay in itertools.product(batches, layouts)]


def record(data: dict, layout: Layout, batch: int, hardware: str) -> dict[str, object]:
    settings, model = data["settings"], ModelConfig.preset(data["model"]["preset"])
    p = predict_decode(
        layout, model, batch, settings["seq_len"], settings["decode_tokens"], settings["dtype"], hardware
    )
    return {
        "experiment": data["name"],
        "strategy": layout.strategy,
        **{a: layout.degree(a) for a in AXES},
        "world_size": layout.world_size,
        "model": model.name,
        "batch": batch,
        "seq_len": settings["seq_len"],
        "mode": "decode",
        "decode_tokens": settings["decode_tokens"],
        "recompute": "none",
        "dtype": settings["dtype"],
        "device": settings["device"],
        "method": "predict",
        **p.record(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "results" / "paper_decode")
    parser.add_argument("--hardware", nargs="+", default=["mi300x", "h100"])
    args = parser.parse_args()
    data, todo = points(EXPERIMENT)
    rows = [record(data, lay, b, hw) for hw in args.hardware for lay, b in todo]
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "records.csv", frame.to_csv(index=False, float_format="%.6g"))
    outputs = report_experiment(frame, args.out / "report")
    print(f"wrote {args.out / 'records.csv'} ({len(frame)} projected points) and {outputs.index}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
