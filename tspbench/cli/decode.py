"""``tspbench plan-decode``: which layout decodes fastest at batch B (the analytic decode model)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from tspbench.analytic.hardware import available_hardware, load_hardware
from tspbench.analytic.planner import DecodePlan, plan_decode
from tspbench.cli.args import gpu_count, positive_int, within_model
from tspbench.core.names import DTYPES
from tspbench.core.spec import PRESETS, ModelConfig

GIB = 2**30


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan-decode", help="rank every layout of a cluster by predicted time per output token (decode)"
    )
    p.add_argument("--model", default="7b", choices=sorted(PRESETS))
    p.add_argument("--gpus", type=gpu_count, required=True)
    p.add_argument("--gpus-per-node", type=positive_int, help="override the hardware profile's")
    p.add_argument("--seq-len", type=positive_int, required=True, help="context tokens in the cache")
    p.add_argument("--batch", type=positive_int, default=1, help="sequences per model replica")
    p.add_argument("--decode-tokens", type=positive_int, default=128, help="tokens generated per sequence")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16")
    p.add_argument(
        "--hardware",
        default="mi300x",
        help=f"profile name ({', '.join(available_hardware())}) or a .yaml path",
    )
    p.add_argument(
        "--allow-cross-node", action="store_true", help="keep model-parallel groups that span nodes"
    )
    p.add_argument("--top", type=positive_int, default=15, help="rows of the ranking to print")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan_decode)


def cmd_plan_decode(args: argparse.Namespace) -> int:
    hw = load_hardware(args.hardware)
    if args.gpus_per_node:
        hw = replace(hw, gpus_per_node=args.gpus_per_node)
    model = ModelConfig.preset(args.model)
    total = f"--seq-len {args.seq_len} + --decode-tokens {args.decode_tokens}"
    within_model("--decode-tokens", args.seq_len + args.decode_tokens, model, total)
    result = plan_decode(
        model, args.gpus, hw, args.batch, args.seq_len, args.decode_tokens, args.dtype, args.allow_cross_node
    )
    if args.json:
        print(json.dumps(plan_decode_json(result), indent=2))
        return 0
    print(
        f"{args.model}, {args.gpus} GPUs ({hw.gpus_per_node} per node, {hw.name}), context {args.seq_len}, "
        f"batch {args.batch} per replica, {args.decode_tokens} tokens, {args.dtype}, projected (model)"
    )
    print(
        f"{'rank':>4}  {'layout':<24} {'TPOT ms':>8} {'p99 ms':>8} {'TTFT s':>7} {'tokens/s':>10} "
        f"{'peak GiB':>9} {'KV GiB':>7} {'comm MiB/step':>13}"
    )
    for i, c in enumerate(result.ranked[: args.top], 1):
        p = c.prediction
        comm = sum(p.comm_bytes_per_step().values()) / 2**20
        print(
            f"{i:>4}  {c.layout.describe():<24} {p.tpot_s() * 1e3:>8.2f} {p.tpot_s(99) * 1e3:>8.2f} "
            f"{p.ttft_s:>7.2f} {p.tokens_per_s:>10,.0f} {p.peak_bytes / GIB:>9.1f} "
            f"{p.kv_cache_bytes / GIB:>7.1f} {comm:>13,.1f}"
        )
    if not result.ranked:
        print("  no layout fits")
    for c in result.ranked:
        if c.prediction.break_even:
            even = c.prediction.break_even
            print(
                f"{c.layout.describe()}: weight traffic hidden behind its GEMMs from batch {even['batch']:,} "
                f"(attention broadcast {even['attention']:,}, MLP ring {even['mlp']:,})"
            )
    print(f"rejected: {len(result.rejected)}")
    for c in result.rejected[: args.top]:
        print(f"  {c.layout.describe():<24} {c.reason}")
    return 0


def plan_decode_json(result: DecodePlan) -> dict[str, object]:
    return {
        "ranked": [{"layout": c.layout.to_dict(), **c.prediction.record()} for c in result.ranked],
        "rejected": [{"layout": c.layout.to_dict(), "reason": c.reason} for c in result.rejected],
    }
