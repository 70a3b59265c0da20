"""The fixed vocabularies of tspbench, in one place (no torch, so the report can use them)."""

from __future__ import annotations

AXES = ("dp", "tp", "sp", "tsp", "fsdp")  # mesh axes; dp is always outermost
# the built-in layouts (tspbench/strategies/), named in --help without importing them (torch)
STRATEGIES = ("dp", "fsdp", "fsdp_sp", "sp", "tp", "tp_sp", "tsp")
# infer: prefill, a forward over every position; decode: prefill a KV cache, then greedy steps
MODES = ("train", "infer", "decode")
# selective: the attention core (Megatron-LM); op: torchtitan's per-op policy (tspbench.model.recompute)
RECOMPUTE_MODES = ("none", "selective", "op", "full")
DEVICES = ("cpu", "cuda")  # ROCm builds of torch expose "cuda" too
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2}
DTYPES = tuple(DTYPE_BYTES)
# What a collective is attributed to; in decode mode the prefill is "forward", each step "decode".
PHASES = ("forward", "backward", "optimizer", "decode")
CUDA_ATTENTION_KERNELS = ("cudnn", "flash")  # what a GPU's attention runs on (tspbench.model.attention)
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "kv_cache", "other")  # peak memory

EXECUTORS = ("local", "slurm", "predict", "fake")  # where a sweep's points run (tspbench.sweep.run)
# A point's status in the results store: pending -> running -> one of FINAL_STATUSES.
STATUSES = ("pending", "running", "completed", "oom", "failed", "timeout", "cancelled")
FINAL_STATUSES = ("completed", "oom", "failed", "timeout", "cancelled")
OK_STATUSES = ("completed", "oom")  # an OOM is a measurement, not an error
# Shown, never stored: a point stored as running whose process is gone (tspbench.sweep.owner).
INTERRUPTED = "interrupted"
