"""``tspbench sensitivity``: which profile figures a projected step time rests on, and where the
faster of two layouts changes (tspbench.analytic.sensitivity).

    tspbench sensitivity --model 7b --seq-len 16384 --recompute selective --hardware mi300x \\
        --layout tsp:8 --against tp:8 --against tp_sp:2x4 [--figure ring_shift_gbs] [--plot DIR]

A layout is ``strategy:degrees``, the degrees in the order of the strategy's own axes as its
name lists them (``tp_sp:2x4`` is TP 2 x SP 4; ``fsdp_sp:8`` shards over 8 sp ranks), with an
optional data-parallel degree after a comma (``tsp:8,dp4``).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tspbench.cli.args import RECOMPUTE_HELP, output_path, positive_int, vocab_size, within_model
from tspbench.core.errors import UsageError
from tspbench.core.files import read_input_text
from tspbench.core.names import AXES, DTYPES, RECOMPUTE_MODES
from tspbench.core.spec import PRESETS, Layout, ModelConfig, Workload, recompute_problem

if TYPE_CHECKING:
    from tspbench.report.claims import Comparison, Hinge


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sensitivity",
        help="how a projected step time moves with each profile figure, and where two layouts swap",
        description="Vary every profile figure the step time reads over the range its provenance "
        "allows (assumed x0.5-x2, datasheet x0.6-x1, measured within its spread), the rest held, "
        "re-pricing the step as a hand-edited profile would; with --against, each figure's "
        "break-even value where the faster layout changes.",
    )
    p.add_argument(
        "--layout", required=True, type=layout_text, help="the layout: strategy:degrees, e.g. tsp:8"
    )
    p.add_argument(
        "--against", action="append", type=layout_text, default=[], help="a layout to compare (repeatable)"
    )
    p.add_argument("--model", default="7b", choices=sorted(PRESETS), help="model preset (default 7b)")
    p.add_argument("--vocab-size", type=vocab_size, help="override the preset's vocabulary size")
    p.add_argument("--seq-len", type=positive_int, required=True, help="tokens per sequence")
    p.add_argument("--batch", type=positive_int, default=1, help="micro-batch per model replica (default 1)")
    p.add_argument("--mode", choices=("train", "infer"), default="train", help="the step (default train)")
    p.add_argument("--recompute", choices=RECOMPUTE_MODES, default="none", help=RECOMPUTE_HELP)
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16", help="(default bfloat16)")
    p.add_argument("--hardware", default="mi300x", help="a profile name or .yaml path (default mi300x)")
    p.add_argument("--figure", action="append", default=[], help="only this figure (repeatable; default all)")
    p.add_argument("--plot", type=Path, help="write the tornado figure of --layout here (a folder)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=cmd_sensitivity)


def layout_text(text: str) -> Layout:
    """'tsp:8', 'tp_sp:2x4', 'tsp:8,dp4' -> a Layout (an argparse type)."""
    strategy, _, rest = text.partition(":")
    degrees_part, _, dp_part = rest.partition(",")
    own = [a for a in strategy.split("_") if a in AXES]
    own = own[1:] if own[:1] == ["fsdp"] and len(own) > 1 else own
    try:
        degrees = [int(d) for d in degrees_part.split("x")] if degrees_part else []
        dp = int(dp_part.removeprefix("dp")) if dp_part else 1
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected strategy:degrees, e.g. tsp:8 or tp_sp:2x4"
        ) from None
    if not own or len(degrees) != len(own):
        want = "x".join(a.upper() for a in own) or "its axes"
        raise argparse.ArgumentTypeError(f"{text!r}: {strategy or '?'} takes degrees {want}, e.g. tp_sp:2x4")
    values = dict(zip(own, degrees, strict=True))
    values["dp"] = values.get("dp", 1) * dp
    try:
        return Layout(strategy, **values)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def cmd_sensitivity(args: argparse.Namespace) -> int:
    from tspbench.analytic import sensitivity as sens  # the model: only when it runs
    from tspbench.analytic.profile_choice import choose_profile
    from tspbench.strategy import check_layout

    problem = recompute_problem(args.recompute, (args.mode,))
    if problem:
        raise UsageError(f"--recompute {args.recompute} with --mode {args.mode}: {problem}")
    config = ModelConfig.preset(args.model, **({"vocab_size": args.vocab_size} if args.vocab_size else {}))
    workload = Workload(config, args.batch, args.seq_len, args.mode, args.recompute, args.dtype, "cuda")
    within_model("--seq-len", workload.seq_len, config)
    for layout in (args.layout, *args.against):
        check_layout(layout, workload)
    hw = choose_profile(args.hardware, device="cuda", measured=False).hardware
    try:
        chosen = [sens.figure_named(hw, key) for key in args.figure]
    except ValueError as exc:
        raise UsageError(f"--figure: {exc}") from None
    plot = output_path(args.plot, "--plot", folder=True) if args.plot else None
    swings = sens.swings(args.layout, workload, hw, chosen)
    evens = {b: sens.break_evens(args.layout, b, workload, hw, chosen) for b in args.against}
    if args.json:
        print(json.dumps(as_json(args.layout, workload, hw, swings, evens), indent=2))
    else:
        print_study(args.layout, workload, hw, swings, evens)
    if plot:
        for path in draw(args.layout, workload, hw, swings, plot):
            print(f"tornado: {path}")
    return 0


def heading(layout: Layout, workload: Workload, hw_name: str) -> str:
    w = workload
    rec = f", recompute {w.recompute}" if w.mode == "train" else ""
    return (
        f"{layout.describe()}  {w.model.name}  {w.seq_len:,} tokens  batch {w.batch}  {w.mode}{rec}  "
        f"on {hw_name}, projected"
    )


def number(value: float) -> str:
    """A figure's value at 3 significant digits, no exponent for the ranges a profile has."""
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"


