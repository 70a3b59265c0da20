"""The GPU check: one command for a machine with a GPU, under five minutes, one JSON report.

    tspbench gpu-check --out results/gpu_check        (or: make gpu-check)

1. ``calibrate``: achievable bf16 GEMM and flash-attention rates and HBM bandwidth.
2. Bottom-right causal attention on the flash path (a query chunk at an offset inside a longer
   key prefix, what sequence-parallel strategies run): forward and gradients against the
   rows of a full causal attention, in bf16.
3. Every registered strategy at world size 1 on CUDA in bf16 on a few layers of the paper's 7B
   at 32K tokens (after checking SDPA restricted to FLASH_ATTENTION runs those shapes): the
   allocator's peak next to the analytic model's prediction, and the measured step time next to
   the time model's prediction from step 1's calibration (written beside the report).

``--device cpu --quick`` runs the same code on a tiny model on CPU (what the test suite does, so
the script cannot rot on machines without a GPU).
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.measure.bench import bench
from tspbench.measure.calibrate import calibrate
from tspbench.measure.env import environment
from tspbench.model.layers import causal_attention
from tspbench.strategy import iter_strategies


def offset_attention_check(device: str, dtype: torch.dtype) -> dict[str, float]:
    """Max relative error of o, dq, dk, dv for a query chunk at an offset (Sq < Sk)."""
    torch.manual_seed(0)
    b, heads, sk, sq, d = 1, 8, 2048, 512, 128 if device == "cuda" else 32
    q = torch.randn(b, heads, sq, d, device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(b, heads, sk, d, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
    grad = torch.randn(b, heads, sq, d, device=device, dtype=dtype)
    out = causal_attention(q, k, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    full_q = torch.zeros(b, heads, sk, d, device=device, dtype=torch.float32)
    full_q[:, :, sk - sq :] = q.detach().float()
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (full_q, k, v))
    ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True)[:, :, sk - sq :]
    rq, rk, rv = torch.autograd.grad(ref, (qf, kf, vf), grad.float())

    def rel(a: torch.Tensor, b_: torch.Tensor) -> float:
        return float((a.detach().float() - b_.detach()).norm() / b_.detach().norm())

    return {"o": rel(out, ref), "dq": rel(dq, rq[:, :, sk - sq :]), "dk": rel(dk, rk), "dv": rel(dv, rv)}


def workload_of(device: str, quick: bool) -> Workload:
    if quick:
        return Workload(ModelConfig.preset("tiny"), 1, 1024, "train", "none", "float32", device)
    model = replace(ModelConfig.preset("7b"), n_layers=4, name="7b-4layers")
    return Workload(model, 1, 32768, "train", "none", "bfloat16", device)


def strategy_points(device: str, quick: bool) -> list[tuple[Layout, Workload]]:
    workload = workload_of(device, quick)
    return [(Layout(cls.name), workload) for cls in iter_strategies()]


def run(device: str, quick: bool, out: Path) -> dict[str, object]:
    report: dict[str, object] = {"environment": environment(device), "device": device, "quick": quick}
    start = time.perf_counter()
    workload = workload_of(device, quick)
    calibration = calibrate(ranks=1, model=workload.model, seq_len=workload.seq_len, quick=quick)
    report["calibration"], report["calibration_warnings"] = calibration.profile, calibration.warnings
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    profile = out / f"gpu_check_{device}_{stamp}_profile.yaml"  # each step predicted from it
    profile.write_text(yaml.safe_dump(calibration.profile, sort_keys=False))
    dtype = torch.bfloat16 if device == "cuda" else torch.float64
    report["offset_attention_rel_err"] = offset_attention_check(device, dtype)
    if device == "cuda":
        report["flash_attention_runs"] = flash_probe(workload_of(device, quick))
    points = []
    for layout, workload in strategy_points(device, quick):
        try:
            record = bench(layout, workload, steps=3, warmup=1, timeout=600, hardware=str(profile))
        except Exception as exc:  # a broken strategy must not hide the others' results
            record = {"strategy": layout.strategy, "status": "failed", "error": traceback.format_exc(limit=3)}
            record["exception"] = str(exc)
        points.append({k: record.get(k) for k in KEEP})
    report["strategies"] = points
    report["seconds"] = time.perf_counter() - start
    path = out / f"gpu_check_{device}_{stamp}.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    report["path"] = str(path)
    return report


KEEP = (
    "strategy",
    "model",
    "seq_len",
    "dtype",
    "status",
    "error",
    "step_time_s",
    "tokens_per_s_per_gpu",
    "tflops_per_gpu",
    "peak_memory_bytes",
    "peak_memory_reserved_bytes",
    "predicted_peak_memory_bytes",
    "predicted_memory_error",
    "predicted_step_time_s",
    "predicted_step_time_error",
    "predicted_compute_s",
    "predicted_comm_exposed_s",
    "hardware_flops_per_step_per_gpu",
    "predicted_hardware_flops_per_gpu",
)


def flash_probe(workload: Workload) -> bool:
    """SDPA restricted to the flash kernel runs the strategies' attention shapes. Flash is SDPA's
    first choice, so the ranks (other processes, unrestricted) take it too."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cfg = workload.model
    q = torch.randn(1, cfg.n_heads, 1024, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return True
    except RuntimeError:
        return False
