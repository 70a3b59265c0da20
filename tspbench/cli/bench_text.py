"""A ``bench`` record as a user reads it: what was measured (or executed in a fake world) and
the models beside it, each with its error, on the profile the record names."""

from __future__ import annotations

import math

from tspbench.core.names import AXES
from tspbench.core.units import format_bytes, readable_sizes


def print_record(r: dict) -> None:
    print(
        f"{r['strategy']}  {' '.join(f'{a}{r[a]}' for a in AXES)}  {r['model']}  "
        f"seq {r['seq_len']}  batch {r['batch']}  {r['mode']}  {r['dtype']}  -> {r['status']}"
    )
    if r["status"] != "completed":  # one line; the record (--json) keeps the rank's traceback
        print(readable_sizes(first_line(r.get("error") or "")))
        return
    if r.get("hardware_choice"):
        print(f"  priced on     {r['hardware_choice']}")
    if r["mode"] == "decode":
        print_decode(r)
        return
    if r.get("source") == "fake":
        print_fake(r)
        return
    print(
        f"  step time     {r['step_time_s'] * 1e3:10.1f} ms  (p10 {r['step_time_p10_s'] * 1e3:.1f}, "
        f"p90 {r['step_time_p90_s'] * 1e3:.1f})"
    )
    tflops = figures(r["tflops_per_gpu"])
    print(f"  tokens/s/GPU  {r['tokens_per_s_per_gpu']:10.1f}      TFLOP/s/GPU {tflops}")
    if r.get("mfu") is not None:
        which = r["mfu_peak_source"].split(":")[0]  # the profile, and why that one
        peak = figures(r["mfu_peak_tflops"])
        print(f"  MFU           {r['mfu']:10.1%}      of {peak} TFLOP/s/GPU, {which}")
    peak, rank = format_bytes(r["peak_memory_bytes"]), r["peak_memory_rank"]
    print(f"  peak memory   {peak:>13} (max over ranks, rank {rank})")
    for cat in ("parameters", "gradients", "optimizer", "activations", "other"):
        print(f"    {cat:<12}{format_bytes(r[f'peak_memory_{cat}_bytes']):>13}")
    print(f"  comm/step     {format_bytes(r['comm_bytes_per_step']):>13} bus bytes (max over ranks)")
    print_predicted(r)
    print_predicted_time(r)


def print_predicted_time(r: dict) -> None:
    """The time model's step beside the measured one (its error, as for memory above), then the
    traced step's replay on the same profile beside the measured one."""
    if not r.get("predicted_step_time_s"):
        return
    line = f"                step {ms(r['predicted_step_time_s'])}"
    if r.get("predicted_step_time_error") is not None:
        line += f" ({r['predicted_step_time_error']:+.1%} vs measured)"
    line += f" on {r['predicted_hardware']}"
    if r.get("timeline_step_time_s") and r.get("timeline_step_time_error") is not None:
        line += (
            f"; the traced step replayed on {r['timeline_hardware']}: {ms(r['timeline_step_time_s'])} "
            f"({r['timeline_step_time_error']:+.1%})"
        )
    print(line)


def print_predicted(r: dict) -> None:
    """The model's peak and comm beside what was measured or executed, with their errors."""
    print(
        f"  predicted     peak {format_bytes(r['predicted_peak_memory_bytes'])} "
        f"({r['predicted_memory_error']:+.1%}), comm {format_bytes(r['predicted_comm_bytes_per_step'])}, "
        f"hardware FLOPs {r['predicted_flops_error']:+.2%} vs counted"
    )


def ms(seconds: float) -> str:
    """'38.4 ms', '0.233 ms', '1,204 ms': three significant figures, or whole milliseconds."""
    value = seconds * 1e3
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.3g} ms"


def figures(value: float) -> str:
    """Three significant figures, no exponent, whole numbers from 100: '0.0935', '1.25', '1,979'
    (a CPU's 0.093542 TFLOP/s is not known to six)."""
    if not value or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{2 - math.floor(math.log10(abs(float(f'{value:.3g}'))))}f}"


