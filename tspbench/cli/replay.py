"""``tspbench replay``: a stored step trace replayed on any hardware profile (the timeline)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from tspbench.cli.args import output_path, positive_int
from tspbench.core.errors import OutputError, UsageError
from tspbench.core.files import check_suffix

if TYPE_CHECKING:
    from tspbench.analytic.timeline import Timeline
    from tspbench.core.trace import RankTrace


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a stored step trace (trace.npz: bench --trace, run.trace) on a hardware profile",
    )
    p.add_argument("traces", type=Path, help="a trace.npz, or a run folder that holds one")
    p.add_argument("--hardware", help="profile name or .yaml path (default: mi300x, the paper's GPU)")
    p.add_argument(
        "--world-size", type=positive_int, help="the job's world size (default: as recorded; at least the "
        "ranks the trace names)"
    )  # fmt: skip
    p.add_argument("--trace", type=Path, help="also write the replay as a Chrome trace (.json, .json.gz)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_replay)


def cmd_replay(args: argparse.Namespace) -> int:
    from tspbench.analytic.chrome import write_chrome_trace
    from tspbench.analytic.profile_choice import choose_profile
    from tspbench.analytic.replayed import reprice
    from tspbench.core.trace import load_traces

    path = args.traces / "trace.npz" if args.traces.is_dir() else args.traces
    if not path.exists():  # a FIFO or device: load_traces refuses it, saying what it is
        raise UsageError(f"{path}: no such trace file (bench --trace X.npz, or run.trace: true, writes one)")
    if args.trace is not None:
        output_path(args.trace, "--trace", folder=False)
        check_suffix(args.trace, "--trace", (".json", ".json.gz"))
    traces, meta = load_traces(path)  # a damaged file: one line naming it (DamagedFileError)
    world = world_size(args.world_size, traces, meta, path)
    choice = choose_profile(args.hardware, device="cuda", measured=False)
    tl = reprice({**meta, "world_size": world}, traces, choice.hardware)
    record = {"traces": str(path), "timeline_hardware": choice.label, **meta, **tl.to_record()}
    failed: OutputError | None = None
    try:
        if args.trace is not None:
            record["trace_path"] = str(write_chrome_trace(tl, args.trace))
    except OutputError as exc:  # the replay is printed all the same, then the failed write
        failed = exc
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        print(f"{path}: {len(traces)} rank(s) of a world of {world}, replayed on {choice.label}")
        print_timeline(tl)
    if failed is not None:
        raise failed
    return 0


def world_size(given: int | None, traces: list[RankTrace], meta: dict, path: Path) -> int:
    """The world the traces are replayed in: ``given``, else as recorded; never fewer ranks than
    the traces name (their own ranks, and every rank of the groups they talk to)."""
    named = [t.rank for t in traces] + [r for t in traces for g in t.groups for r in g.ranks]
    needed = max(named, default=0) + 1
    if given is not None and given < needed:
        raise UsageError(
            f"--world-size {given}: {path} names ranks up to {needed - 1}; give at least {needed}"
        )
    return given or int(meta.get("world_size") or needed)


def print_timeline(tl: Timeline) -> None:
    ms = 1e3
    step, compute = tl.step_s * ms, tl.compute_s * ms
    print(f"  step {step:.2f} ms (critical rank {tl.critical_rank}): compute {compute:.2f} ms")
    for op, seconds in sorted(tl.exposed_s.items(), key=lambda kv: -kv[1]):
        hidden = tl.hidden_fraction.get(op, 0)
        print(f"  exposed {op:<15} {seconds * ms:9.2f} ms  (hidden under compute: {hidden:.0%})")
    print(f"  waits on peers  {tl.peers_s * 1e3:9.2f} ms")
    if tl.weights_hidden_fraction is not None:
        print(f"  TSP weight traffic hidden: {tl.weights_hidden_fraction:.0%}")
