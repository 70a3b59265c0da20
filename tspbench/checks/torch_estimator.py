"""The timeline's compute against torch's own estimator, on the same fake step.

torch.distributed._tools.runtime_estimator.RuntimeEstimator in roofline mode prices every op of
a step run under fake tensors at max(FLOPs / throughput, bytes / DRAM bandwidth) from the GPU's
peak figures. Here one step of the paper's 7B cut to 2 layers (bf16 training, simulated CUDA,
one rank, 8,192 tokens) runs once under both that estimator and the step recorder; torch's
estimate per op kind is held against the timeline's kernel seconds (tspbench.analytic.timeline
.kind_seconds) on the same profile's peaks (H100 SXM datasheet: 989.4 dense bf16 TFLOP/s,
3,350 GB/s). torch's estimator asks a real GPU for those peaks; here they are given to it.

    tspbench check torch-estimator [--hardware h100] [--seq-len 8192]
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from unittest import mock

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import flop_registry

from tspbench.analytic.hardware import Hardware
from tspbench.analytic.timeline import Costs, kernel_seconds, kind_seconds
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.core.trace import CLASS_NAMES, op_class
from tspbench.dist.fake_world import run_fake_ranks
from tspbench.measure import fake_cuda
from tspbench.measure.fake import create_optimizer_state
from tspbench.measure.runner import RankRun
from tspbench.measure.simulated_gpu import simulated_gpu


def estimate(seq_len: int, hw: Hardware) -> dict[str, object]:
    from torch.distributed._tools import runtime_estimator as rte
    from torch.utils import _runtime_estimation as rt

    per_kind: dict[str, float] = defaultdict(float)
    per_op: dict[str, float] = defaultdict(float)
    roofline = rte.RuntimeEstimator._roofline_estimate.__func__

    def counted(cls, func, args, kwargs):
        try:
            out, ms = roofline(cls, func, args, kwargs)
        except AssertionError:  # its limit: one output dtype (flash attention: bf16 o, float32 lse)
            out, ms = same_formula(rt, func, args, kwargs)
        per_kind[CLASS_NAMES[op_class(func._overloadpacket.__name__)]] += ms / 1e3
        per_op[func._overloadpacket.__name__] += ms / 1e3
        return out, ms

    model = ModelConfig.preset("7b").cut_to(2)
    workload = Workload(model, 1, seq_len, "train", "none", "bfloat16", "cuda")
    patches = [
        mock.patch.object(torch.cuda, "is_available", lambda: True),
        mock.patch.object(rt, "get_device_tflops", lambda dtype: hw.peak_tflops),
        mock.patch.object(rt, "get_gpu_dram_gbps", lambda: hw.hbm_bandwidth_gbs),
        mock.patch.object(rte.RuntimeEstimator, "_roofline_estimate", classmethod(counted)),
    ]
    with FakeTensorMode(), simulated_gpu("cuda"):
        run = RankRun(Layout("dp"), workload, torch.device("cuda", 0))
        create_optimizer_state(run)
        for p in patches:
            p.start()
        try:
            with rte.RuntimeEstimator()("operator-level-cost-model") as estimator:
                measured = run.measured_step(trace=True)
        finally:
            for p in reversed(patches):
                p.stop()
    costs = Costs(hw, 1)
    ours = kind_seconds(measured.trace, costs)
    ev, seconds = measured.trace.events, kernel_seconds(measured.trace, costs)
    our_op: dict[str, float] = defaultdict(float)
    for i in range(len(ev)):
        our_op[measured.trace.names[ev["name"][i]]] += float(seconds[i])
    gaps = sorted(set(per_op) | set(our_op), key=lambda n: -abs(per_op.get(n, 0) - our_op.get(n, 0)))[:8]
    kinds = ("gemm", "attention", "elementwise")
    return {
        "hardware": hw.name,
        "seq_len": seq_len,
        "torch_total_s": estimator.total_runtime / 1e3,
        "torch_s": {k: per_kind.get(k, 0.0) for k in kinds},
        "timeline_s": {k: ours[k] for k in kinds},
        "ratio": {k: ours[k] / per_kind[k] if per_kind.get(k) else None for k in kinds},
        "largest_gaps_s": {n: {"torch": per_op.get(n, 0.0), "timeline": our_op.get(n, 0.0)} for n in gaps},
    }


def same_formula(rt, func, args, kwargs) -> tuple[object, float]:
    """torch's roofline for an op it refuses, done as it does it: max(FLOPs at its compute rate in
    the first float output's dtype, bytes at DRAM bandwidth), in ms."""
    kwargs = kwargs or {}
    out = func(*args, **kwargs)
    flat_in, flat_out = pytree.tree_leaves((args, kwargs)), pytree.tree_leaves(out)
    dtype = next(t.dtype for t in flat_out if isinstance(t, torch.Tensor))
    flops = flop_registry[func._overloadpacket](*args, **kwargs, out_val=out)
    return out, max(rt.get_transfer_time(flat_in, flat_out), rt.flops_to_ns(flops, dtype)) / 1e6


def torch_estimator(out: Path, hw: Hardware, seq_len: int = 8192) -> dict[str, object]:
    """``estimate`` on the profile ``hw`` in a fake-world worker (the shim that lets autograd take
    fake CUDA tensors is preloaded there), written to ``out``/torch_estimator.json and returned."""
    env = fake_cuda.preload_env("cuda")
    result = run_fake_ranks(estimate, [0], 1, seq_len, hw, workers=1, env=env)[0]
    out.mkdir(parents=True, exist_ok=True)
    (out / "torch_estimator.json").write_text(json.dumps(result, indent=2))
    return result
