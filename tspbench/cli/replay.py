"""``tspbench replay``: a stored step trace replayed on any hardware profile (the timeline)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tspbench.cli.args import output_path
from tspbench.core.errors import UsageError


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a stored step trace (trace.npz: bench --trace, run.trace) on a hardware profile",
    )
    p.add_argument("traces", type=Path, help="a trace.npz, or a run folder that holds one")
    p.add_argument("--hardware", default="mi300x", help="profile name or .yaml path (default: mi300x)")
    p.add_argument("--world-size", type=int, help="the job's world size (default: as recorded)")
    p.add_argument("--trace", type=Path, help="also write the replay as a Chrome trace (.json, .json.gz)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_replay)


def cmd_replay(args: argparse.Namespace) -> int:
    from tspbench.analytic.chrome import write_chrome_trace
    from tspbench.analytic.hardware import load_hardware
    from tspbench.analytic.timeline import timeline
    from tspbench.core.trace import load_traces

    path = args.traces / "trace.npz" if args.traces.is_dir() else args.traces
    if not path.is_file():
        raise UsageError(f"{path}: no such trace file (bench --trace X.npz, or run.trace: true, writes one)")
    try:
        traces, meta = load_traces(path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.trace is not None:
        output_path(args.trace, "--trace", folder=False)
    world = args.world_size or meta.get("world_size") or len(traces)
    tl = timeline(traces, load_hardware(args.hardware), world)
    record = {"traces": str(path), "timeline_hardware": args.hardware, **meta, **tl.to_record()}
    if args.trace is not None:
        record["trace_path"] = str(write_chrome_trace(tl, args.trace))
    if args.json:
        print(json.dumps(record, indent=2))
        return 0
    print(f"{path}: {len(traces)} rank(s) of a world of {world}, replayed on {args.hardware}")
    ms = 1e3
    step, compute = tl.step_s * ms, tl.compute_s * ms
    print(f"  step {step:.2f} ms (critical rank {tl.critical_rank}): compute {compute:.2f} ms")
    for op, seconds in sorted(tl.exposed_s.items(), key=lambda kv: -kv[1]):
        hidden = tl.hidden_fraction.get(op, 0)
        print(f"  exposed {op:<15} {seconds * ms:9.2f} ms  (hidden under compute: {hidden:.0%})")
    print(f"  waits on peers  {tl.peers_s * 1e3:9.2f} ms")
    if tl.weights_hidden_fraction is not None:
        print(f"  TSP weight traffic hidden: {tl.weights_hidden_fraction:.0%}")
    return 0
