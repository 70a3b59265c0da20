"""The strategy plugin interface: the base class every strategy subclasses, and what they share.

A strategy is one small class in ``strategies/`` (installed as ``tspbench.strategies``),
registered by name (tspbench.strategy.registry). It declares the mesh axes
it uses and says, per parameter, which slice of the reference weight a rank holds (a
Placement) and over which axes its gradient is summed. It swaps the model's hook points for
its collectives (``transform``) and states its analytic costs (``traffic``, ``activation_terms``,
``flop_terms``). Everything else (building shards from the reference weights, sharding the
batch, the loss, gradient synchronisation, gathering back to full shape for checks) lives in
the plugin API once and is driven by those declarations.

A plugin subclasses ``Strategy`` only; it is put together from one file per concern:

    base.py       Strategy: the declarations (name, axes, ...), the layout's checks, the planning
                  instance, and what every step runs: the batch, the loss, gradient sync
    weights.py    Weights: the parameters from their Placement: the meta model, each rank's
                  shards of the reference weights, gathering them back for checks
    analysis.py   Analysis: the analytic costs: the step's collectives, shapes, memory, FLOPs
    decode.py     Decoding: decode's cache, slots, steps and their collectives

The hooks a plugin overrides, each with a default:

    check, fake_world_obstacle     base.py      its own layout rules (call super().check)
    loss, logits                   base.py      where its head or loss is sharded
    placement, transform           weights.py   its weights' slices; its collectives in the model
    wrap, resident_tensors         weights.py   torch's own wrappers (DDP, FSDP2) and their buffers
    traffic                        analysis.py  its own collectives in one step
    shapes, activation_terms,      analysis.py  where its shapes, memory or FLOPs differ from a
      flop_terms, elementwise_extra_bytes,      whole-weight rank's
      param_element_size
    decode_traffic                 decode.py    its own collectives in one decode step
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from tspbench.core.errors import LayoutError
from tspbench.core.names import AXES
from tspbench.core.spec import Layout, Workload
from tspbench.dist import comm
from tspbench.dist.comm import Group
from tspbench.dist.mesh import Mesh
from tspbench.dist.zigzag import zigzag_positions, zigzag_shard, zigzag_unshard
from tspbench.strategy.analysis import Analysis
from tspbench.strategy.decode import Decoding
from tspbench.strategy.placement import Placement
from tspbench.strategy.weights import Weights


@dataclass
class LocalBatch:
    """This rank's tokens, targets [B, S] at true positions [S], and the global token count."""

    tokens: Tensor
    targets: Tensor
    positions: Tensor
    global_tokens: int


