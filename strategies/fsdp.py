"""FSDP: torch's FSDP2 (``fully_shard``, ZeRO-3) over D ranks, each with its own micro-batch.

``fully_shard`` on every decoder block and on the root (embedding, final norm, LM head): each
parameter becomes a DTensor holding a dim-0 shard (rows padded up to a multiple of D). Before a
block runs, its parameters are all-gathered in one collective; after its forward they are freed
(reshard after forward) and gathered again for its backward, and its gradients are
reduce-scattered in one collective. The root stays gathered from its forward to the end of
backward (FSDP2's default for the root, whose weights backward needs first). With ``--dp`` it
is HSDP: shards over the fsdp ranks, replicas over dp, the sharded gradients then all-reduced
over dp. Gradients are summed (divide factor 1, plain SUM reductions): each rank's loss is
already its share of the global mean.

The dtype policy (tspbench.model.optim) maps to FSDP's MixedPrecisionPolicy: float64 and
float32 run as they are; bfloat16 keeps float32 shards (the master weights AdamW steps, 16 bytes
per parameter with gradients and state, as MasterAdamW), gathers them in bfloat16 for compute
and reduce-scatters gradients in float32.

Per rank: 1/D of every parameter, gradient and optimizer state (padding aside), the activations
of its own micro-batch, and transiently a whole block's weights (two in backward, where FSDP
prefetches the next block's) and the root's. Collectives per step, P_g the padded parameter
count of a group (a block, or the root):

    forward    all-gather P_g per block and the root                     (fsdp)
    decode     the same per decode step (no_grad forwards; the root resharded after each)
    backward   all-gather P_g per block; reduce-scatter P_g per group     (fsdp)
               all-reduce P_g / D per group                              (dp, HSDP only)
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import ClassVar

import torch
import torch.distributed.fsdp as torch_fsdp
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from tspbench.core.errors import LayoutError
from tspbench.core.spec import Layout, Workload
from tspbench.costs.memory import ActivationTerms, MemoryPrediction, predict_memory
from tspbench.dist.mesh import device_mesh
from tspbench.model.cache import KVCache
from tspbench.strategy import LocalBatch, Piece, Placement, Strategy, Traffic, register

LOW_PRECISION = ("bfloat16",)
FSDP2_API = ("fully_shard", "register_fsdp_forward_method", "MixedPrecisionPolicy", "FSDPModule")
FSDP2_METHODS = ("set_gradient_divide_factor", "set_force_sum_reduction_for_comms")


def missing_fsdp2_api() -> list[str]:
    """What this torch lacks of the FSDP2 API these strategies call (empty on torch 2.13)."""
    missing = [f"torch.distributed.fsdp.{n}" for n in FSDP2_API if not hasattr(torch_fsdp, n)]
    module = getattr(torch_fsdp, "FSDPModule", None)
    return missing + [f"FSDPModule.{m}" for m in FSDP2_METHODS if module and not hasattr(module, m)]


BLOCK_WINDOW = "fsdp block"  # a block's backward: its gather (the next, prefetched) and reduce-scatter


@register
class FullyShardedDataParallel(Strategy):
    name = "fsdp"
    axes = ("fsdp",)
    batch_axes = ("fsdp",)
    weight_axes = ("fsdp",)
    padded_shards = True
    shard_axis: ClassVar[str] = "fsdp"  # the axis FSDP shards over
    summary = "FSDP2 (ZeRO-3): weights, gradients, optimizer state 1/D; a block gathered at a time"

    @classmethod
    def check(cls, layout: Layout, workload: Workload) -> None:
        super().check(layout, workload)
        missing = missing_fsdp2_api()
        if missing:
            raise LayoutError(
                f"strategy {cls.name!r} needs torch's FSDP2; torch {torch.__version__} lacks "
                f"{', '.join(missing)} (torch 2.13 has it all)"
            )
        if workload.dtype not in ("float64", "float32", *LOW_PRECISION):
            raise LayoutError(f"{cls.name}: dtype {workload.dtype!r} has no FSDP mixed-precision mapping")

    def placement(self, name: str, shape: tuple[int, ...]) -> Placement:
        return Placement((Piece(name),))  # whole here; fully_shard shards it and reduces its gradient

    # ------------------------------------------------------------------ the wrapper
    @property
    def low_precision(self) -> bool:
        return self.workload.dtype in LOW_PRECISION

    def device_mesh(self) -> DeviceMesh:
        """tspbench's own process groups as FSDP's mesh: (dp, shard) for HSDP, else (shard,)."""
        dp, shard = self.group("dp"), self.group(self.shard_axis)
        groups, names = ([shard], None) if dp.size == 1 else ([dp, shard], ("dp", self.shard_axis))
        return device_mesh(groups, self.device.type, names)

    def wrap(self, model: nn.Module) -> None:
        if self.mesh.size(self.shard_axis) == 1:
            return  # nothing to shard: the plain model is FSDP on one rank
        policy = torch_fsdp.MixedPrecisionPolicy()
        if self.low_precision:
            _to_float32(model)  # float32 shards are the master weights
            policy = torch_fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        mesh = self.device_mesh()
        for module in self.units(model):
            torch_fsdp.fully_shard(module, mesh=mesh, mp_policy=policy)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)
        for method in ("loss_sum", "prefill", "decode_step"):
            torch_fsdp.register_fsdp_forward_method(model, method)

    def units(self, model: nn.Module) -> tuple[nn.Module, ...]:
        """What ``fully_shard`` wraps, bottom-up: each block, then the root (whose unit takes every
        parameter no block holds: embedding, final norm, LM head)."""
        return (*model.layers, model)

    def logits(self, model: nn.Module, batch: LocalBatch) -> torch.Tensor:
        """Prefill ends with the weights sharded again (FSDP keeps the root gathered only for
        a backward that follows a training forward)."""
        logits = super().logits(model, batch)
        if self.mesh.size(self.shard_axis) > 1:
            model.reshard()
        return logits

    def prefill(
        self, model: nn.Module, batch: LocalBatch, cache: KVCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = super().prefill(model, batch, cache)
        self._reshard(model)
        return out

    def decode_step(self, model: nn.Module, tokens: torch.Tensor, cache: KVCache, step: int) -> torch.Tensor:
        """A no_grad forward: every block gathered and freed, the root gathered, then resharded."""
        logits = super().decode_step(model, tokens, cache, step)
        self._reshard(model)
        return logits

    def _reshard(self, model: nn.Module) -> None:
        if self.mesh.size(self.shard_axis) > 1:
            model.reshard()

    # ------------------------------------------------------------------ analytic terms
    def local_parameters(self) -> dict[str, tuple[tuple[int, ...], Placement]]:
        """Each parameter's padded shard: ceil(rows / D) rows."""
        d = self.mesh.size(self.shard_axis)
        whole = super().local_parameters()
        return {n: ((math.ceil(shape[0] / d), *shape[1:]), pl) for n, (shape, pl) in whole.items()}

    def group_sizes(self) -> tuple[int, int]:
        """Padded parameter counts of (one block, the root) as FSDP gathers them: D x the shard."""
        d = self.mesh.size(self.shard_axis)
        block = root = 0
        for name, (shape, _) in self.local_parameters().items():
            numel = d * math.prod(shape)
            if name.startswith("layers.0."):
                block += numel
            elif not name.startswith("layers."):
                root += numel
        return block, root

    @property
    def gather_bytes(self) -> int:
        """Bytes per element gathered (bfloat16 under the low-precision policy)."""
        return 2 if self.low_precision else self.workload.element_size

    @property
    def reduce_bytes(self) -> int:
        """Bytes per element of gradients, their reduction and the shards (float32 at least)."""
        return 4 if self.low_precision else self.workload.element_size

    def traffic(self) -> list[Traffic]:
        """Nothing hides the root's gather at the start of the step; every later gather and
        reduction runs beside compute (FSDP prefetches on GPUs). In backward a block's gather
        (the next one, prefetched) and reduce-scatter (the one before) are in flight together
        while it runs: the window BLOCK_WINDOW."""
        ax, d, L = (self.shard_axis,), self.mesh.size(self.shard_axis), self.config.n_layers
        block, root = self.group_sizes()
        g, r = self.gather_bytes, self.reduce_bytes
        out = [
            Traffic("all_gather", ax, root * g, 1, "forward", "model"),
            Traffic("all_gather", ax, block * g, L, "forward", "model", hidden=True),
        ]
        if self.workload.mode == "train":
            out += [
                Traffic("all_gather", ax, block * g, L, "backward", "model", True, window=BLOCK_WINDOW),
                Traffic("reduce_scatter", ax, block * r, L, "backward", "model", True, window=BLOCK_WINDOW),
                Traffic("reduce_scatter", ax, root * r, 1, "backward", "model", hidden=True),
                Traffic("all_reduce", ("dp",), block * r // d, L, "backward", "model", hidden=True),
                Traffic("all_reduce", ("dp",), root * r // d, 1, "backward", "model", hidden=True),
            ]
        return out

    def elementwise_extra_bytes(self) -> int:
        """FSDP2's copies around its collectives. Per gather of P parameters: the shard cast to
        the gather dtype (under the low-precision policy), copied into its slot of the gather
        buffer (2g P / D) and copied out into the parameters (2g P); per reduce-scatter, the
        gradients copied into its input (g + r) P. A training step gathers every block twice and
        the root once, and reduces each once."""
        d = self.mesh.size(self.shard_axis)
        if d == 1:
            return 0
        block, root = self.group_sizes()
        g, r = self.gather_bytes, self.reduce_bytes
        cast = (r + g) if self.low_precision else 0

        def gather(p: int) -> int:
            return (cast + 2 * g) * p // d + 2 * g * p

        L, train = self.config.n_layers, self.workload.mode == "train"
        gathers = (2 if train else 1) * L * gather(block) + gather(root)
        return gathers + ((g + r) * (L * block + root) if train else 0)

    def decode_traffic(self) -> list[Traffic]:
        """One decode step: the root's gather and every block's (as a prefill)."""
        ax, L = (self.shard_axis,), self.config.n_layers
        block, root = self.group_sizes()
        return [
            Traffic("all_gather", ax, root * self.gather_bytes, 1, "decode", "model"),
            Traffic("all_gather", ax, block * self.gather_bytes, L, "decode", "model", hidden=True),
        ]

    def decode_weights_bytes(self) -> int:
        """The root's gathered parameters and two blocks' (one in use, the next arriving)."""
        if self.mesh.size(self.shard_axis) == 1:
            return 0
        block, root = self.group_sizes()
        return (root + 2 * block) * self.gather_bytes

    def activation_terms(self) -> ActivationTerms:
        """The shared model under plain autograd on this rank's tokens, plus FSDP's gathered
        weights as working memory, as FSDP2 holds them in eager mode:

            root      gathered from its forward to the end of backward (held_weights)
            forward   a block's gathered parameters and the flat all-gather output they were
                      copied from (kept until the next group's copy-out, and the one before
                      that still referenced during it: the root's for block 0); the last
                      block's flat output lives until the head's forward ends
            backward  the block being differentiated and the next one prefetched, its
                      whole-size gradients and the reduce-scatter input they are copied into
        """
        terms = super().activation_terms()
        if self.mesh.size(self.shard_axis) == 1:
            return terms
        block, root = self.group_sizes()
        g, r = self.gather_bytes, self.reduce_bytes
        return replace(
            terms,
            held_weights=root * g,
            forward_work=2 * block * g + max(terms.forward_work, max(block, root) * g),
            backward_work=terms.backward_work + 2 * block * g + 2 * block * r,
            attention_backward_work=terms.attention_backward_work + 2 * block * g + 2 * block * r,
            head_forward_work=terms.head_forward_work + block * g,
            prefill_head=terms.prefill_head + block * g,
        )

    @property
    def param_element_size(self) -> int:
        """The shards are float32 under bfloat16 (reduce_bytes)."""
        return self.reduce_bytes

    def predict_memory(self, terms: ActivationTerms | None = None) -> MemoryPrediction:
        """Parameters, gradients and optimizer state are the float32 shards under bfloat16."""
        elt = self.param_element_size
        params = {n: math.prod(shape) * elt for n, (shape, _) in self.local_parameters().items()}
        terms = terms or self.activation_terms()
        return predict_memory(terms, params, self.workload.mode, self.workload.recompute, elt)


def _to_float32(model: nn.Module) -> None:
    """``model.float()`` by replacing each floating parameter and buffer: Module._apply swaps
    tensors in place, which fake tensors refuse (their fake-mode memo holds weak references)."""
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if param.is_floating_point():
                setattr(module, name, nn.Parameter(param.detach().float(), param.requires_grad))
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer.is_floating_point():
                setattr(module, name, buffer.float())
