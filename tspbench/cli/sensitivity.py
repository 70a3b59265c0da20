"""``tspbench sensitivity``: which profile figures a projected step time rests on, and where the
faster of two layouts changes (tspbench.analytic.sensitivity).

    tspbench sensitivity --model 7b --seq-len 16384 --recompute selective --hardware mi300x \\
        --layout tsp:8 --against tp:8 --against tp_sp:2x4 [--figure ring_shift_gbs] [--plot DIR]

A layout is ``strategy:degrees``, the degrees in the order of the strategy's own axes as its
name lists them (``tp_sp:2x4`` is TP 2 x SP 4; ``fsdp_sp:8`` shards over 8 sp ranks), with an
optional data-parallel degree after a comma (``tsp:8,dp4``), and runs the workload the flags
give. Or it is a stored point's folder (``results/<study>/<run id>``), which brings its own
workload and settings: each layout at its best setting against another at its own.

    tspbench sensitivity --layout results/paper_throughput/<run id> \\
        --against results/paper_throughput/<run id>
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
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
        "--layout",
        required=True,
        type=side_text,
        help="the layout: strategy:degrees, e.g. tsp:8, or a stored point's folder (its workload with it)",
    )
    p.add_argument(
        "--against", action="append", type=side_text, default=[], help="a layout to compare (repeatable)"
    )
    p.add_argument("--model", default="7b", choices=sorted(PRESETS), help="model preset (default 7b)")
    p.add_argument("--vocab-size", type=vocab_size, help="override the preset's vocabulary size")
    p.add_argument("--seq-len", type=positive_int, help="tokens per sequence (for a strategy:degrees layout)")
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


@dataclass(frozen=True)
class Side:
    """One layout the command prices: with a stored point's own workload, or (None) the flags'."""

    layout: Layout
    workload: Workload | None = None
    name: str = ""

    def describe(self) -> str:
        return self.name or self.layout.describe()


def side_text(text: str) -> Side:
    """'tsp:8' -> its layout; a stored point's folder -> its layout, workload and settings (an
    argparse type)."""
    folder = Path(text)
    if not (folder / "point.json").is_file():
        if folder.is_dir() or "/" in text:
            raise argparse.ArgumentTypeError(
                f"{text!r}: no point.json there (a stored point's folder has one)"
            )
        return Side(layout_text(text))
    from tspbench.sweep.points import Point, describe

    try:
        point = Point.from_json(json.loads(read_input_text(folder / "point.json")))
        return Side(point.layout, point.workload, describe(point.config).split(" seq ")[0])
    except (KeyError, TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"{folder / 'point.json'}: not a stored point ({exc})") from None


def cmd_sensitivity(args: argparse.Namespace) -> int:
    from tspbench.analytic import sensitivity as sens  # the model: only when it runs
    from tspbench.analytic.profile_choice import choose_profile
    from tspbench.strategy import check_layout

    sides = [args.layout, *args.against]
    flags = flag_workload(args) if any(s.workload is None for s in sides) else None
    loads = {s: s.workload or flags for s in sides}
    for side, workload in loads.items():
        check_layout(side.layout, workload)
    hw = choose_profile(args.hardware, device="cuda", measured=False).hardware
    try:
        chosen = [sens.figure_named(hw, key) for key in args.figure]
    except ValueError as exc:
        raise UsageError(f"--figure: {exc}") from None
    plot = output_path(args.plot, "--plot", folder=True) if args.plot else None
    mine, workload = args.layout, loads[args.layout]
    swings = sens.swings(mine.layout, workload, hw, chosen)
    evens = {b: sens.break_evens(mine.layout, b.layout, workload, hw, chosen, loads[b]) for b in args.against}
    if args.json:
        print(json.dumps(as_json(mine, workload, hw, swings, evens), indent=2))
    else:
        print_study(mine, workload, hw, swings, evens)
    if plot:
        for path in draw(mine.layout, workload, hw, swings, plot):
            print(f"tornado: {path}")
    return 0


def flag_workload(args: argparse.Namespace) -> Workload:
    """The workload the flags give, for a layout given as strategy:degrees."""
    if args.seq_len is None:
        raise UsageError(
            "--seq-len: required for a layout given as strategy:degrees (a stored point brings its own)"
        )
    problem = recompute_problem(args.recompute, (args.mode,))
    if problem:
        raise UsageError(f"--recompute {args.recompute} with --mode {args.mode}: {problem}")
    config = ModelConfig.preset(args.model, **({"vocab_size": args.vocab_size} if args.vocab_size else {}))
    workload = Workload(config, args.batch, args.seq_len, args.mode, args.recompute, args.dtype, "cuda")
    within_model("--seq-len", workload.seq_len, config)
    return workload


def heading(layout: Layout | Side, workload: Workload, hw_name: str) -> str:
    w = workload
    rec = f", recompute {w.recompute}" if w.mode == "train" else ""
    return (
        f"{layout.describe()}  {w.model.name}  {w.seq_len:,} tokens  batch {w.batch}  {w.mode}{rec}  "
        f"on {hw_name}, projected"
    )


def number(value: float) -> str:
    """A figure's value at 3 significant digits, no exponent for the ranges a profile has."""
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"


def print_study(layout: Side, workload: Workload, hw, swings: list, evens: dict) -> None:
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
            f"\nagainst {against_name(other, workload)}: {layout.describe()} at {rows[0].ratio:.3f}x its "
            f"speed ({faster.describe()} faster); break-even of each figure, the rest held:"
        )
        for b in rows:
            print(f"  {b.figure.key:<28} {break_even_text(b)}")


def against_name(other: Side, workload: Workload) -> str:
    """The other layout's name, with its recomputation where it runs its own (a stored point's)."""
    w = other.workload
    own = w is not None and w.mode == "train" and w.recompute != workload.recompute
    return f"{other.describe()} at recompute {w.recompute}" if own else other.describe()


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


def as_json(layout: Side, workload: Workload, hw, swings: list, evens: dict) -> dict[str, object]:
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
            against_name(other, workload): [
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