def print_study(layout: Layout, workload: Workload, hw, swings: list, evens: dict) -> None:
    print(heading(layout, workload, hw.name))
    base = swings[0].base_s if swings else math.nan
    print(f"step time {base:.4g} s; each figure over its range, the rest held:")
    print(f"  {'figure':<28} {'value':>8} {'source':<10} {'range':<20} step s at low .. high")
    for s in swings:
        f = s.figure
        rng = f"{number(f.low)}-{number(f.high)} {f.unit}".strip()
        print(
            f"  {f.key:<28} {number(f.value):>8} {f.provenance:<10} {rng:<16} {s.low_s:.4g} .. {s.high_s:.4g}"
        )
    for other, rows in evens.items():
        if not rows:
            continue
        faster = layout if rows[0].ratio >= 1 else other
        print(
            f"\nagainst {other.describe()}: {layout.describe()} at {rows[0].ratio:.3f}x its speed "
            f"({faster.describe()} faster); break-even of each figure, the rest held:"
        )
        for b in rows:
            print(f"  {b.figure.key:<28} {break_even_text(b)}")


def break_even_text(b) -> str:
    """'flips at 24.6 GB/s (below it: ratio 0.996 at 24)', or why it does not flip."""
    f, unit = b.figure, f" {b.figure.unit}".rstrip()
    ends = f"ratio {b.ratio_low:.3f} at {number(f.low)}, {b.ratio_high:.3f} at {number(f.high)}"
    if b.ratio_low == b.ratio == b.ratio_high:
        return "does not move either layout here"
    if b.value is not None:
        return f"flips at {number(b.value)}{unit} ({ends})"
    past = f"; past it, at {number(b.beyond)}{unit}" if b.beyond is not None else ""
    return f"not within its range ({ends}{past})"


