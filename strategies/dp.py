"""DP: a full replica per rank, the batch split, gradients all-reduced by torch's DDP.

torch's DistributedDataParallel as its users run it: gradients gathered into buckets (the first
1 MiB, the rest 25 MiB) in the order they become ready, each bucket's all-reduce started as
soon as its last gradient is in, overlapping the rest of backward. Its communication hook sends
every bucket through tspbench.dist.comm (counted; a plain sum, since each rank's loss is already
its share of the global mean).

DDP's first two iterations are not its steady state: the first reduces every gradient in one
bucket after backward while recording the order they arrive in; the second re-buckets in that
order (and broadcasts the new layout from rank 0). ``wrap`` runs both on a short dummy batch, so
every step run or measured here is a steady-state one.

Per rank: the whole model, its micro-batch and DDP's buckets (one more gradient-sized buffer,
held across steps). Collectives: one all-reduce per bucket in backward, and the loss all-reduce.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from tspbench.core.spec import Layout, Workload
from tspbench.costs.memory import ActivationTerms
from tspbench.dist import comm
from tspbench.strategy import LocalBatch, Piece, Placement, Strategy, Traffic, register

FIRST_BUCKET_BYTES = 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb


def ddp_buckets(sizes: list[int], first: int = FIRST_BUCKET_BYTES, cap: int = BUCKET_BYTES) -> list[int]:
    """Bytes of each DDP bucket for gradients of ``sizes`` bytes, in the order they become ready.

    As torch's compute_bucket_assignment_by_size: gradients join the open bucket until it holds
    at least its limit (``first`` for the first bucket, ``cap`` after), which closes it.
    """
    buckets, current, limit = [], 0, first
    for nbytes in sizes:
        current += nbytes
        if current >= limit:
            buckets.append(current)
            current, limit = 0, cap
    return buckets + ([current] if current else [])


class _LossOf(nn.Module):
    """The model's summed token loss as one forward, so DDP's forward hooks run around it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, targets: Tensor, positions: Tensor) -> Tensor:
        return self.model.loss_sum(tokens, targets, positions)


def _counted_all_reduce(strategy, bucket):  # unannotated: DDP checks annotations, strings here fail
    """DDP communication hook: the bucket (a dist.GradBucket) summed over dp by
    tspbench.dist.comm, asynchronously; returns the Future of the summed buffer."""
    buffer = bucket.buffer()
    strategy.buckets[bucket.index()] = buffer
    return comm.all_reduce(buffer, strategy.group("dp"), async_op=True).future()


@register
class DataParallel(Strategy):
    name = "dp"
    axes = ()
    summary = "data parallel (torch DDP): whole model per rank, batch split, bucketed all-reduce in backward"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ddp: DistributedDataParallel | None = None
        self.buckets: dict[int, Tensor] = {}

    def placement(self, name: str, shape: tuple[int, ...]) -> Placement:
        return Placement((Piece(name),))  # DDP reduces the gradients, in backward

    @classmethod
    def fake_world_obstacle(cls, layout: Layout, workload: Workload) -> str | None:
        if layout.dp > 1 and workload.mode == "train":
            return (
                "torch DDP's C++ reducer reads the gradients' storage directly when it builds its "
                "buckets, which fake tensors do not have (prefill, or dp 1, runs)"
            )
        return None

    def wrap(self, model: nn.Module) -> None:
        dp = self.group("dp")
        if dp.size == 1 or self.workload.mode != "train":
            return
        self.ddp = DistributedDataParallel(_LossOf(model), process_group=dp.pg, init_sync=False)
        self.ddp.register_comm_hook(self, _counted_all_reduce)
        tokens = torch.zeros(1, 8, dtype=torch.long, device=self.device)
        for _ in range(2):  # DDP's bucket-discovery iteration and its re-bucketing one (module doc)
            self.ddp(tokens, tokens, torch.arange(8, device=self.device)).backward()
        model.zero_grad(set_to_none=True)

    def loss(self, model: nn.Module, batch: LocalBatch) -> Tensor:
        if self.ddp is None:
            return super().loss(model, batch)
        return self.ddp(batch.tokens, batch.targets, batch.positions) / batch.global_tokens

    def resident_tensors(self) -> list[Tensor]:
        return list(self.buckets.values())

    def bucket_bytes(self) -> list[int]:
        """DDP's buckets in steady state: gradients become ready in reverse registration order."""
        elt = self.workload.element_size
        sizes = [torch.Size(shape).numel() * elt for shape, _ in self.local_parameters().values()]
        return ddp_buckets(sizes[::-1])

    def traffic(self) -> list[Traffic]:
        if self.workload.mode != "train":
            return []
        buckets = self.bucket_bytes()  # every bucket but the last overlaps the rest of backward
        last = len(buckets) - 1
        return [
            Traffic("all_reduce", ("dp",), b, 1, "backward", "model", i < last) for i, b in enumerate(buckets)
        ]

    def activation_terms(self) -> ActivationTerms:
        terms = super().activation_terms()
        if self.workload.mode != "train" or self.mesh.size("dp") == 1:
            return terms
        return replace(terms, resident=sum(self.bucket_bytes()))
