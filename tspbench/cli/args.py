"""Arguments the commands share: layout and workload flags, typed values, run options."""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from tspbench.core.bounds import (
    MAX_CAPACITY_BYTES,
    MAX_COUNT,
    MAX_GPUS,
    MAX_SECONDS,
    MAX_VOCAB,
    bound_problem,
    max_cpu_ranks,
)
from tspbench.core.errors import UsageError
from tspbench.core.files import name_problem
from tspbench.core.names import AXES, RECOMPUTE_MODES, STRATEGIES
from tspbench.core.spec import (
    KV_EXCHANGES,
    MLP_EXCHANGES,
    PRESETS,
    SEED_RANGE,
    Layout,
    ModelConfig,
    Workload,
    recompute_problem,
)
from tspbench.core.units import parse_bytes


def byte_size(text: str) -> int:
    """'512MiB', '2GB', '1e9' -> bytes, 1 to MAX_CAPACITY_BYTES (an argparse type)."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r} (a size cannot be negative)")
    try:
        value = parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    problem = bound_problem(value, 1, MAX_CAPACITY_BYTES, "bytes")
    if problem:
        raise argparse.ArgumentTypeError(f"{problem} ({text!r})")
    return value


def bounded_int(low: int, high: int = MAX_COUNT, unit: str = "") -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]. Every integer flag is one of these, so none
    takes 1e400, 10^5000 digits or a count past what the work can allocate or a C call takes."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!r}") from None
        problem = bound_problem(value, low, high, unit)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = "integer"  # argparse names the type in its message
    return parse


def bounded_float(low: float, high: float, unit: str = "", low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high] (``low_open``: above ``low``); never nan,
    inf or 1e400 (which float() reads as inf)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
        of, above, units = (f" of {unit}" if unit else ""), (">" if low_open else ">="), f" {unit}".rstrip()
        if not math.isfinite(value) or value < low or (low_open and value == low):
            raise argparse.ArgumentTypeError(f"must be a finite number{of} {above} {low:g}, got {text!r}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high:,.0f}{units}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


positive_int = bounded_int(1)
non_negative_int = bounded_int(0)
vocab_size = bounded_int(1, MAX_VOCAB, "rows")
positive_seconds = bounded_float(0.0, MAX_SECONDS, "seconds", low_open=True)
# plan prices all the layouts of MAX_GPUS in ~40 s: checked before every layout is enumerated
gpu_count = bounded_int(1, MAX_GPUS, "GPUs")


def cpu_ranks(flag: str, ranks: int) -> None:
    """CPU ranks are processes on this host: at most ``max_cpu_ranks()`` (4 per core), else one
    line before any starts."""
    most = max_cpu_ranks()
    if ranks > most:
        raise UsageError(
            f"{flag}: {ranks} CPU ranks are {ranks} processes; this host ({os.cpu_count()} cores) "
            f"starts at most {most}"
        )


def within_model(flag: str, tokens: int, model: ModelConfig, what: str = "") -> None:
    """``tokens`` positions fit in what ``model`` serves (its max_seq_len), else one line."""
    if tokens > model.max_seq_len:
        raise UsageError(
            f"{flag}: {what or tokens} is more than the {model.max_seq_len:,} positions {model.name} serves"
        )


def seed(text: str) -> int:
    """An integer torch's generators accept as a seed (an argparse type): checked here, not
    inside the ranks after they have started."""
    low, high = SEED_RANGE
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(
            f"must be in [{low}, {high}] (what torch's generators take), got {value}"
        )
    return value


STEPS_HELP = (
    "train (forward, backward, optimizer), infer (one forward over the sequence, a prefill), decode "
    "(prefill, then --decode-tokens greedy steps)"
)
RECOMPUTE_HELP = (
    "activations recomputed in backward, train only: none (every one kept; default), selective "
    "(the attention core), op (torchtitan's per-op policy: every other GEMM output and the "
    "attention outputs kept, the rest again), full (each block again from its input)"
)


def add_layout_args(p: argparse.ArgumentParser, model_default: str = "tiny") -> None:
    p.add_argument("--strategy", required=True, help=f"one of: {', '.join(STRATEGIES)} (or a plugin's)")
    for axis in AXES:
        p.add_argument(f"--{axis}", type=positive_int, default=1, help=f"{axis} degree (default 1)")
    preset = f"model preset (default {model_default})"
    p.add_argument("--model", default=model_default, choices=sorted(PRESETS), help=preset)
    p.add_argument("--vocab-size", type=vocab_size, help="override the preset's vocabulary size")
    p.add_argument("--seq-len", type=positive_int, default=512, help="tokens per sequence (default 512)")
    p.add_argument("--batch", type=positive_int, default=1, help="micro-batch per model replica")
    p.add_argument("--recompute", choices=RECOMPUTE_MODES, default="none", help=RECOMPUTE_HELP)
    p.add_argument("--megatron-sp", action="store_true", help="tp, tp_sp: Megatron sequence parallelism")
    p.add_argument("--no-overlap", action="store_true", help="tsp: blocking communication (same math)")
    p.add_argument(
        "--kv-exchange",
        choices=KV_EXCHANGES,
        default="allgather",
        help="sp, fsdp_sp, tp_sp: how the sequence axis shares K/V: allgather (default), ring, ulysses",
    )
    p.add_argument(
        "--mlp-exchange",
        choices=MLP_EXCHANGES,
        default="ring",
        help="tsp: how the MLP's weight shards move: ring (default, the paper's) or broadcast by owner",
    )
    p.add_argument(
        "--decode-tokens",
        type=positive_int,
        help="--mode decode: greedy steps after the prefill of --seq-len context tokens (>= 1)",
    )
    p.add_argument("--seed", type=seed, default=0, help="seed of the weights and the batch (default 0)")


def check_modes(args: argparse.Namespace, modes: tuple[str, ...]) -> None:
    """The flags that only some modes use, against the ``modes`` that ``--mode`` runs."""
    decode_tokens = getattr(args, "decode_tokens", None)
    if "decode" in modes and decode_tokens is None:
        raise UsageError("--mode decode needs --decode-tokens N (N >= 1 greedy steps after the prefill)")
    if "decode" not in modes and decode_tokens is not None:
        runs = f" (it runs {' and '.join(modes)})" if len(modes) > 1 else ""
        raise UsageError(f"--decode-tokens is for --mode decode only, not --mode {args.mode}{runs}")
    problem = recompute_problem(args.recompute, modes)
    if problem:
        raise UsageError(f"--recompute {args.recompute} with --mode {args.mode}: {problem}")


def layout_and_workload(
    args: argparse.Namespace,
    mode: str,
    dtype: str,
    modes: tuple[str, ...] | None = None,
    starts_ranks: bool = False,
) -> tuple[Layout, Workload]:
    """The layout and workload the flags describe, checked; ``mode`` is the workload's, ``modes``
    all that the command runs (default: ``mode`` alone). ``starts_ranks``: the command starts a
    process per rank on this host (validate, a measured bench), so a CPU world is bounded by its
    cores; a prediction or a fake world starts none and takes any world."""
    check_modes(args, modes or (mode,))
    overrides = {"vocab_size": args.vocab_size} if args.vocab_size else {}
    config = ModelConfig.preset(args.model, **overrides)
    layout = Layout(args.strategy, **{axis: getattr(args, axis) for axis in AXES})
    device = getattr(args, "device", "cpu")
    decode_tokens = getattr(args, "decode_tokens", None)
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
        getattr(args, "kv_exchange", "allgather"),
        getattr(args, "mlp_exchange", "ring"),
    )
    within_model("--seq-len", workload.seq_len, config)  # decode adds its tokens: Workload checks
    cpu_world = starts_ranks and device == "cpu" and not getattr(args, "fake", False)
    if cpu_world:
        cpu_ranks(f"{layout.strategy} at world size {layout.world_size}", layout.world_size)
    from tspbench.strategy import check_layout  # the registry imports torch: after the cheap checks

    check_layout(layout, workload)
    if cpu_world:
        host_memory(args, layout, workload)
    return layout, workload


def host_memory(args: argparse.Namespace, layout: Layout, workload: Workload) -> None:
    """A CPU world's tensors are real: a point this host cannot hold (the memory model against
    its available memory, tspbench.analytic.host_memory) is one line naming the flag, before any
    rank starts."""
    from tspbench.analytic.host_memory import memory_problem

    problem = memory_problem(layout, workload)
    if problem:
        key, why = problem
        flag, value = ("--batch", args.batch) if key == "batch" else ("--seq-len", args.seq_len)
        raise UsageError(f"{flag} {value:,}: {layout.describe()}, {workload.model.name}: {why}")


def add_common_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--timeout", type=positive_seconds, default=600.0, help="seconds before the world is killed"
    )


def output_path(path: Path, flag: str, folder: bool, writable: bool = True) -> Path:
    """``path`` if it can be written as a folder (or a file): no file where a folder must be, no
    folder where the file goes, and (``writable``) the nearest existing folder takes new files.
    Checked before any work starts, so minutes of measuring never end in a failed write."""
    too_long = name_problem(path)
    if too_long:
        raise UsageError(f"{flag} {path}: {too_long}")
    want, found = ("folder", "file") if folder else ("file", "folder")
    if path.exists() and path.is_dir() != folder:
        raise UsageError(f"{flag} {path}: is a {found}, expected a {want}")
    if path.is_fifo() or path.is_socket():  # a write would wait for a reader that never comes (#45)
        raise UsageError(
            f"{flag} {path}: is a {'FIFO' if path.is_fifo() else 'socket'}, expected a regular {want}"
        )
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    if not existing.is_dir() and existing != path:
        raise UsageError(f"{flag} {path}: {existing} is a file, not a folder")
    if writable:
        _check_writable(path, existing, flag)
    return path


def _check_writable(path: Path, existing: Path, flag: str) -> None:
    """Try it: create a file there holding one byte, fsynced (an empty file fits on a full disk),
    then remove it; or open the existing output file for writing. Permission bits alone do not
    tell (root ignores them; /proc and read-only mounts refuse)."""
    try:
        if existing.is_dir():
            fd, probe = tempfile.mkstemp(dir=existing, prefix=".tspbench-write-check-")
            try:
                os.write(fd, b"\0")
                os.fsync(fd)
            finally:
                os.close(fd)
                os.unlink(probe)
        else:
            os.close(os.open(existing, os.O_WRONLY | os.O_APPEND))
    except OSError as exc:
        where = "" if existing == path else f" ({existing} does not take new files)"
        raise UsageError(f"{flag} {path}: cannot be written{where}: {exc.strerror or exc}") from None
