"""gpu-check's speed and steady-state rows (tspbench.checks.gpu_check runs them):

    attention/speed  the model's causal attention (a causal square; a query chunk at an offset,
                     split into an unmasked prefix and a causal square) against SDPA's default
                     on the same work, forward + backward, at 8K and 32K tokens (bf16, 32 heads
                     of 128): the time ratio, at most ATTENTION_SPEED_LIMIT on a GPU
    memory/infer     a prefill point (the memory workload in mode infer): the allocator's peak
                     must be the same at every tracked step (nothing a step creates outlives it)
    step             the memory workload's model trained at 8K and 32K tokens: step time and MFU
                     (measured, no pass mark)
    decode/tpot      the 7B decoding 32 tokens after 16K of context, batch 4: CUDA-graphed and
                     eager steps give the same tokens, and the graphed TPOT is at most
                     TPOT_FLOOR_LIMIT x its floor: the bytes one step must read (weights and the
                     KV cache it attends) over the HBM bandwidth calibrate measured

``--device cpu --quick`` runs each on the tiny model (no pass mark on time: a shared CPU host).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tspbench.analytic import prices
from tspbench.analytic.profile_choice import HardwareChoice, choose_profile
from tspbench.calibrate.launches import timed
from tspbench.checks.gpu_plan import Check, Plan
from tspbench.core.spec import Layout, ModelConfig
from tspbench.measure.bench import bench
from tspbench.measure.env import device_name
from tspbench.model.attention import causal_attention

ATTENTION_SPEED_LIMIT = 1.05  # the model's attention over SDPA's default, forward + backward
TPOT_FLOOR_LIMIT = 1.3  # graphed TPOT over its bytes-over-bandwidth floor
INFER_PEAK_SPREAD = 1e-3  # relative spread allowed between the steps' allocator peaks


def device_profile(device: str) -> HardwareChoice:
    """The profile of the device a row measures on, by profile_choice's rule for a measured point
    (cpu, else the shipped profile its GPU's name matches): for the rows priced on the device's
    own profile rather than calibrate's, chosen here so that measure/ is handed its profile."""
    return choose_profile(None, device=device, device_name=device_name(device), measured=True)


def attention_pairs(seq: int, heads: int, d: int, device: str, dtype: torch.dtype) -> dict[str, tuple]:
    """Per case, (the model's call, SDPA's default on the same work), each forward + backward."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, seq, d, device=device, dtype=dtype, requires_grad=True) for _ in "qkv")
    half = seq // 2
    chunk = q[:, :, half:].detach().requires_grad_()
    grad, grad_half = torch.randn_like(q), torch.randn_like(chunk)

    def square() -> None:
        causal_attention(q, k, v).backward(grad)

    def sdpa_square() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    def offset() -> None:
        causal_attention(chunk, k, v).backward(grad_half)

    def sdpa_parts() -> None:  # the same work: the unmasked prefix and the causal square
        prefix = F.scaled_dot_product_attention(chunk, k[:, :, :half], v[:, :, :half])
        diagonal = F.scaled_dot_product_attention(chunk, k[:, :, half:], v[:, :, half:], is_causal=True)
        torch.autograd.backward([prefix, diagonal], [grad_half, grad_half])

    return {"square": (square, sdpa_square), "offset": (offset, sdpa_parts)}


def attention_speed_check(device: str, quick: bool) -> Check:
    cuda = device == "cuda" and not quick
    sizes, heads, d = ((8192, 32768), 32, 128) if cuda else ((1024,), 4, 32)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    rows = {}
    for seq in sizes:
        for case, (model, sdpa) in attention_pairs(seq, heads, d, device, dtype).items():
            ours, theirs = timed(model, device, 10 if cuda else 3), timed(sdpa, device, 10 if cuda else 3)
            rows[f"{case} {seq}"] = {"model_s": ours, "sdpa_default_s": theirs, "ratio": ours / theirs}
    worst = max(rows, key=lambda key: rows[key]["ratio"])
    text = ", ".join(f"{key}: {r['ratio']:.2f}" for key, r in rows.items())
    if device != "cuda":
        return Check("attention/speed", "measured", f"model / SDPA default, fwd+bwd: {text}", rows)
    ok = rows[worst]["ratio"] <= ATTENTION_SPEED_LIMIT
    summary = f"model / SDPA default, fwd+bwd: {text} (limit {ATTENTION_SPEED_LIMIT})"
    return Check("attention/speed", "passed" if ok else "failed", summary, rows)


def inference_memory_check(p: Plan, hardware: HardwareChoice) -> Check:
    workload = p.memory.with_(mode="infer")
    record = bench(Layout("dp", dp=1), workload, hardware, steps=2, warmup=1, timeout=900)
    if record["status"] != "completed":
        return Check("memory/infer", "failed", f"{record['status']}: {record.get('error')}", record)
    peaks = record["peak_memory_step_bytes"]
    spread = max(peaks) / min(peaks) - 1
    summary = (
        f"{workload.model.name} prefill at {workload.seq_len} tokens: peaks "
        f"{', '.join(f'{b / 2**30:.2f}' for b in peaks)} GiB "
        f"({spread:.1e} apart; at most {INFER_PEAK_SPREAD:g})"
    )
    return Check("memory/infer", "passed" if spread <= INFER_PEAK_SPREAD else "failed", summary, record)


def step_check(p: Plan, quick: bool, hardware: HardwareChoice | None) -> Check:
    lengths = (8192, 32768) if p.device == "cuda" and not quick else (256, 1024)
    records, parts, own = {}, [], device_profile(p.device)
    for seq in lengths:
        r = bench(Layout("dp", dp=1), p.memory.with_(seq_len=seq), own, steps=3, warmup=1, timeout=900)
        records[seq] = r
        if r["status"] != "completed":
            return Check("step", "failed", f"{seq} tokens: {r['status']}", records)
        mfu = f", MFU {r['mfu']:.1%} of {r['mfu_peak_tflops']:g} TFLOP/s" if r.get("mfu") else ""
        parts.append(f"{seq} tokens {r['step_time_s']:.3g} s{mfu}")
    return Check("step", "measured", f"{p.memory.model.name} training: {'; '.join(parts)}", records)


def decode_floor_s(record: dict, model: ModelConfig, element_size: int, bandwidth_gbs: float) -> float:
    """The bytes one decode step must read (weights, and the KV cache up to the mean position of
    the steps) over the measured HBM bandwidth, in seconds."""
    s, n = record["seq_len"], record["decode_tokens"]
    cache = record["kv_cache_bytes"] * (s + (n + 1) / 2) / (s + n)
    return prices.memory_seconds(model.n_params * element_size + cache, bandwidth_gbs)


def decode_tpot_check(p: Plan, quick: bool, hardware: HardwareChoice | None) -> Check:
    cuda = p.device == "cuda" and not quick
    model = ModelConfig.preset("7b") if cuda else p.memory.model
    workload = p.memory.with_(
        model=model, mode="decode", seq_len=16384 if cuda else 256, batch=4, decode_tokens=32 if cuda else 8
    )
    modes = (True, False) if p.device == "cuda" else (False,)
    own = device_profile(p.device)
    runs = {
        graphed: bench(
            Layout("dp", dp=1), workload, own, steps=3, warmup=1, timeout=900, decode_graphs=graphed
        )
        for graphed in modes
    }
    details = {("graphed" if g else "eager"): r for g, r in runs.items()}
    if any(r["status"] != "completed" for r in runs.values()):
        return Check("decode/tpot", "failed", "a decode run did not complete", details)
    bandwidth = hardware.hardware.hbm_bandwidth_gbs if hardware else None
    floor = decode_floor_s(runs[modes[0]], model, workload.element_size, bandwidth) if bandwidth else None
    text = "; ".join(f"{k} TPOT {r['tpot_s'] * 1e3:.2f} ms" for k, r in details.items())
    if floor is None or p.device != "cuda":
        return Check("decode/tpot", "measured", text, details)
    same = runs[True]["decode_tokens_sha1"] == runs[False]["decode_tokens_sha1"]
    ratio = runs[True]["tpot_s"] / floor
    details["floor_s"] = floor
    ok = same and ratio <= TPOT_FLOOR_LIMIT
    summary = (
        f"{text}; floor {floor * 1e3:.2f} ms: graphed {ratio:.2f}x (limit {TPOT_FLOOR_LIMIT}); "
        f"same tokens: {same}"
    )
    return Check("decode/tpot", "passed" if ok else "failed", summary, details)
