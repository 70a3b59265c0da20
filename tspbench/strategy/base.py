"""The strategy plugin interface: the base class every strategy subclasses, and what they share.

A strategy is one small class in ``strategies/`` (installed as ``tspbench.strategies``),
registered by name (tspbench.strategy.registry). It declares the mesh axes
it uses and says, per parameter, which slice of the reference weight a rank holds (a
Placement) and over which axes its gradient is summed. It swaps the model's hook points for
its collectives (``transform``) and states its analytic costs (``traffic``, ``activation_terms``,
``flop_terms``). Everything else (building shards from the reference weights, sharding the
batch, the loss, gradient synchronisation, gathering back to full shape for checks) lives here
once and is driven by those declarations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from tspbench.core.errors import LayoutError
from tspbench.core.names import AXES
from tspbench.core.spec import Layout, Workload
from tspbench.costs.elementwise import step_bytes
from tspbench.costs.flops import FlopTerms, autograd_flops
from tspbench.costs.memory import ActivationTerms, MemoryPrediction, Shapes, autograd_terms, predict_memory
from tspbench.dist import comm
from tspbench.dist.comm import CommRecord, Group
from tspbench.dist.mesh import Mesh
from tspbench.dist.zigzag import zigzag_positions, zigzag_shard, zigzag_unshard
from tspbench.model.optim import torch_dtype
from tspbench.model.transformer import Transformer, reference_parameter
from tspbench.strategy.decode import Decoding
from tspbench.strategy.placement import Piece, Placement, reference_shape
from tspbench.strategy.traffic import Traffic, with_recomputation


@dataclass
class LocalBatch:
    """This rank's tokens, targets [B, S] at true positions [S], and the global token count."""

    tokens: Tensor
    targets: Tensor
    positions: Tensor
    global_tokens: int