def as_json(layout: Layout, workload: Workload, hw, swings: list, evens: dict) -> dict[str, object]:
    def figure(f) -> dict[str, object]:
        return {"key": f.key, "label": f.label, "unit": f.unit, "value": f.value, "provenance": f.provenance,
                "source": f.source, "low": f.low, "high": f.high}  # fmt: skip

    return {
        "layout": layout.describe(),
        "point": heading(layout, workload, hw.name),
        "hardware": hw.name,
        "step_time_s": swings[0].base_s if swings else None,
        "swings": [{**figure(s.figure), "low_s": s.low_s, "high_s": s.high_s} for s in swings],
        "against": {
            other.describe(): [
                {
                    "key": b.figure.key,
                    "ratio": b.ratio,
                    "break_even": b.value,
                    "beyond": b.beyond,
                    "ratio_low": b.ratio_low,
                    "ratio_high": b.ratio_high,
                }
                for b in rows
            ]
            for other, rows in evens.items()
        },
    }


def draw(layout: Layout, workload: Workload, hw, swings: list, folder: Path) -> list[Path]:
    from tspbench.report.style import save
    from tspbench.report.tornado import Bar, tornado

    bars = [
        Bar(f"{s.figure.label} {number(s.figure.low)}-{number(s.figure.high)} {s.figure.unit} "
            f"({s.figure.provenance})", s.low_s, s.high_s)
        for s in swings if s.span_s > 0
    ]  # fmt: skip
    base = swings[0].base_s if swings else 0.0
    source = f"projected on the {hw.name} profile; each figure over the range its provenance allows"
    fig = tornado(bars, base, f"Step time of {heading(layout, workload, hw.name)}", source)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"sensitivity_{layout.strategy}_{workload.seq_len}"
    return save(fig, folder / name)


HINGE_FIGURES = (
    "ring_shift_gbs",
    "gemm_tflops",
    "attention_tflops",
    "overlap_efficiency",
    "collective_8_gbs",
)


def hinge_finder() -> Callable[[Comparison], list[Hinge]]:
    """What the ledger (tspbench.report.ledger) asks of a projected comparison: the break-even
    of each of HINGE_FIGURES (the issue's four, and the 8-GPU collectives TP leans on)."""
    from tspbench.analytic import sensitivity as sens
    from tspbench.analytic.profile_choice import choose_profile
    from tspbench.report.claims import Hinge

    def find(c: Comparison) -> list[Hinge]:
        hw = choose_profile(c.hardware, device="cuda", measured=False).hardware
        keys = {f.key for f in sens.figures(hw)}
        chosen = [sens.figure_named(hw, k) for k in HINGE_FIGURES if k in keys]
        w = Workload(ModelConfig.preset(c.model), c.batch, c.seq_len, c.mode, c.recompute, "bfloat16", "cuda")
        rows = sens.break_evens(layout_text(c.layout), layout_text(c.against), w, hw, chosen)
        return [Hinge(b.figure.key, b.figure.value, b.figure.unit, b.figure.provenance, b.value, b.beyond)
                for b in rows]  # fmt: skip

    return find


def band_finder() -> Callable[[Path], tuple[float, float] | None]:
    """What a projected figure's band (tspbench.report.band) asks of one stored point: its
    tokens/s per GPU with each unmeasured figure of the profile it was priced on at either end of
    its range, one at a time (``sensitivity.band``); None for a point that names no profile."""
    from functools import cache

    from tspbench.analytic import sensitivity as sens
    from tspbench.analytic.profile_choice import named_profile
    from tspbench.sweep.points import Point

    profiles = cache(named_profile)

    def find(run: Path) -> tuple[float, float] | None:
        record = json.loads(read_input_text(run / "result.json"))
        name = record.get("predicted_hardware") or record.get("hardware")
        if not name:
            return None
        point = Point.from_json(json.loads(read_input_text(run / "point.json")))
        found = sens.band(point.layout, point.workload, profiles(name))
        return found.low, found.high

    return find