class Strategy(Analysis, Weights, Decoding):
    """Base class: subclass, set ``name``/``axes``, and give ``placement`` and ``comm_volume``.
    The analytic costs come from tspbench.strategy.analysis.Analysis, the parameters from
    tspbench.strategy.weights.Weights, decode (its cache, slots and steps) from
    tspbench.strategy.decode.Decoding."""

    name: ClassVar[str] = ""
    axes: ClassVar[tuple[str, ...]] = ()  # model-parallel axes this strategy uses, outer to inner
    sequence_axis: ClassVar[str | None] = None  # axis the tokens are zigzag-sharded over
    batch_axes: ClassVar[tuple[str, ...]] = ()  # axes besides dp that split the batch (fsdp)
    vocab_axis: ClassVar[str | None] = None  # axis the logits' vocabulary is sharded over
    weight_axes: ClassVar[tuple[str, ...]] = ()  # axes that shard the weights (1/product per rank)
    padded_shards: ClassVar[bool] = False  # FSDP: flat dim-0 shards, padded; sizes need not divide
    channels: ClassVar[int] = 1  # independent communicators per axis
    summary: ClassVar[str] = ""
    # workload switches this strategy acts on ("megatron_sp", "overlap"); setting one it ignores
    # is refused (tspbench.strategy.registry.check_layout): a record would claim what never ran
    switches: ClassVar[tuple[str, ...]] = ()

    def __init__(self, layout: Layout, workload: Workload, mesh: Mesh, device: torch.device) -> None:
        self.layout, self.workload, self.mesh, self.device = layout, workload, mesh, device
        self.config = workload.model
        self.placements: dict[str, Placement] = {}

    # ------------------------------------------------------------------ planning (no processes)
    @classmethod
    def mesh_dims(cls, layout: Layout) -> dict[str, int]:
        return {"dp": layout.dp, **{a: layout.degree(a) for a in cls.axes}}

    @classmethod
    def data_axes(cls) -> tuple[str, ...]:
        """Axes over which ranks see different tokens: their gradients are summed over these."""
        return cls.batch_split_axes() + ((cls.sequence_axis,) if cls.sequence_axis else ())

    @classmethod
    def batch_split_axes(cls) -> tuple[str, ...]:
        """Axes over which ranks take different sequences (dp, and fsdp's ranks)."""
        return ("dp", *cls.batch_axes)

    @classmethod
    def check(cls, layout: Layout, workload: Workload) -> None:
        """Raise LayoutError naming what is wrong; strategies extend with their own rules."""
        unused = [a for a in AXES if a != "dp" and a not in cls.axes and layout.degree(a) != 1]
        if unused:
            raise LayoutError(
                f"strategy {cls.name!r} uses axes {['dp', *cls.axes]}; "
                f"{', '.join(f'{a}={layout.degree(a)}' for a in unused)} must be 1"
            )
        if layout.strategy != cls.name:
            raise LayoutError(f"layout names strategy {layout.strategy!r}, not {cls.name!r}")
        cfg = workload.model
        for axis in () if cls.padded_shards else cls.weight_axes:  # heads, MLP, vocabulary split
            for what in ("n_heads", "n_kv_heads", "ffn_hidden", "vocab_size"):
                divisible(getattr(cfg, what), layout.degree(axis), what, axis)
        if workload.mode == "decode" and workload.megatron_sp:
            raise LayoutError(
                "megatron_sp: decode runs without Megatron sequence parallelism (mode 'decode')"
            )
        if cls.sequence_axis:
            parts = layout.degree(cls.sequence_axis)
            if workload.seq_len % (2 * parts):
                raise LayoutError(
                    f"seq_len {workload.seq_len} must be divisible by 2 x "
                    f"{cls.sequence_axis} = {2 * parts} (zigzag chunks)"
                )

    @classmethod
    def fake_world_obstacle(cls, layout: Layout, workload: Workload) -> str | None:
        """Why this point cannot execute under fake tensors (tspbench.measure.fake), or None.
        Strategies whose wrapper reads tensor data outside the dispatcher say so here."""
        return None

    @classmethod
    def for_analysis(cls, layout: Layout, workload: Workload) -> Strategy:
        """An instance for analysis: the layout's sizes, no process groups, nothing allocated."""
        return cls(layout, workload, Mesh.planning(cls.mesh_dims(layout), cls.channels), torch.device("meta"))

    # ------------------------------------------------------------------ the mesh
    def _axis(self, axis: str | None) -> tuple[int, int]:
        """(ranks over ``axis``, this rank's index on it); (1, 0) for no axis."""
        return (1, 0) if axis is None else (self.mesh.size(axis), self.mesh.index(axis))

    def group(self, *axes: str, channel: int = 0) -> Group:
        return self.mesh.group(*axes, channel=channel)

    # ------------------------------------------------------------------ data and loss
    def shard_batch(self, tokens: Tensor, targets: Tensor) -> LocalBatch:
        """Split the global batch [dp B, S]: batch over dp (and ``batch_axes``), sequence zigzag
        over ``sequence_axis``."""
        split = self.group(*self.batch_split_axes())
        dp, r = split.size, split.rank
        tokens, targets = tokens.chunk(dp, dim=0)[r], targets.chunk(dp, dim=0)[r]
        seq_len = tokens.shape[1]
        global_tokens = dp * tokens.numel()
        parts, index = self._axis(self.sequence_axis)
        positions = zigzag_positions(seq_len, parts, index, tokens.device)
        return LocalBatch(
            zigzag_shard(tokens, parts, index), zigzag_shard(targets, parts, index), positions, global_tokens
        )

    def loss(self, model: nn.Module, batch: LocalBatch) -> Tensor:
        """This rank's share of the global mean loss: its token-loss sum / global tokens."""
        return model.loss_sum(batch.tokens, batch.targets, batch.positions) / batch.global_tokens

    def logits(self, model: nn.Module, batch: LocalBatch) -> Tensor:
        return model(batch.tokens, batch.positions)

    def reduce_loss(self, loss: Tensor) -> Tensor:
        """The global mean loss (all-reduce over the data axes)."""
        return comm.all_reduce(loss.detach().clone(), self.group(*self.data_axes()))

    def sync_grads(self, model: nn.Module) -> None:
        """All-reduce each gradient over its placement's ``reduce`` axes.

        Not bucketed: one in-place all-reduce per gradient tensor, all issued async after
        backward and then waited on, so no flat copy of the gradients is ever allocated.
        """
        pending = []
        for name, p in model.named_parameters():
            axes = self.placements[name].reduce
            if p.grad is not None and axes:
                pending.append(comm.all_reduce(p.grad, self.group(*axes), async_op=True))
        for work in pending:
            work.wait()

    # ------------------------------------------------------------------ checks (not measured)
    def full_logits(self, logits: Tensor) -> Tensor:
        """Local logits [B, S_local, V_local] -> the global [dp B, S, V] in sequence order."""
        if self.vocab_axis:
            logits = comm.all_gather(logits.contiguous(), self.group(self.vocab_axis), dim=-1)
        if self.sequence_axis:
            logits = zigzag_unshard(
                comm.all_gather(logits.contiguous(), self.group(self.sequence_axis)), dim=1
            )
        return comm.all_gather(logits.contiguous(), self.group(*self.batch_split_axes()), dim=0)


def divisible(value: int, by: int, what: str, axis: str) -> None:
    """Raise LayoutError unless ``value`` (named ``what``) is divisible by degree ``by`` of ``axis``."""
    if value % by:
        raise LayoutError(f"{what} {value} is not divisible by {axis} = {by}")
