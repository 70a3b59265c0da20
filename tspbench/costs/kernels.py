"""Kernels one training or prefill step launches on a rank, counted from the code the step runs
(tspbench/model: eager PyTorch, one kernel per aten op that computes), and the ops without a
kernel (views, reshapes) the host still dispatches. The closed form prices each kernel's fixed
cost and each op's host time from these (tspbench.analytic.timing), as the timeline does op by op.

Per layer and outside the layers (embedding, RoPE's table, the final norm, the head, the loss),
as the traced step of a single rank holding the whole model shows them (tests/costs/
test_kernels.py counts them on traced steps):

                          GEMM  attention  element-wise 16-bit (32-bit)  no kernel
    forward, a layer        7       1          30 (28)                     31
    backward, a layer      14       1          48 (42)                     89
    recompute, a layer      6       1          29 (27)                     55   (full: each block
                                                                                 again; selective:
                                                                                 the attention core,
                                                                                 1 attention, 7 views;
                                                                                 op: 3 GEMMs, wk wo w3,
                                                                                 no attention, every
                                                                                 element-wise op, 61
                                                                                 views, 63 on CUDA)
    forward, outside        1       0          train 26 (25), infer 20 (19) train 8, infer 5
    backward, outside       2       0          19 (14)                     17
    AdamW                   0       0          10 per parameter tensor (9 a layer, 3 outside:
                                               embedding, final norm, head), 32-bit 2 more
    grouped K/V (kv < heads) +2 element-wise and +6 views forward, +4 and +4 backward, a layer

16-bit: the RMSNorm's casts to and from float32 statistics and MasterAdamW's gradient cast and
copy out (tspbench.model.optim). What a strategy's own code adds (its concatenations, its
gather buffers' copies, FSDP2's optimizer over flat shards, TSP's per-chunk attention) is not
counted: these counts are the model's, exact for a rank that holds whole layers without
splitting them (dp), a lower bound for the others.
"""

from __future__ import annotations

from dataclasses import dataclass

from tspbench.core.spec import Workload

# (GEMM, attention, element-wise 16-bit, element-wise 32-bit, no kernel) per layer
FORWARD = (7, 1, 30, 28, 31)
BACKWARD = (14, 1, 48, 42, 89)
RECOMPUTE = {
    "full": (6, 1, 29, 27, 55),
    "selective": (0, 1, 0, 0, 7),
    "op": (3, 0, 29, 27, 61),
    "none": (0, 0, 0, 0, 0),
}
FORWARD_OUTSIDE = {"train": (1, 0, 26, 25, 8), "infer": (1, 0, 20, 19, 5)}
BACKWARD_OUTSIDE = (2, 0, 19, 14, 17)
# op: the cache detaches each tensor output of the ops it keeps (tspbench.model.recompute); CUDA's
# attention op (cuDNN's) has two more than the CPU kernel's o and log-sum-exp
OP_CUDA_VIEWS = 2
GROUPED_KV = {"forward": (0, 0, 2, 2, 6), "backward": (0, 0, 4, 4, 4)}  # repeated K/V, a layer
ADAMW_PER_TENSOR, ADAMW_32BIT_EXTRA = 10, 2
TENSORS_PER_LAYER, TENSORS_OUTSIDE = 9, 3  # wq wk wv wo w1 w2 w3, two norms; embedding, norm, head


@dataclass(frozen=True)
class StepKernels:
    """A step's kernels on one rank by kind, and its ops without a kernel."""

    gemm: int
    attention: int
    elementwise: int
    views: int

    @property
    def kernels(self) -> int:
        return self.gemm + self.attention + self.elementwise

    @property
    def ops(self) -> int:
        """Every op the host dispatches: kernels and views."""
        return self.kernels + self.views


def _kinds(row: tuple[int, ...], sixteen_bit: bool) -> tuple[int, int, int, int]:
    """(GEMM, attention, element-wise, views) of a table row at the step's element size."""
    return row[0], row[1], row[2] if sixteen_bit else row[3], row[4]


def step_kernels(workload: Workload) -> StepKernels:
    """Kernels and views of one training step or forward of ``workload``'s model on one rank."""
    cfg, sixteen = workload.model, workload.element_size < 4
    rows = [(FORWARD, cfg.n_layers), (FORWARD_OUTSIDE[workload.mode], 1)]
    grouped = cfg.n_kv_heads < cfg.n_heads
    rows += [(GROUPED_KV["forward"], cfg.n_layers)] if grouped else []
    if workload.mode == "train":
        rows += [(BACKWARD, cfg.n_layers), (BACKWARD_OUTSIDE, 1)]
        rows += [(RECOMPUTE[workload.recompute], cfg.n_layers)]
        op_cuda = workload.recompute == "op" and workload.device == "cuda"
        rows += [((0, 0, 0, 0, OP_CUDA_VIEWS), cfg.n_layers)] if op_cuda else []
        rows += [(GROUPED_KV["backward"], cfg.n_layers)] if grouped else []
    totals = [sum(_kinds(row, sixteen)[i] * n for row, n in rows) for i in range(4)]
    return StepKernels(totals[0], totals[1], totals[2] + optimizer_kernels(workload), totals[3])


def optimizer_kernels(workload: Workload) -> int:
    """AdamW's kernels: ADAMW_PER_TENSOR per parameter tensor (tspbench.model.optim), 0 in a forward."""
    if workload.mode != "train":
        return 0
    tensors = TENSORS_PER_LAYER * workload.model.n_layers + TENSORS_OUTSIDE
    return ADAMW_PER_TENSOR * tensors + (0 if workload.element_size < 4 else ADAMW_32BIT_EXTRA)
