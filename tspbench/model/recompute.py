"""Op-level selective recomputation: torchtitan's ``selective_ac_option = "op"`` policy.

torchtitan checkpoints each decoder block with torch's selective activation checkpointing
(``torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=...)`` with
``create_selective_checkpoint_contexts``) and a policy that decides, op by op in the block's
forward, whose outputs are kept for backward and which ops run again:

    saved        every aten.mm output except every second one (the 2nd, 4th, 6th ... mm of
                 the block's forward are recomputed), every SDPA attention op's outputs (the
                 attention output and its log-sum-exp), c10d functional reduce_scatter_tensor
    recomputed   everything else (norms, RoPE, the gated product, views, collectives that are
                 not the functional reduce-scatter)

The mm counter lives in one dict per checkpointed call (``block_context``), keyed by whether
the op runs in the forward or in the recompute, as torchtitan keys it. (torch 2.13's recompute
replays the forward's decisions from its cache without asking the policy, so only the forward
counter moves there; the key is kept so the policy means the same on torch versions that ask.)

For the shared model (module legend in tspbench.model.transformer) a block's forward calls mm
seven times, wq wk wv wo w1 w3 w2: wq, wv, w1, w2 are saved, with the attention output and
its log-sum-exp; wk, wo, w3 are recomputed. Strategies that call mm more often per block
(TSP: the projections once per head block) get the same rule over their own sequence.

This project's own collectives (tspbench.dist.comm) are c10d ops that write into a tensor
they are given; torch's cache cannot replay such a write, so only the functional
reduce-scatter (which returns a new tensor) is in the saved set, as in torchtitan: a
Megatron-SP reduce-scatter of tspbench.dist.comm runs again in the recompute.

A kept output must not be written in place afterwards (torch's cache refuses it at the
recompute): the attention merge leaves its kernels' outputs intact under this mode
(tspbench.model.attention.keeping_kernel_outputs). TP's in-place all-reduce of the MLP output
writes into w2's kept output, which is safe: the recompute stops at w2's inputs, the last
tensors backward needs (torch's early stop, its default), and never asks the cache for it.

Nothing here imports torch.distributed (the functional op is looked up on ``torch.ops``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from functools import partial

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    SelectiveCheckpointContext,
    create_selective_checkpoint_contexts,
)

from tspbench.model.attention import keeping_kernel_outputs

MM = torch.ops.aten.mm.default


def _ops(*names: tuple[str, str]) -> frozenset:
    """The default overloads of ``namespace.op`` names this torch build has."""
    found = set()
    for namespace, name in names:
        packet = getattr(getattr(torch.ops, namespace), name, None) if hasattr(torch.ops, namespace) else None
        if packet is not None:
            found.add(packet.default)
    return frozenset(found)


# The attention ops tspbench.model.attention calls (CPU flash; CUDA cuDNN and flash; SDPA's
# efficient kernel and math path where SDPA picks them) and torchtitan's reduce-scatter.
SAVED_OPS = _ops(
    ("aten", "_scaled_dot_product_flash_attention"),
    ("aten", "_scaled_dot_product_efficient_attention"),
    ("aten", "_scaled_dot_product_cudnn_attention"),
    ("aten", "_scaled_dot_product_flash_attention_for_cpu"),
    ("_c10d_functional", "reduce_scatter_tensor"),
) | {MM}


def policy(
    counts: dict[str, int], ctx: SelectiveCheckpointContext, func, *args, **kwargs
) -> CheckpointPolicy:
    """Save ``func``'s output if it is in SAVED_OPS, unless it is an even-numbered mm."""
    key = "recompute_mm_count" if ctx.is_recompute else "forward_mm_count"
    if func == MM:
        counts[key] += 1
    save = func in SAVED_OPS and not (func == MM and counts[key] % 2 == 0)
    return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE


def block_context() -> tuple:
    """The two dispatch modes of one checkpointed block call, with a fresh mm counter."""
    return create_selective_checkpoint_contexts(partial(policy, defaultdict(int)))


def checkpoint_ops(fn: Callable, *args):
    """``fn(*args)`` under op-level selective recomputation (module doc); attention kernels'
    outputs stay as they came out (keeping_kernel_outputs), in the forward and the recompute."""
    return torch.utils.checkpoint.checkpoint(
        _keeping, fn, *args, use_reentrant=False, context_fn=block_context
    )


def _keeping(fn: Callable, *args):
    with keeping_kernel_outputs():
        return fn(*args)
