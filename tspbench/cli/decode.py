"""``tspbench plan-decode``: which layout decodes fastest at batch B (the analytic decode model)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tspbench.cli.analytic import add_cluster_args, add_dtype_and_hardware, hardware_of, print_json_or_heading
from tspbench.cli.args import positive_int, within_model
from tspbench.cli.plan_text import print_left_out, print_rejected, ranked_json
from tspbench.core.spec import ModelConfig
from tspbench.core.units import format_bytes

if TYPE_CHECKING:
    from tspbench.analytic.planner import DecodePlan


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan-decode",
        help="rank every layout of a cluster by predicted time per output token (decode)",
        description="Price every layout of exactly --gpus GPUs decoding with the analytic decode model "
        "and rank those that fit by time per output token; list every one that cannot run, grouped by why.",
    )
    add_cluster_args(
        p,
        "context tokens in the cache before the first generated token",
        "sequences decoded together by each model replica",
    )
    p.add_argument(
        "--decode-tokens", type=positive_int, default=128, help="tokens generated per sequence (default 128)"
    )
    add_dtype_and_hardware(p)
    p.add_argument(
        "--json", action="store_true", help="print the ranking and the rejections as one JSON object"
    )
    p.set_defaults(func=cmd_plan_decode)


def cmd_plan_decode(args: argparse.Namespace) -> int:
    from tspbench.analytic.planner import plan_decode

    hw = hardware_of(args)
    model = ModelConfig.preset(args.model)
    total = f"--seq-len {args.seq_len} + --decode-tokens {args.decode_tokens}"
    within_model("--decode-tokens", args.seq_len + args.decode_tokens, model, total)
    result = plan_decode(
        model, args.gpus, hw, args.batch, args.seq_len, args.decode_tokens, args.dtype, args.allow_cross_node
    )
    what = (
        f"context {args.seq_len}, batch {args.batch} per replica, {args.decode_tokens} tokens, "
        f"{args.dtype}, projected (model)"
    )
    if print_json_or_heading(args, hw, plan_decode_json(result), what):
        return 0
    print(
        f"{'rank':>4}  {'layout':<24} {'TPOT ms':>8} {'p99 ms':>8} {'TTFT s':>7} {'tokens/s':>10} "
        f"{'peak/GPU':>10} {'KV cache':>10} {'comm/step':>10}"
    )
    for i, c in enumerate(result.ranked[: args.top], 1):
        p = c.prediction
        comm = sum(p.comm_bytes_per_step().values())
        print(
            f"{i:>4}  {c.layout.describe():<24} {p.tpot_s() * 1e3:>8.2f} {p.tpot_s(99) * 1e3:>8.2f} "
            f"{p.ttft_s:>7.2f} {p.tokens_per_s:>10,.0f} {format_bytes(p.peak_bytes):>10} "
            f"{format_bytes(p.kv_cache_bytes):>10} {format_bytes(comm):>10}"
        )
    print_left_out(len(result.ranked), args.top)
    for c in result.ranked:
        if c.prediction.break_even:
            even = c.prediction.break_even
            print(
                f"{c.layout.describe()}: weight traffic hidden behind its GEMMs from batch {even['batch']:,} "
                f"(attention broadcast {even['attention']:,}, MLP ring {even['mlp']:,})"
            )
    print_rejected(result.rejected, 24)
    return 0


def plan_decode_json(result: DecodePlan) -> dict[str, object]:
    return ranked_json(result.ranked, lambda p: p.record(), result.rejected)
