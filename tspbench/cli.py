"""The ``tspbench`` command line. Every bad input exits 2 with a message naming what was wrong."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence

from tspbench.mesh import Layout, LayoutError
from tspbench.model import PRESETS, RECOMPUTE_MODES, ModelConfig
from tspbench.optim import DTYPES
from tspbench.strategy import MODES, Workload, available, check_layout

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2."""


def parse_bytes(text: str) -> int:
    """'512MiB', '2GB', '1e9' -> bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]i?B|B)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512MiB, 2GB, 1e9)")
    units = {
        None: 1,
        "B": 1,
        "KB": 1e3,
        "MB": 1e6,
        "GB": 1e9,
        "TB": 1e12,
        "KiB": 2**10,
        "MiB": 2**20,
        "GiB": 2**30,
        "TiB": 2**40,
    }
    return int(float(m.group(1)) * units[m.group(2)])


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_layout_args(p: argparse.ArgumentParser, model_default: str = "tiny") -> None:
    p.add_argument("--strategy", required=True, help=f"one of: {', '.join(available())}")
    for axis in ("dp", "tp", "sp", "tsp"):
        p.add_argument(f"--{axis}", type=positive_int, default=1, help=f"{axis} degree (default 1)")
    p.add_argument("--model", default=model_default, choices=sorted(PRESETS), help="model preset")
    p.add_argument("--vocab-size", type=positive_int, help="override the preset's vocabulary size")
    p.add_argument("--seq-len", type=positive_int, default=512)
    p.add_argument("--batch", type=positive_int, default=1, help="micro-batch per model replica")
    p.add_argument("--recompute", choices=RECOMPUTE_MODES, default="none")
    p.add_argument("--megatron-sp", action="store_true", help="tp, tp_sp: Megatron sequence parallelism")
    p.add_argument("--no-overlap", action="store_true", help="tsp: blocking communication (same math)")
    p.add_argument("--seed", type=int, default=0)


def layout_and_workload(args: argparse.Namespace, mode: str, dtype: str) -> tuple[Layout, Workload]:
    overrides = {"vocab_size": args.vocab_size} if args.vocab_size else {}
    config = ModelConfig.preset(args.model, **overrides)
    layout = Layout(args.strategy, args.dp, args.tp, args.sp, args.tsp)
    device = getattr(args, "device", "cpu")
    workload = Workload(
        config,
        args.batch,
        args.seq_len,
        mode,
        args.recompute,
        dtype,
        device,
        args.seed,
        args.megatron_sp,
        not args.no_overlap,
    )
    check_layout(layout, workload)
    return layout, workload


# ----------------------------------------------------------------------------- subcommands


def cmd_env(args: argparse.Namespace) -> int:
    from tspbench.env import environment

    record = environment()
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        width = max(map(len, record))
        for key, value in record.items():
            print(f"{key:<{width}}  {value}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from tspbench.validate import validate

    modes = ("train", "infer") if args.mode == "both" else (args.mode,)
    layout, workload = layout_and_workload(args, modes[0], args.dtype)
    result = validate(layout, workload, modes, timeout=args.timeout)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_validation(result)
    return 0 if result["passed"] else 1


def print_validation(r: dict) -> None:
    print(
        f"{r['layout']}  world {r['world_size']}  {r['model']}  seq {r['seq_len']}  batch {r['batch']}  "
        f"{r['dtype']}  recompute {r['recompute']}  modes {'+'.join(r['modes'])}"
    )
    print(f"  {'quantity':<20} {'max rel err':>12}   (tolerance {r['tolerance']:.0e})")
    for key, err in r["max_rel_err"].items():
        flag = "ok" if err <= r["tolerance"] else "FAIL"
        print(f"  {key:<20} {err:>12.3e}   {flag}")
    print(
        f"  comm bytes/step      {r['comm_bytes_per_step']:>12,.0f}   analytic count "
        f"{'matches' if r['comm_matches_analytic'] else 'DIFFERS'}"
    )
    per_rank = r["peak_memory_bytes_per_rank"]
    print(f"  peak memory (max)    {r['peak_memory_bytes']:>12,}   per rank {per_rank}")
    print("PASSED" if r["passed"] else f"FAILED (worst gradient: {r['worst_grad_param']})")


def cmd_bench(args: argparse.Namespace) -> int:
    from tspbench.bench import bench

    layout, workload = layout_and_workload(args, args.mode, args.dtype)
    record = bench(
        layout, workload, args.steps, args.warmup, args.repeats, args.capacity, args.timeout, args.hardware
    )
    if args.json:
        print(json.dumps(record, indent=2, default=str))
    else:
        print_record(record)
    return 0 if record["status"] == "completed" else 1


def print_record(r: dict) -> None:
    print(
        f"{r['strategy']}  dp{r['dp']} tp{r['tp']} sp{r['sp']} tsp{r['tsp']}  {r['model']}  "
        f"seq {r['seq_len']}  batch {r['batch']}  {r['mode']}  {r['dtype']}  -> {r['status']}"
    )
    if r["status"] != "completed":
        print(r.get("error") or "")
        return
    print(
        f"  step time     {r['step_time_s'] * 1e3:10.1f} ms  (p10 {r['step_time_p10_s'] * 1e3:.1f}, "
        f"p90 {r['step_time_p90_s'] * 1e3:.1f})"
    )
    print(f"  tokens/s/GPU  {r['tokens_per_s_per_gpu']:10.1f}      TFLOP/s/GPU {r['tflops_per_gpu']:.4f}")
    peak, rank = r["peak_memory_bytes"] / 2**20, r["peak_memory_rank"]
    print(f"  peak memory   {peak:10.2f} MiB (max over ranks, rank {rank})")
    for cat in ("parameters", "gradients", "optimizer", "activations", "other"):
        print(f"    {cat:<12}{r[f'peak_memory_{cat}_bytes'] / 2**20:10.2f} MiB")
    print(f"  comm/step     {r['comm_bytes_per_step'] / 2**20:10.2f} MiB bus bytes (max over ranks)")
    print(
        f"  predicted     peak {r['predicted_peak_memory_bytes'] / 2**20:.2f} MiB "
        f"({r['predicted_memory_error']:+.1%}), comm {r['predicted_comm_bytes_per_step'] / 2**20:.2f} MiB, "
        f"hardware FLOPs {r['predicted_flops_error']:+.2%} vs counted"
    )
    if r.get("predicted_step_time_s"):
        print(f"                step {r['predicted_step_time_s'] * 1e3:.1f} ms on {r['predicted_hardware']}")


def add_common_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the world is killed")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tspbench",
        description="Benchmark transformer parallel layouts (dp, tp, sp, tp_sp, tsp): check them against a "
        "single-device reference, measure them, model them, sweep them locally or on Slurm, and report.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("env", help="print the environment record")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_env)

    p = sub.add_parser("validate", help="check a strategy against the single-device reference")
    add_layout_args(p)
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--mode", choices=(*MODES, "both"), default="both")
    add_common_run_args(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("bench", help="measure one point: step time, throughput, peak memory, comm")
    add_layout_args(p)
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    p.add_argument("--mode", choices=MODES, default="train")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--steps", type=positive_int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=positive_int, default=1)
    p.add_argument("--capacity", type=parse_bytes, help="simulated device memory on CPU, e.g. 512MiB")
    p.add_argument("--hardware", default="cpu", help="profile for the predicted step time (default: cpu)")
    add_common_run_args(p)
    p.set_defaults(func=cmd_bench)

    from tspbench.analytic_cli import add_commands as add_analytic_commands
    from tspbench.sweep import add_commands  # run, status: handlers live in tspbench.sweep

    add_analytic_commands(sub)  # predict, plan, calibrate
    add_commands(sub)
    from tspbench.report import add_command as add_report_command

    add_report_command(sub)  # report: handler in tspbench.report
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (LayoutError, UsageError, FileNotFoundError) as exc:
        print(f"tspbench {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