class Strategy(Decoding):
    """Base class: subclass, set ``name``/``axes``, and give ``placement`` and ``comm_volume``.
    Decode (its cache, slots and steps) comes from tspbench.strategy.decode.Decoding."""

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
    def comm_volume(cls, layout: Layout, workload: Workload) -> list[CommRecord]:
        """Analytic collectives of one training or inference step on one rank (every rank alike)."""
        sized = cls.for_analysis(layout, workload)
        return [sized.record(t) for t in sized.step_traffic() if sized.mesh.size(*t.axes) > 1]

    def record(self, t: Traffic) -> CommRecord:
        label = "+".join(a for a in self.mesh.names if a in t.axes) + (f"#{t.channel}" if t.channel else "")
        return CommRecord(t.op, t.phase, self.mesh.size(*t.axes), t.msg_bytes, t.count, group=label)

    def step_traffic(self) -> list[Traffic]:
        """Everything one step moves: the strategy's own traffic with what recomputation repeats,
        the gradient all-reduces and the loss all-reduce; in decode mode the prefill (its
        ``traffic``, phase forward), the first token and ``decode_tokens`` steps (phase decode)."""
        out = with_recomputation(self.traffic(), self.workload)
        if self.workload.mode == "decode":
            out += [t for t in self.decode_run_traffic() if t.count]
        if self.workload.mode == "train":
            elt = self.workload.element_size
            for shape, placement in self.local_parameters().values():
                if placement.reduce:
                    nbytes = math.prod(shape) * elt
                    out.append(
                        Traffic("all_reduce", placement.reduce, nbytes, 1, "optimizer", "model", batched=True)
                    )
            out.append(Traffic("all_reduce", self.data_axes(), elt, 1, "forward", "model"))
        return out

    def traffic(self) -> list[Traffic]:
        """This strategy's own collectives in one step (mode-aware); see Traffic."""
        return []

    def shapes(self) -> Shapes:
        """Per-rank sizes for the analytic model: whole weights, tokens split over ``sequence_axis``."""
        cfg, w = self.config, self.workload
        return Shapes(
            w.batch,
            self.local_seq,
            self.local_seq,
            w.seq_len,
            cfg.hidden,
            cfg.n_heads * cfg.head_dim,
            cfg.kv_hidden,
            cfg.ffn_hidden,
            cfg.vocab_size,
            cfg.n_heads,
            self._axis(self.sequence_axis)[0],
            w.element_size,
            cfg.n_layers,
        )

    def activation_terms(self) -> ActivationTerms:
        """This strategy's activation and working-memory terms (see tspbench.memory_model)."""
        return autograd_terms(self.shapes())

    def elementwise_layer_bytes(self) -> int:
        """Bytes of the activations one block computes on this rank, the basis of the time
        model's element-wise passes (tspbench.analytic.timing): what autograd saves of them
        when nothing is recomputed."""
        return self.activation_terms().saved_layer["none"]

    def elementwise_step_bytes(self) -> int:
        """Bytes the step's element-wise kernels move on this rank, the optimizer apart: the
        model's operators in this rank's shapes (tspbench.costs.elementwise) and what the
        strategy's own code adds."""
        w, vocab = self.workload, self.vocab_axis
        vocab_parts = self.mesh.size(vocab) if vocab else 1
        return step_bytes(self.shapes(), w.mode, w.recompute, vocab_parts) + self.elementwise_extra_bytes()

    def elementwise_extra_bytes(self) -> int:
        """What this strategy's own code adds to the model's element-wise work (copies,
        concatenations); nothing by default."""
        return 0

    @property
    def param_element_size(self) -> int:
        """Bytes of an element of the parameters this rank holds and its optimizer steps."""
        return self.workload.element_size

    def flop_terms(self) -> FlopTerms:
        """Hardware FLOPs of one step on this rank (see tspbench.flops)."""
        return autograd_flops(self.shapes(), self.workload.mode, self.workload.recompute)

    def predict_memory(self, terms: ActivationTerms | None = None) -> MemoryPrediction:
        elt = self.workload.element_size
        params = {n: math.prod(shape) * elt for n, (shape, _) in self.local_parameters().items()}
        terms = terms or self.activation_terms()
        return predict_memory(terms, params, self.workload.mode, self.workload.recompute, elt)

    # ------------------------------------------------------------------ sizes for analytic counts
    @property
    def local_batch(self) -> int:
        """Sequences per rank: the micro-batch (dp splits the global batch, not the micro-batch)."""
        return self.workload.batch

    @property
    def local_seq(self) -> int:
        """Tokens per sequence on this rank."""
        parts = self._axis(self.sequence_axis)[0]
        return self.workload.seq_len // parts

    # ------------------------------------------------------------------ model
    def placement(self, name: str, shape: tuple[int, ...]) -> Placement:
        """Where local parameter ``name`` of the (unsharded-shape) meta model comes from."""
        return Placement((Piece(name),), reduce=self.data_axes())

    def transform(self, model: Transformer) -> None:
        """Swap hook points and modules for this strategy's collectives (on the meta model)."""

    def wrap(self, model: nn.Module) -> None:
        """Hand the built model, its weights materialized, to torch's own parallel wrappers
        (DDP's reducer, FSDP2's fully_shard), in place: it keeps its parameter names."""

    def resident_tensors(self) -> list[Tensor]:
        """Buffers a wrapper holds across steps besides parameters, gradients and optimizer
        state (DDP's gradient buckets): the CPU memory tracker counts them from a step's start."""
        return []

    def _meta_model(self) -> Transformer:
        with torch.device("meta"):
            model = Transformer(self.config, seed=None)
        self.transform(model)
        for name, param in model.named_parameters():
            self.placements[name] = self.placement(name, tuple(param.shape))
        return model

    def build(self) -> nn.Module:
        """This rank's model: hooks swapped, every parameter its slice of the reference weights."""
        model = self._meta_model()
        for name, placement in self.placements.items():
            module_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(module_name), attr, nn.Parameter(self.materialize(placement)))
        model.set_recompute(self.workload.recompute)
        self.wrap(model)
        return model

    @classmethod
    def for_analysis(cls, layout: Layout, workload: Workload) -> Strategy:
        """An instance for analysis: the layout's sizes, no process groups, nothing allocated."""
        return cls(layout, workload, Mesh.planning(cls.mesh_dims(layout), cls.channels), torch.device("meta"))

    def local_parameters(self) -> dict[str, tuple[tuple[int, ...], Placement]]:
        """Local shape and placement of every parameter this rank holds (cached: building even a
        meta 7B model costs ~30 ms, and the planner asks for thousands of points)."""
        key = (type(self), self.layout, self.config, self.workload.megatron_sp)
        if key not in _PARAMETER_PLANS:
            self._meta_model()
            _PARAMETER_PLANS[key] = {name: (self.local_shape(pl), pl) for name, pl in self.placements.items()}
        return _PARAMETER_PLANS[key]

    def local_shape(self, placement: Placement) -> tuple[int, ...]:
        parts = self._axis(placement.axis)[0]
        shapes = []
        for piece in placement.pieces:
            shape = list(reference_shape(self.config, piece.full_name))
            if piece.dim is not None:
                shape[piece.dim] //= parts
            shapes.append(shape[::-1] if piece.transpose else shape)
        return (sum(sh[0] for sh in shapes), *shapes[0][1:])

    def materialize(self, placement: Placement) -> Tensor:
        parts, index = self._axis(placement.axis)
        slices = []
        for piece in placement.pieces:
            full = self.reference(piece.full_name)
            part = full if piece.dim is None else full.chunk(parts, dim=piece.dim)[index]
            slices.append(part.t() if piece.transpose else part)
        return torch.cat(slices, dim=0).contiguous() if len(slices) > 1 else slices[0].clone()

    def reference(self, full_name: str) -> Tensor:
        shape = reference_shape(self.config, full_name)
        return reference_parameter(
            self.config, full_name, shape, self.workload.seed, self.device, torch_dtype(self.workload.dtype)
        )

    def _axis(self, axis: str | None) -> tuple[int, int]:
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
    def full_tensors(self, model: nn.Module, grads: bool = False) -> dict[str, Tensor]:
        """Every reference parameter (or its gradient) reassembled at full shape, on every rank."""
        out: dict[str, Tensor] = {}
        for name, p in model.named_parameters():
            local = p.grad if grads else p.detach()
            if local is None:
                local = torch.zeros_like(p)
            if isinstance(local, DTensor):  # FSDP2's shards: DTensor gathers itself
                local = local.full_tensor()
            out.update(self._unshard(self.placements[name], local))
        return out

    def _unshard(self, placement: Placement, local: Tensor) -> dict[str, Tensor]:
        parts, _ = self._axis(placement.axis)
        stacked = (
            comm.all_gather(local.contiguous(), self.group(placement.axis)) if parts > 1 else local[None]
        )
        sizes = [self._piece_rows(piece, placement.axis) for piece in placement.pieces]
        out = {}
        for piece, rows in zip(placement.pieces, stacked.split(sizes, dim=1), strict=True):
            chunks = [r.t() if piece.transpose else r for r in rows.unbind(0)]
            out[piece.full_name] = chunks[0] if piece.dim is None else torch.cat(chunks, dim=piece.dim)
        return {k: v.contiguous() for k, v in out.items()}

    def _piece_rows(self, piece: Piece, axis: str | None) -> int:
        shape = list(reference_shape(self.config, piece.full_name))
        if piece.dim is not None:
            shape[piece.dim] //= self._axis(axis)[0]
        return shape[1] if piece.transpose else shape[0]

    def full_logits(self, logits: Tensor) -> Tensor:
        """Local logits [B, S_local, V_local] -> the global [dp B, S, V] in sequence order."""
        if self.vocab_axis:
            logits = comm.all_gather(logits.contiguous(), self.group(self.vocab_axis), dim=-1)
        if self.sequence_axis:
            logits = zigzag_unshard(
                comm.all_gather(logits.contiguous(), self.group(self.sequence_axis)), dim=1
            )
        return comm.all_gather(logits.contiguous(), self.group(*self.batch_split_axes()), dim=0)


_PARAMETER_PLANS: dict[tuple, dict[str, tuple[tuple[int, ...], Placement]]] = {}


def divisible(value: int, by: int, what: str, axis: str) -> None:
    """Raise LayoutError unless ``value`` (named ``what``) is divisible by degree ``by`` of ``axis``."""
    if value % by:
        raise LayoutError(f"{what} {value} is not divisible by {axis} = {by}")
