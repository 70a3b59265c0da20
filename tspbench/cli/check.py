"""``tspbench check NAME``: the models' checks (tspbench.checks), each writing its results folder.

Every check is a subcommand with its own flags (``tspbench check NAME --help``); their defaults
write where the stored results live, so running one again regenerates its files in results/.
An unknown NAME is one line naming the allowed ones, exit 2. The checks' modules return data
and write files; the flags and what is printed are here.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from pathlib import Path

from tspbench.analytic.profile_choice import named_profile
from tspbench.cli import backtest
from tspbench.cli.args import bounded_int, cpu_ranks, output_path, positive_int
from tspbench.core.errors import UsageError
from tspbench.core.files import check_suffix
from tspbench.core.spec import CPU_MAX_SEQ_LEN, PRESETS

TIMELINE_CHECK = Path("results/timeline_check")
GPU_RESULTS = Path("results/h200")


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="run one of the models' checks (backtest, timeline, overlap, ...): each writes its results",
        description="Run one of the models' checks; each writes its results folder (defaults: results/).",
    )
    checks = p.add_subparsers(dest="check", metavar="NAME", required=True, title="checks")
    for name, (what, arguments, func) in CHECKS.items():
        c = checks.add_parser(name, help=what, description=what)
        arguments(c)
        c.set_defaults(func=func)


def _timeline_ops_args(c: argparse.ArgumentParser) -> None:
    c.add_argument("--hardware", default="cpu", help="profile the replay is priced on (default: cpu)")
    c.add_argument(  # the small preset at world size 4: what it serves, one token a rank at least
        "--seq-len",
        type=bounded_int(4, CPU_MAX_SEQ_LEN, "tokens"),
        default=2048,
        help="tokens per step (default: 2048)",
    )
    c.add_argument("--repeats", type=positive_int, default=3, help="profiled steps per rank (default: 3)")
    c.add_argument("--runs", type=positive_int, default=2, help="launches per layout (their spread is shown)")
    c.add_argument("--reprice", action="store_true", help="replay the stored traces; measure nothing")
    c.add_argument("--out", type=Path, default=TIMELINE_CHECK, help=f"folder (default: {TIMELINE_CHECK})")
    c.add_argument("--calibrate", type=Path, help="calibrate a profile here first; price with it")


def _torch_estimator_args(c: argparse.ArgumentParser) -> None:
    c.add_argument("--hardware", default="h100", help="profile whose peaks both price at (default: h100)")
    c.add_argument(  # 7b cut to 2 layers: the positions 7b serves
        "--seq-len",
        type=bounded_int(1, PRESETS["7b"].max_seq_len, "tokens"),
        default=8192,
        help="tokens per step (default: 8192)",
    )
    c.add_argument("--out", type=Path, default=TIMELINE_CHECK, help=f"folder (default: {TIMELINE_CHECK})")


def _overlap_args(c: argparse.ArgumentParser) -> None:
    c.add_argument("--rounds", type=positive_int, default=15, help="rounds of every variant (default: 15)")
    c.add_argument(  # a world of 1 has no traffic to hide: its 'hidden' share means nothing
        "--worlds",
        type=bounded_int(2, 64, "ranks"),
        nargs="+",
        default=[2, 4],
        help="world sizes (default 2 4)",
    )
    c.add_argument("--hardware", default="cpu", help="profile whose overlap_efficiency to compare")
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    c.add_argument("--out", type=Path, help="also write the result here (JSON)")


def _trace_cost_args(c: argparse.ArgumentParser) -> None:
    c.add_argument("--rounds", type=positive_int, default=2, help="untraced and traced runs (default: 2)")
    c.add_argument("--out", type=Path, default=TIMELINE_CHECK / "trace_cost.json", help="file (JSON)")


def _tsp_prefetch_args(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "folder", type=Path, nargs="?", default=TIMELINE_CHECK / "tsp_prefetch",
        help="holds before/ and after/ (result.json, trace.npz); gets gantt.png and summary.json",
    )  # fmt: skip


def _host_drift_args(c: argparse.ArgumentParser) -> None:
    c.add_argument("--previous", required=True, help="git revision of the previous measurement")
    c.add_argument("--strategies", nargs="+", required=True, help="strategies whose code did not change")
    c.add_argument("--as-measured", type=Path, required=True, help="records before re-pricing")
    c.add_argument("--out", type=Path, default=TIMELINE_CHECK / "host_drift.json", help="file (JSON)")


def _reprice_args(c: argparse.ArgumentParser) -> None:
    c.add_argument("folders", type=Path, nargs="+", help="experiment folders (results/<experiment>)")
    c.add_argument("--predictions", action="store_true", help="also the analytic model's fields")


def cmd_timeline_ops(args: argparse.Namespace) -> int:
    from tspbench.checks import timeline_ops

    out = output_path(args.out, "--out", folder=True)
    hardware = args.hardware
    if args.reprice:
        rows = timeline_ops.reprice(out, named_profile(hardware))
    else:
        if args.calibrate:  # where the profile goes, checked before minutes of calibrating (#45)
            check_suffix(
                output_path(args.calibrate, "--calibrate", folder=False), "--calibrate", (".yaml", ".yml")
            )
            if (
                args.calibrate.exists() and not args.calibrate.is_file()
            ):  # /dev/zero: read back as the profile
                raise UsageError(
                    f"--calibrate {args.calibrate}: not a regular file (the profile is read back)"
                )
            timeline_ops.calibrate(args.calibrate, args.seq_len)
            hardware = str(args.calibrate)
        say = functools.partial(print, flush=True)
        hw = named_profile(hardware)
        rows = timeline_ops.measure(out, hw, args.seq_len, args.repeats, args.runs, say)
    print(timeline_ops.write(out, hardware, rows))
    return 0


def cmd_torch_estimator(args: argparse.Namespace) -> int:
    from tspbench.checks.torch_estimator import torch_estimator

    out = output_path(args.out, "--out", folder=True)
    print(json.dumps(torch_estimator(out, named_profile(args.hardware), args.seq_len), indent=2))
    return 0


def cmd_overlap(args: argparse.Namespace) -> int:
    from tspbench.checks.overlap import overlap

    out = None if args.out is None else output_path(args.out, "--out", folder=False)
    cpu_ranks("--worlds", max(args.worlds))
    uneven = [w for w in args.worlds if w & (w - 1)]
    if uneven:  # the study's layers (hidden 512, MLP 3 x 2048) split evenly over a power of two
        raise UsageError(f"--worlds {uneven[0]}: each world must be a power of two (2, 4, 8, ...)")
    result = overlap(tuple(args.worlds), args.rounds, named_profile(args.hardware), out)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    assumed = result["assumed_overlap_efficiency"]
    print(f"model assumes {assumed:.0%} of overlapped traffic hidden ({args.hardware} profile); medians, ms")
    print(f"{'layer':<6}{'world':>6}{'overlap':>10}{'blocking':>10}{'compute':>10}{'comm':>10}{'hidden':>9}")
    for r in result["rows"]:
        print(f"{r['kind']:<6}{r['world']:>6}{r['overlap_ms']:>10.1f}{r['blocking_ms']:>10.1f}"
              f"{r['compute_ms']:>10.1f}{r['comm_ms']:>10.1f}{r['hidden_fraction']:>9.0%}")  # fmt: skip
    return 0


def cmd_trace_cost(args: argparse.Namespace) -> int:
    from tspbench.checks.trace_cost import trace_cost

    out = output_path(args.out, "--out", folder=False)
    print(json.dumps(trace_cost(out, args.rounds), indent=2))
    return 0


def cmd_tsp_prefetch(args: argparse.Namespace) -> int:
    from tspbench.checks.tsp_prefetch import tsp_prefetch

    if not args.folder.is_dir():
        raise UsageError(f"{args.folder}: not a folder (it holds before/ and after/)")
    print(json.dumps(tsp_prefetch(args.folder), indent=2))
    return 0


def cmd_host_drift(args: argparse.Namespace) -> int:
    from tspbench.checks.host_drift import host_drift

    out = output_path(args.out, "--out", folder=False)
    result = host_drift(args.previous, args.strategies, args.as_measured, out)
    print(f"{out}: {result['points']} points, median ratio {result['median_ratio']:.3f}")
    return 0


def cmd_reprice(args: argparse.Namespace) -> int:
    from tspbench.sweep.reprice import reprice_study

    for folder in args.folders:
        print(f"{folder}: {reprice_study(folder, args.predictions)} records re-priced")
    return 0


def _gpu_points_args(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "root",
        type=Path,
        nargs="?",
        default=GPU_RESULTS,
        help=f"runs on one GPU kind (default: {GPU_RESULTS})",
    )
    c.add_argument(
        "--hardware", default="h200", help="the shipped profile scored out of sample (default: h200)"
    )
    c.add_argument("--out", type=Path, help="folder for scores.csv and scores.md (default: the root)")


def cmd_gpu_points(args: argparse.Namespace) -> int:
    from tspbench.analytic.profile_choice import named_profile
    from tspbench.checks import gpu_op_kinds as op_kinds
    from tspbench.checks.gpu_points import score, scores_table, write_scores

    if not args.root.is_dir():
        raise UsageError(f"{args.root}: not a folder of GPU runs (results/<gpu>)")
    shipped = named_profile(args.hardware)
    rows, by_kind = score(args.root, shipped), op_kinds.score(args.root, shipped)
    if not rows and not by_kind.kinds:  # nothing to score: no empty tables written (#45)
        raise UsageError(f"{args.root}: holds no GPU runs (results/<gpu>/<run>/bench/*.json, gpu_check/)")
    print(scores_table(rows), end="")
    written = write_scores(rows, args.out or args.root)
    if by_kind.kinds:
        print(op_kinds.table(by_kind.kinds), end="")
        written += op_kinds.write_scores(by_kind, args.out or args.root)
    for path in written:
        print(f"wrote {path}")
    return 0


Arguments = Callable[[argparse.ArgumentParser], None]
Command = Callable[[argparse.Namespace], int]
# name -> (what it checks and writes, its flags, what runs it), in the order --help lists them
CHECKS: dict[str, tuple[str, Arguments, Command]] = {
    "backtest": (backtest.HELP + " (results/published/)", backtest.add_arguments, backtest.cmd_backtest),
    "timeline-ops": (
        "op level: replayed compute by kind against torch.profiler, every strategy at world size 4 "
        f"({TIMELINE_CHECK}/ops.json, ops.md)", _timeline_ops_args, cmd_timeline_ops,
    ),
    "torch-estimator": (
        f"the timeline against torch's RuntimeEstimator on the same fake step ({TIMELINE_CHECK}/"
        "torch_estimator.json)", _torch_estimator_args, cmd_torch_estimator,
    ),
    "overlap": (
        "how much of TSP's weight traffic hides behind its GEMMs at world size 2 and 4, measured "
        "(printed; --out writes it)", _overlap_args, cmd_overlap,
    ),
    "trace-cost": (
        "what tracing a fake-world step costs, and how fast the timeline replays it "
        f"({TIMELINE_CHECK}/trace_cost.json)", _trace_cost_args, cmd_trace_cost,
    ),
    "tsp-prefetch": (
        "TSP's first broadcast of each attention pass before and after its prefetch, the stored "
        f"traces replayed ({TIMELINE_CHECK}/tsp_prefetch/gantt.png, summary.json)", _tsp_prefetch_args,
        cmd_tsp_prefetch,
    ),
    "host-drift": (
        "how much this host's speed moved between two measurements of results/cpu_reference "
        f"({TIMELINE_CHECK}/host_drift.json)", _host_drift_args, cmd_host_drift,
    ),
    "gpu-points": (
        "every committed GPU measurement scored by the analytic model and the timeline on the shipped "
        f"profile and on its run's own calibration ({GPU_RESULTS}/scores.csv, scores.md), and each op_kinds "
        f"probe's device time by kind against the replayed step (op_scores.csv, op_scores.md)",
        _gpu_points_args, cmd_gpu_points,
    ),
    "reprice": (
        "stored records re-priced in place from their kept traces (the timeline; --predictions: the "
        "analytic model too)", _reprice_args, cmd_reprice,
    ),
}  # fmt: skip
