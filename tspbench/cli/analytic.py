"""``tspbench predict``, ``plan`` and ``calibrate``: the analytic model on the command line."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from tspbench.analytic.hardware import Hardware, available_hardware
from tspbench.analytic.profile_choice import choose_profile
from tspbench.cli.args import (
    MAX_GPUS,
    RECOMPUTE_HELP,
    STEPS_HELP,
    add_layout_args,
    cpu_ranks,
    gpu_count,
    layout_and_workload,
    output_path,
    positive_int,
    within_model,
)
from tspbench.cli.plan_text import plan_json, print_plan
from tspbench.cli.terminal import progress_for
from tspbench.core.errors import OutputError, UsageError
from tspbench.core.files import check_suffix, write_atomic
from tspbench.core.names import DTYPES, MODES, RECOMPUTE_MODES
from tspbench.core.records import point_record
from tspbench.core.spec import PRESETS, Layout, ModelConfig, Workload, recompute_problem
from tspbench.core.units import format_bytes

if TYPE_CHECKING:  # the models import torch: each command imports what it runs, so a refusal is quick
    from tspbench.analytic.decode import DecodePrediction
    from tspbench.analytic.predict import Prediction

PROFILE_SUFFIXES = (".yaml", ".yml")  # what --hardware takes as a path
CALIBRATE_MIN_SEQ_LEN = 16  # the smallest attention call calibrate times (its zigzag chunk floor)


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="the analytic model of one point: memory, comm, FLOPs, time")
    add_layout_args(p, model_default="7b")
    add_model_args(p, with_batch=False)
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser(
        "plan",
        help="rank every layout of a cluster by predicted throughput",
        description="Price every layout of exactly --gpus GPUs with the analytic model and rank those "
        "that fit by tokens/s per GPU; list every one that cannot run, grouped by why.",
    )
    add_cluster_args(
        p,
        "tokens per sequence, the whole training or prefill sequence",
        "sequences per micro-batch of each model replica",
    )
    p.add_argument(
        "--tune",
        action="store_true",
        help="each layout at its best setting: every switch its strategy takes (Megatron SP, the K/V "
        "and MLP exchanges, overlap) and, in training, every recompute mode unless --recompute is given",
    )
    p.add_argument(
        "--recompute",
        choices=RECOMPUTE_MODES,
        help=f"{RECOMPUTE_HELP}; --tune tries every mode unless this is given",
    )
    add_model_args(p, with_batch=False)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("calibrate", help="measure this device and write a hardware profile")
    p.add_argument(
        "--ranks", type=positive_int, default=4, help="local ranks the points run with (default 4)"
    )
    p.add_argument(
        "--model", default=None, choices=sorted(PRESETS), help="shapes to measure (default: small on CPU)"
    )
    p.add_argument("--seq-len", type=positive_int, default=2048, help="tokens per sequence the points run")
    p.add_argument(
        "--max-seq-len",
        type=positive_int,
        help="time attention up to this many tokens, the longest point to predict (default --seq-len)",
    )
    p.add_argument("--repeats", type=positive_int, help="measurements per figure (default 5; 3 with --quick)")
    p.add_argument(
        "--quick", action="store_true", help="fewer repeats, smaller messages (seconds, not minutes)"
    )
    p.add_argument("--name", help="the profile's name (default: the device's)")
    p.add_argument("--out", type=Path, help="write the profile here (.yaml: what --hardware PATH reads)")
    p.add_argument("--json", action="store_true", help="print the profile as one JSON object")
    p.set_defaults(func=cmd_calibrate)


def add_cluster_args(p: argparse.ArgumentParser, seq_len_help: str, batch_help: str) -> None:
    """The flags plan and plan-decode share: the model, the cluster, the batch, how much to print."""
    p.add_argument("--model", default="7b", choices=sorted(PRESETS), help="model preset (default 7b)")
    p.add_argument(
        "--gpus",
        type=gpu_count,
        required=True,
        help=f"GPUs in the cluster; every layout of exactly this many is priced (1 to {MAX_GPUS:,})",
    )
    p.add_argument(
        "--gpus-per-node",
        type=positive_int,
        help="GPUs per node (default: the hardware profile's); a model-parallel group stays in one node",
    )
    p.add_argument(
        "--seq-len", type=positive_int, required=True, help=f"{seq_len_help} (at most the model's)"
    )
    p.add_argument("--batch", type=positive_int, default=1, help=f"{batch_help} (default 1)")
    p.add_argument(
        "--allow-cross-node", action="store_true", help="keep model-parallel groups that span nodes"
    )
    p.add_argument(
        "--top",
        type=positive_int,
        default=15,
        help="rows of the ranking to print (default 15); every rejected layout is listed",
    )


def add_model_args(p: argparse.ArgumentParser, with_batch: bool) -> None:
    if with_batch:
        p.add_argument(
            "--batch", type=positive_int, default=1, help="sequences per micro-batch of each model replica"
        )
    decodes = any(a.dest == "decode_tokens" for a in p._actions)  # predict; plan leaves it to plan-decode
    steps = STEPS_HELP if decodes else STEPS_HELP.split(", decode")[0] + ", decode (plan-decode ranks it)"
    p.add_argument("--mode", choices=MODES, default="train", help=f"the step: {steps} (default train)")
    if not any(a.dest == "recompute" for a in p._actions):
        p.add_argument("--recompute", choices=RECOMPUTE_MODES, default="none", help=RECOMPUTE_HELP)
    add_dtype_and_hardware(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def add_dtype_and_hardware(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        default="bfloat16",
        help="dtype of parameters, activations and messages (default bfloat16, what GPUs train in; "
        "bench defaults to float32, as it measures on CPU unless told otherwise)",
    )
    p.add_argument(
        "--hardware",
        help=f"the GPU and network priced: a profile name ({', '.join(available_hardware())}) or a "
        ".yaml path (default mi300x, the paper's GPU)",
    )


def hardware_of(args: argparse.Namespace) -> Hardware:
    """The point's profile (--hardware, else the paper's MI300X: tspbench.analytic.profile_choice),
    with --gpus-per-node in place of its own when given."""
    hw = choose_profile(args.hardware, device="cuda", measured=False).hardware
    return replace(hw, gpus_per_node=args.gpus_per_node) if getattr(args, "gpus_per_node", None) else hw


def cmd_predict(args: argparse.Namespace) -> int:
    layout, workload = layout_and_workload(args, args.mode, args.dtype)  # --seq-len in the model's
    if workload.mode == "decode":
        return predict_decode_point(layout, workload, hardware_of(args), args.json)
    from tspbench.analytic.predict import predict  # torch: after the flags are checked

    prediction = predict(layout, replace(workload, device="cuda"), hardware_of(args))
    if args.json:
        print(json.dumps(prediction.to_json(), indent=2))
    else:
        print_prediction(prediction)
    return 0


def predict_decode_point(layout: Layout, workload: Workload, hw: Hardware, as_json: bool) -> int:
    """``predict --mode decode``: the decode model (as ``plan-decode`` ranks it and the predict
    executor records it), since a decode step is not a training or prefill step."""
    w = replace(workload, device="cuda")  # as predict: the model is of the profile's device
    from tspbench.analytic.decode import predict_decode

    p = predict_decode(layout, w.model, w.batch, w.seq_len, w.decode_tokens, w.dtype, hw)
    if as_json:
        print(json.dumps({**point_record(layout, w, "predicted"), **p.record()}, indent=2))
    else:
        print_decode_prediction(p, w)
    return 0


def print_decode_prediction(p: DecodePrediction, w: Workload) -> None:
    hw, world = p.hardware, p.layout.world_size
    nodes = math.ceil(world / hw.gpus_per_node)
    print(
        f"{p.layout.describe()}  {w.model.name}  context {w.seq_len}  batch {w.batch}  decode "
        f"{w.decode_tokens} tokens  {w.dtype}  on {hw.name} ({world} GPUs, {nodes} nodes), projected"
    )
    ms = 1e3
    print(
        f"TTFT {p.ttft_s * ms:.2f} ms   TPOT p50 {p.tpot_s() * ms:.3f}  p90 {p.tpot_s(90) * ms:.3f}  "
        f"p99 {p.tpot_s(99) * ms:.3f} ms   {p.tokens_per_s:,.0f} tokens/s "
        f"({p.tokens_per_s / world:,.0f} per GPU)"
    )
    fit = "fits" if p.fits else "DOES NOT FIT"
    print(
        f"memory per GPU: peak {format_bytes(p.peak_bytes)} (KV cache {format_bytes(p.kv_cache_bytes)}) "
        f"of {format_bytes(hw.usable_bytes)} usable -> {fit}"
    )
    comm = p.comm_bytes_per_step()
    cells = ", ".join(f"{op} {format_bytes(b)}" for op, b in sorted(comm.items())) or "none"
    print(f"communication per GPU per decode step (bus bytes): {cells}")
    if p.break_even:
        print(f"weight traffic hidden behind the GEMMs from batch {p.break_even['batch']:,} per replica")


def print_prediction(p: Prediction) -> None:
    w, hw = p.workload, p.hardware
    nodes = math.ceil(p.layout.world_size / hw.gpus_per_node)
    print(
        f"{p.layout.describe()}  {w.model.name}  seq {w.seq_len}  batch {w.batch}  {w.mode}  "
        f"recompute {w.recompute}  {w.dtype}  on {hw.name} ({p.layout.world_size} GPUs, {nodes} nodes)"
    )
    fit = "fits" if p.fits else "DOES NOT FIT"
    print(
        f"memory per GPU: peak {format_bytes(p.memory.peak_bytes)} at '{p.memory.moment}' "
        f"of {format_bytes(hw.usable_bytes)} usable -> {fit}"
    )
    for cat, nbytes in p.memory.by_category.items():
        print(f"  {cat:<12} {format_bytes(nbytes):>10}")
    print(f"communication per GPU per step: {format_bytes(p.comm_bytes_per_step)} (bus bytes)")
    for op, phases in sorted(p.comm_by().items()):
        cells = "  ".join(f"{ph} {format_bytes(b)}" for ph, b in phases.items())
        print(f"  {op:<15} {cells}")
    print(
        f"FLOPs per step: model {p.model_flops:.3e} (causal attention halved); per GPU hardware "
        f"{p.flops.total:.3e} (GEMM {p.flops.gemm:.2e}, attention {p.flops.attention:.2e}, recompute incl.)"
    )
    t = p.time
    print(
        f"time per step: compute {t.compute_s:.3f} s (GEMM {t.gemm_s:.3f}, attention {t.attention_s:.3f}, "
        f"element-wise {t.elementwise_s:.3f}; {t.share:.2f} of the device per rank) + exposed comm "
        f"{p.comm_exposed_s:.3f} s (overlapped comm that ran under compute: {p.comm_hidden_s:.3f} s) "
        f"= {p.step_time_s:.3f} s"
    )
    print(f"throughput: {p.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {p.mfu:.1%}")


def cmd_plan(args: argparse.Namespace) -> int:
    if args.mode == "decode":
        raise UsageError(
            "--mode decode: plan ranks training and prefill steps; for decode use `tspbench plan-decode "
            "--gpus N --seq-len S --decode-tokens T` (it ranks layouts by time per output token)"
        )
    fixed_recompute, recompute = args.recompute is not None, args.recompute or "none"
    problem = recompute_problem(recompute, (args.mode,))
    if problem:
        raise UsageError(f"--recompute {recompute} with --mode {args.mode}: {problem}")
    model = ModelConfig.preset(args.model)
    within_model("--seq-len", args.seq_len, model)
    hw = hardware_of(args)
    workload = Workload(model, args.batch, args.seq_len, args.mode, recompute, args.dtype, "cuda")
    from tspbench.analytic.planner import plan

    result = plan(
        workload, args.gpus, hw, args.allow_cross_node, tune=args.tune, fixed_recompute=fixed_recompute
    )
    tuned = args.mode == "train" and args.tune and not fixed_recompute
    what = f"seq {args.seq_len}, batch {args.batch}, {args.mode}" + (
        "" if tuned else f", recompute {recompute}"
    )
    what += ", each layout at its best setting" if args.tune else ""
    if print_json_or_heading(args, hw, plan_json(result), what):
        return 0
    print_plan(result, workload, args.top, tuned=args.tune)
    return 0


def print_json_or_heading(args: argparse.Namespace, hw: Hardware, plan: dict, what: str) -> bool:
    """A plan with --json: all of it as one JSON object, and True (nothing more to print);
    otherwise the heading of its text, '7b, 64 GPUs (8 per node, mi300x), ' and ``what``."""
    if args.json:
        print(json.dumps(plan, indent=2))
        return True
    print(f"{args.model}, {args.gpus} GPUs ({hw.gpus_per_node} per node, {hw.name}), {what}")
    return False


def calibrate(*args: object, **kwargs: object) -> object:
    """tspbench.calibrate.profile.calibrate, imported when a calibration starts (it imports torch)."""
    from tspbench.calibrate.profile import calibrate as measure_host

    return measure_host(*args, **kwargs)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from tspbench.calibrate.profile import default_model

    if args.out:
        output_path(args.out, "--out", folder=False)  # before minutes of measuring
        check_suffix(args.out, "--out", PROFILE_SUFFIXES)  # what --hardware PATH reads back
    model = ModelConfig.preset(args.model) if args.model else default_model()
    check_calibrate_sizes(args, model)
    progress = progress_for(sys.stderr)  # minutes of measuring; stdout keeps the profile alone
    try:
        result = calibrate(
            args.ranks, model, args.seq_len, args.repeats, args.quick, args.max_seq_len, progress
        )
    finally:
        progress.close()
    profile = result.profile
    if args.name:
        profile["name"] = args.name
    text = yaml.safe_dump(profile, sort_keys=False)
    for warning in result.warnings:
        print(f"tspbench calibrate: warning: {warning}", file=sys.stderr)
    if args.out:
        try:
            write_atomic(args.out, text)
        except OutputError:
            print(text)  # minutes of measuring are not lost: the profile, then the failed write
            raise
    if args.json:
        print(json.dumps(profile, indent=2))
    elif not args.out:
        print(text)
    else:
        p = profile
        print(
            f"wrote {args.out}: GEMM {p['gemm_tflops']} TFLOP/s, attention {p['attention_tflops']} (causal "
            f"{p['attention_causal_tflops']}) TFLOP/s, element-wise {p['hbm_bandwidth_gbs']} GB/s per rank; "
            f"overlap efficiency {p.get('overlap_efficiency', 1.0)}"
        )
    return 0


def check_calibrate_sizes(args: argparse.Namespace, model: ModelConfig) -> None:
    """Sizes the calibration can time, refused before it starts: attention is timed from
    ``CALIBRATE_MIN_SEQ_LEN`` tokens up to what the model serves."""
    cpu_ranks("--ranks", args.ranks)  # calibrate runs on this host's CPU: each rank a process (#45)
    low, high = max(CALIBRATE_MIN_SEQ_LEN, args.ranks), model.max_seq_len
    if not low <= args.seq_len <= high:
        raise UsageError(
            f"--seq-len {args.seq_len}: calibrate runs {low} to {high:,} tokens with {args.ranks} rank(s) "
            f"on {model.name} (at least {CALIBRATE_MIN_SEQ_LEN}, one per rank; at most its max_seq_len)"
        )
    if args.max_seq_len is not None and not args.seq_len <= args.max_seq_len <= high:
        raise UsageError(
            f"--max-seq-len {args.max_seq_len}: must be from --seq-len ({args.seq_len}) to {high:,}, "
            f"the positions {model.name} serves"
        )
