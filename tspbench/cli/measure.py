"""``tspbench env``, ``validate``, ``bench`` and ``gpu-check``: measuring, and printing what was measured."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tspbench.analytic.profile_choice import HardwareChoice, choose_profile
from tspbench.cli.args import (
    STEPS_HELP,
    add_common_run_args,
    add_layout_args,
    byte_size,
    layout_and_workload,
    non_negative_int,
    output_path,
    positive_int,
    positive_seconds,
)
from tspbench.cli.bench_text import print_record
from tspbench.cli.terminal import progress_for
from tspbench.core.errors import UsageError
from tspbench.core.files import check_suffix
from tspbench.core.names import DEVICES, DTYPES, MODES
from tspbench.core.spec import Layout, Workload
from tspbench.core.units import format_bytes

TRACE_SUFFIXES = (".npz", ".json", ".json.gz")  # the raw traces, or a Chrome trace of their replay


def add_commands(sub: argparse._SubParsersAction) -> None:
    """``env``, ``validate``, ``bench`` and ``gpu-check``: one function each, so a command's flags
    read together."""
    p = sub.add_parser("env", help="print the environment record")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_env)
    add_validate(sub.add_parser("validate", help="check a strategy against the single-device reference"))
    add_bench(sub.add_parser("bench", help="measure one point: step time, throughput, peak memory, comm"))
    add_gpu_check(
        sub.add_parser(
            "gpu-check",
            help="every GPU-only path on every GPU of this node, a record per check (make gpu-check)",
            description="Every path only a GPU exercises, on every GPU of this node: attention accuracy "
            "and speed, calibrate, validate and memory per strategy, inference memory, step time, "
            "decode against its floor, op-level time by kind. Each check's record is written when it "
            "ends; docs/measuring.md says what each row asserts.",
        )
    )


def add_validate(p: argparse.ArgumentParser) -> None:
    """``tspbench validate``: a layout, the dtype both sides run in, and the steps checked."""
    add_layout_args(p)
    p.add_argument(
        "--dtype",
        choices=("float64", "float32"),
        default="float64",
        help="what the strategy and the reference both run in (default float64)",
    )
    p.add_argument(
        "--mode",
        choices=(*MODES, "both"),
        default="both",
        help=f"the step checked: {STEPS_HELP}, or both: train and infer (default)",
    )
    add_common_run_args(p)
    p.set_defaults(func=cmd_validate)


def add_bench(p: argparse.ArgumentParser) -> None:
    """``tspbench bench``: a layout and its step, measured for real or executed under --fake."""
    add_layout_args(p)
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="dtype of parameters, activations and messages (default float32: bench measures on CPU "
        "unless told otherwise, where float32 is native; predict prices GPUs, so defaults to bfloat16)",
    )
    p.add_argument("--mode", choices=MODES, default="train", help=f"the step: {STEPS_HELP} (default train)")
    p.add_argument("--device", choices=DEVICES, help="default cpu; with --fake, cuda (simulated)")
    p.add_argument(
        "--fake",
        action="store_true",
        help="execute the step under fake tensors and a fake process group of the full world size: "
        "exact memory, comm and FLOPs of any layout with no GPU and no memory, no step time",
    )
    p.add_argument(
        "--fake-ranks",
        type=rank_list,
        help="--fake: the ranks to execute, e.g. 0 or 0,3 (default: the first model-parallel group)",
    )
    p.add_argument("--steps", type=positive_int, help="timed steps (default 5; not with --fake)")
    p.add_argument("--warmup", type=non_negative_int, help="untimed steps first (default 2; not with --fake)")
    p.add_argument("--repeats", type=positive_int, help="timed repeats (default 1; not with --fake)")
    p.add_argument("--capacity", type=byte_size, help="simulated device memory on CPU, e.g. 512MiB")
    p.add_argument(
        "--hardware",
        help="profile the model, the timeline and MFU price the step on (default: the device's: cpu, "
        "or the GPU's by its name; with --fake, mi300x for a simulated GPU)",
    )
    p.add_argument(
        "--trace",
        type=Path,
        help="write the traced step: a Chrome/Perfetto trace (.json, .json.gz) of its replay, one "
        "track per rank and lane, or the raw traces (.npz) to replay on another profile",
    )
    p.add_argument(
        "--eager-decode",
        action="store_true",
        help="decode on CUDA: run every step eagerly (default: replay each step as a captured CUDA graph)",
    )
    add_common_run_args(p)
    p.set_defaults(func=cmd_bench)


def add_gpu_check(p: argparse.ArgumentParser) -> None:
    """``tspbench gpu-check``: where its records go, and which strategies and checks run."""
    p.add_argument(
        "--out",
        type=Path,
        default=Path("results/gpu_check"),
        help="records folder (default results/gpu_check)",
    )
    p.add_argument(
        "--device",
        choices=DEVICES,
        default="cuda",
        help="cuda (default), or cpu with --quick for a smoke run",
    )
    p.add_argument("--quick", action="store_true", help="tiny model (CPU smoke runs: 2 gloo ranks)")
    p.add_argument("--strategies", help="comma-separated: check only these (default: every one)")
    p.add_argument(
        "--checks",
        help="comma-separated groups of rows to run (default: all): attention, calibrate, speed, "
        "validate, overlap, memory, step, decode, ops; calibrate joins any group priced on its profile",
    )
    p.add_argument(
        "--check-seconds",
        type=positive_seconds,  # finite and bounded: setitimer takes no inf (#45)
        default=900.0,
        help="a check still running after this many seconds is a failed row (default 900)",
    )
    p.set_defaults(func=cmd_gpu_check)


def cmd_env(args: argparse.Namespace) -> int:
    from tspbench.measure.env import environment

    record = environment()
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        width = max(map(len, record))
        for key, value in record.items():
            print(f"{key:<{width}}  {value}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    modes = ("train", "infer") if args.mode == "both" else (args.mode,)
    layout, workload = layout_and_workload(args, modes[0], args.dtype, modes, starts_ranks=True)
    from tspbench.measure.validate import validate  # torch: after the flags are checked

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
        f"  comm bytes/step      {format_bytes(r['comm_bytes_per_step']):>12}   analytic count "
        f"{'matches' if r['comm_matches_analytic'] else 'DIFFERS'}, dispatch count "
        f"{'matches' if r['comm_matches_dispatch'] else 'DIFFERS'}"
    )
    per_rank = ", ".join(map(format_bytes, r["peak_memory_bytes_per_rank"]))
    print(f"  peak memory (max)    {format_bytes(r['peak_memory_bytes']):>12}   per rank {per_rank}")
    print("PASSED" if r["passed"] else f"FAILED (worst gradient: {r['worst_grad_param']})")


def rank_list(text: str) -> list[int]:
    try:
        ranks = [int(r) for r in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of ranks: {text!r}") from None
    if any(r < 0 for r in ranks):
        raise argparse.ArgumentTypeError(f"ranks must be >= 0, got {text!r}")
    return ranks


def cmd_bench(args: argparse.Namespace) -> int:
    args.device = args.device or ("cuda" if args.fake else "cpu")
    if args.fake_ranks is not None and not args.fake:
        raise UsageError("--fake-ranks needs --fake")
    layout, workload = layout_and_workload(args, args.mode, args.dtype, starts_ranks=True)
    if args.trace is not None:
        output_path(args.trace, "--trace", folder=False)
        check_suffix(args.trace, "--trace", TRACE_SUFFIXES)
        if workload.mode == "decode":
            raise UsageError("--trace: a decode run is not traced (train and infer steps are)")
    if args.fake:
        check_fake_args(args, layout)
    hardware = bench_profile(args, workload)
    if args.fake:
        record = bench_fake(args, layout, workload, hardware)
    else:
        from tspbench.measure.bench import bench

        record = bench(
            layout,
            workload,
            hardware,
            5 if args.steps is None else args.steps,
            2 if args.warmup is None else args.warmup,
            1 if args.repeats is None else args.repeats,
            args.capacity,
            args.timeout,
            args.trace,
            decode_graphs=decode_graphs_arg(args, workload),
        )
    if args.json:
        print(json.dumps(record, indent=2, default=str))
    else:
        print_record(record)
    if record.get("trace_error"):  # printed after the record: the measurement is not lost
        raise UsageError(f"--trace: {record['trace_error']}")
    return 0 if record["status"] == "completed" else 1


def bench_profile(args: argparse.Namespace, workload: Workload) -> HardwareChoice:
    """The point's one profile (tspbench.analytic.profile_choice): --hardware, else the device's
    (a measured GPU's by its name; a fake world's simulated GPU: the paper's MI300X)."""
    from tspbench.measure.env import device_name

    measured = not args.fake
    name = device_name(workload.device) if measured and not args.hardware else ""
    return choose_profile(args.hardware, device=workload.device, device_name=name, measured=measured)


def decode_graphs_arg(args: argparse.Namespace, workload) -> bool | None:
    """--eager-decode: refused where no step would be graphed (not decode on CUDA)."""
    if not args.eager_decode:
        return None
    if workload.mode != "decode" or workload.device != "cuda":
        raise UsageError(
            "--eager-decode: only decode on CUDA replays CUDA graphs (use --mode decode --device cuda)"
        )
    return False


def check_fake_args(args: argparse.Namespace, layout: Layout) -> None:
    """The fake world executes one step per rank and times nothing: flags that would change
    nothing are refused, and so are ranks outside the world or named twice."""
    given = [f"--{name}" for name in ("steps", "warmup", "repeats") if getattr(args, name) is not None]
    if given:
        raise UsageError(
            f"{', '.join(given)}: the fake world executes one step per rank and times nothing; "
            "drop them with --fake (they set what a real run measures)"
        )
    ranks = args.fake_ranks or []
    bad = [r for r in ranks if r >= layout.world_size]
    if bad:
        raise UsageError(
            f"--fake-ranks {bad}: the world of {layout.describe()} has {layout.world_size} ranks"
        )
    twice = sorted({r for r in ranks if ranks.count(r) > 1})
    if twice:
        raise UsageError(f"--fake-ranks: rank(s) {twice} named more than once; name each rank once")


def bench_fake(
    args: argparse.Namespace, layout: Layout, workload: Workload, hardware: HardwareChoice
) -> dict:
    """``bench --fake``: its ranks run one after another (a 7B rank takes about a minute), so a
    bar (or a line per rank) on stderr says how far it is; stdout keeps the record alone."""
    from tspbench.dist.fake_world import FakeWorld
    from tspbench.measure.fake import default_workers, fake_bench, model_parallel_ranks
    from tspbench.measure.fake_cuda import preload_env

    ranks = args.fake_ranks if args.fake_ranks is not None else model_parallel_ranks(layout)
    progress = progress_for(sys.stderr)
    try:
        with FakeWorld(default_workers(ranks), preload_env(workload.device), progress) as world:
            return fake_bench(
                layout,
                workload,
                hardware,
                args.capacity,
                args.timeout,
                args.fake_ranks,
                world,
                args.trace,
            )
    finally:
        progress.close()


def cmd_gpu_check(args: argparse.Namespace) -> int:
    """Every bad input is a UsageError (one ``tspbench gpu-check: error:`` line, exit 2), found
    before the minutes of calibration and measuring start."""
    import torch

    from tspbench.checks.gpu_check import CHECK_GROUPS, run
    from tspbench.strategy import available

    output_path(args.out, "--out", folder=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device here; use --device cpu --quick for a smoke run")
    strategies = available() if args.strategies is None else args.strategies.split(",")
    unknown = [s for s in strategies if s not in available()]
    if unknown or not strategies:
        raise UsageError(f"--strategies {args.strategies!r}: choose from {', '.join(available())}")
    if not args.check_seconds > 0:
        raise UsageError(f"--check-seconds {args.check_seconds:g}: must be > 0")
    groups = None if args.checks is None else args.checks.split(",")
    if groups is not None and (not groups or any(g not in CHECK_GROUPS for g in groups)):
        raise UsageError(f"--checks {args.checks!r}: choose from {', '.join(CHECK_GROUPS)}")
    summary = run(args.device, args.quick, args.out, strategies, args.check_seconds, groups)
    width = max(len(c["name"]) for c in summary["checks"])
    print(f"gpu-check on {summary['device']}, {summary['world']} rank(s), {summary['seconds']:.0f} s")
    for c in summary["checks"]:
        print(f"  {c['name']:<{width}}  {c['status']:<8}  {c['summary']}")
    print(f"records: {summary['path']}")
    return 1 if any(c["status"] == "failed" for c in summary["checks"]) else 0
