"""Arguments the commands share: layout and workload flags, typed values, run options."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from tspbench.core.errors import UsageError
from tspbench.core.names import AXES, RECOMPUTE_MODES
from tspbench.core.spec import PRESETS, Layout, ModelConfig, Workload
from tspbench.core.units import parse_bytes
from tspbench.strategy import available, check_layout


def byte_size(text: str) -> int:
    """'512MiB', '2GB', '1e9' -> bytes, more than zero (an argparse type)."""
    try:
        value = parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return value


def _integer(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _integer(text, 1)


def non_negative_int(text: str) -> int:
    return _integer(text, 0)


def positive_seconds(text: str) -> float:
    """A finite number of seconds above zero (an argparse type): not nan, inf or -5."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
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
    p.add_argument(
        "--decode-tokens",
        type=positive_int,
        help="--mode decode: greedy steps after the prefill of --seq-len context tokens (>= 1)",
    )
    p.add_argument("--seed", type=int, default=0)


def layout_and_workload(args: argparse.Namespace, mode: str, dtype: str) -> tuple[Layout, Workload]:
    overrides = {"vocab_size": args.vocab_size} if args.vocab_size else {}
    config = ModelConfig.preset(args.model, **overrides)
    layout = Layout(args.strategy, **{axis: getattr(args, axis) for axis in AXES})
    device = getattr(args, "device", "cpu")
    decode_tokens = getattr(args, "decode_tokens", None)
    if mode == "decode" and decode_tokens is None:
        raise UsageError("--mode decode needs --decode-tokens N (N >= 1 greedy steps after the prefill)")
    if mode != "decode" and decode_tokens is not None:
        raise UsageError(f"--decode-tokens is for --mode decode only (mode is {mode!r})")
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
        decode_tokens or 0,
    )
    check_layout(layout, workload)
    return layout, workload


def add_common_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--timeout", type=positive_seconds, default=600.0, help="seconds before the world is killed"
    )


def output_path(path: Path, flag: str, folder: bool) -> Path:
    """``path`` if it can be written as a folder (or a file): no file where a folder must be, and
    no folder where the file goes. Checked before any work starts."""
    want, found = ("folder", "file") if folder else ("file", "folder")
    if path.exists() and path.is_dir() != folder:
        raise UsageError(f"{flag} {path}: is a {found}, expected a {want}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{flag} {path}: {parent} is a file, not a folder")
            break
    return path