def first_line(text: str) -> str:
    """The first non-empty line of an error ("rank 1 raised OutOfMemoryError: ..."), not its
    traceback."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def print_fake(r: dict) -> None:
    """A fake-world record: memory per executed rank, comm, FLOPs, the model beside them."""
    ranks = r["fake_ranks"]
    shown = ", ".join(map(str, ranks)) if len(ranks) <= 8 else f"{ranks[0]}..{ranks[-1]} ({len(ranks)})"
    print(f"  executed in a fake world of {r['world_size']} ranks: ranks {shown}, {r['fake_seconds']:.1f} s")
    peak, rank, phase = format_bytes(r["peak_memory_bytes"]), r["peak_memory_rank"], r["peak_memory_phase"]
    print(f"  peak memory   {peak:>13} (max over ranks, rank {rank}, {phase})")
    cats = ("parameters", "gradients", "optimizer", "activations", "other")
    print("    rank " + "".join(f"{c:>13}" for c in cats))
    for row in r["peak_memory_by_rank"][:16]:
        print(f"    {row['rank']:>4} " + "".join(f"{format_bytes(row[c]):>13}" for c in cats))
    print(f"  comm/step     {format_bytes(r['comm_bytes_per_step']):>13} bus bytes (max over ranks)")
    print(f"  hardware FLOPs/step/GPU {r['hardware_flops_per_step_per_gpu']:.4g}")
    if r.get("timeline_step_time_s"):
        print(
            f"  step time     no measured time; the traced step replayed on {r['timeline_hardware']}: "
            f"{ms(r['timeline_step_time_s'])}"
        )
    print_predicted(r)
    predicted, replayed = r.get("predicted_step_time_s"), r.get("timeline_step_time_s")
    if predicted and replayed:
        print(
            f"                step {ms(predicted)} ({predicted / replayed - 1:+.1%} vs the replay) "
            f"on {r['predicted_hardware']}"
        )


def print_decode(r: dict) -> None:
    """A decode record, measured (TTFT, TPOT, energy) or executed in a fake world (no time)."""
    ms = 1e3
    if r.get("source") == "fake":
        print(f"  executed in a fake world of {r['world_size']} ranks: ranks {r['fake_ranks']} (no time)")
    else:
        print(
            f"  TTFT {r['ttft_s'] * ms:.1f} ms   TPOT p50 {r['tpot_p50_s'] * ms:.2f}  p90 "
            f"{r['tpot_p90_s'] * ms:.2f}  p99 {r['tpot_p99_s'] * ms:.2f} ms   "
            f"{r['decode_tokens_per_s']:.1f} tokens/s"
        )
        energy = r.get("energy_per_token_j")
        print(
            f"  energy/token  {energy:.4g} J"
            if energy is not None
            else f"  energy: {r['energy_unavailable']}"
        )
    print(
        f"  peak memory   {format_bytes(r['peak_memory_bytes']):>13} (max over ranks, rank "
        f"{r['peak_memory_rank']}); KV cache {format_bytes(r['kv_cache_bytes'])}"
    )
    print(f"  comm/decode step {format_bytes(r['decode_comm_bytes_per_step'])} bus bytes (busiest rank)")
    print(
        f"  hardware FLOPs/GPU: prefill {r['hardware_flops_prefill_per_gpu']:.4g}, "
        f"decode step {r['hardware_flops_per_decode_step_per_gpu']:.4g}"
    )
    errors = [
        f"{c.removeprefix('predicted_').removesuffix('_error')} {r[c]:+.1%}"
        for c in sorted(r)
        if c.startswith("predicted_") and c.endswith("_error")
    ]
    print(
        f"  predicted on {r['predicted_hardware']}: " + (", ".join(errors) or "no measured column to compare")
    )
