"""Arguments the commands share: layout and workload flags, typed values, run options."""

from __future__ import annotations

import argparse

from tspbench.core.names import AXES, RECOMPUTE_MODES
from tspbench.core.spec import PRESETS, Layout, ModelConfig, Workload
from tspbench.core.units import parse_bytes
from tspbench.strategy import available, check_layout


def byte_size(text: str) -> int:
    """'512MiB', '2GB', '1e9' -> bytes (an argparse type)."""
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    for axis in AXES:
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
    layout = Layout(args.strategy, **{axis: getattr(args, axis) for axis in AXES})
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


def add_common_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the world is killed")
