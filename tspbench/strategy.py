"""The strategy plugin interface, the registry, and what every strategy shares.

A strategy is one small class in ``strategies/``, registered by name. It declares the mesh axes
it uses and says, per parameter, which slice of the reference weight a rank holds (a
Placement) and over which axes its gradient is summed. It swaps the model's hook points for
its collectives (``transform``) and gives its analytic communication per step
(``comm_volume``). Everything else (building shards from the reference weights, sharding the
batch, the loss, gradient synchronisation, gathering back to full shape for checks) lives here
once and is driven by those declarations.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import ClassVar

import torch
from torch import Tensor, nn

from tspbench import comm
from tspbench.comm import CommRecord, Group
from tspbench.flops import FlopTerms, autograd_flops
from tspbench.memory_model import ActivationTerms, MemoryPrediction, Shapes, autograd_terms, predict_memory
from tspbench.mesh import AXES, Layout, LayoutError, Mesh
from tspbench.model import RECOMPUTE_MODES, ModelConfig, Transformer, reference_parameter
from tspbench.optim import DTYPES
from tspbench.zigzag import zigzag_positions, zigzag_shard, zigzag_unshard

MODES = ("train", "infer")


@dataclass(frozen=True)
class Workload:
    """What a measured point runs, besides its layout. ``batch`` is the micro-batch per replica."""

    model: ModelConfig
    batch: int = 1
    seq_len: int = 512
    mode: str = "train"
    recompute: str = "none"
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    megatron_sp: bool = False  # tp, tp_sp: Megatron's sequence-parallel norms and residual stream
    overlap: bool = True  # tsp: overlap weight movement with compute

    def __post_init__(self) -> None:
        checks = [
            ("mode", self.mode, MODES),
            ("recompute", self.recompute, RECOMPUTE_MODES),
            ("dtype", self.dtype, tuple(DTYPES)),
            ("device", self.device, ("cpu", "cuda")),
        ]
        for key, value, allowed in checks:
            if value not in allowed:
                raise LayoutError(f"{key} must be one of {list(allowed)}, got {value!r}")
        for key in ("batch", "seq_len"):
            if getattr(self, key) < 1:
                raise LayoutError(f"{key} must be >= 1, got {getattr(self, key)}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def element_size(self) -> int:
        return self.torch_dtype.itemsize

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["model"] = self.model.name
        return out

    def with_(self, **changes: object) -> Workload:
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Piece:
    """A slice of one reference parameter: chunk ``index`` of ``parts`` along ``dim`` (None: whole)."""

    full_name: str
    dim: int | None = None
    transpose: bool = False  # stored transposed, so packed pieces share their row length


@dataclass(frozen=True)
class Placement:
    """How a local parameter maps to reference parameters, and where its gradient is summed.

    The local tensor is its pieces' slices concatenated along dim 0; the slice index is this
    rank's coordinate on ``axis``. ``reduce`` lists the mesh axes over which the gradient is
    all-reduced after backward (the axes where the data differs and the weight does not).
    """

    pieces: tuple[Piece, ...]
    axis: str | None = None
    reduce: tuple[str, ...] = ()


@dataclass(frozen=True)
class Traffic:
    """A collective a strategy issues in a step, for its analytic count and time.

    ``axes`` name the group (its size follows from the layout; ``channel`` > 0 is a second
    communicator over the same ranks). ``hidden`` says the schedule overlaps it with compute.
    ``scope`` says what recomputation repeats it: "core" (inside the attention core: selective
    and full recomputation re-issue it in backward), "block" (inside a decoder block: full
    recomputation re-issues it), "block_end" (the block's last op: torch's checkpoint stops
    recomputing once every saved tensor is back, so nothing after the last saving op is
    re-run), "model" (outside the blocks: never repeated).
    """

    op: str
    axes: tuple[str, ...]
    msg_bytes: int
    count: int = 1
    phase: str = "forward"
    scope: str = "block"
    hidden: bool = False
    channel: int = 0


RECOMPUTED_SCOPES = {"none": (), "selective": ("core",), "full": ("core", "block")}


def with_recomputation(traffic: list[Traffic], workload: Workload) -> list[Traffic]:
    """The step's traffic plus the forward traffic that recomputation repeats in backward."""
    repeat = RECOMPUTED_SCOPES[workload.recompute] if workload.mode == "train" else ()
    out = [t for t in traffic if t.count]
    out += [replace(t, phase="backward") for t in out if t.phase == "forward" and t.scope in repeat]
    return out


@dataclass
class LocalBatch:
    """This rank's tokens, targets [B, S] at true positions [S], and the global token count."""

    tokens: Tensor
    targets: Tensor
    positions: Tensor
    global_tokens: int


class Strategy:
    """Base class: subclass, set ``name``/``axes``, and give ``placement`` and ``comm_volume``."""

    name: ClassVar[str] = ""
    axes: ClassVar[tuple[str, ...]] = ()  # model-parallel axes this strategy uses, outer to inner
    sequence_axis: ClassVar[str | None] = None  # axis the tokens are zigzag-sharded over
    vocab_axis: ClassVar[str | None] = None  # axis the logits' vocabulary is sharded over
    weight_axes: ClassVar[tuple[str, ...]] = ()  # axes that shard the weights (1/product per rank)
    channels: ClassVar[int] = 1  # independent communicators per axis
    summary: ClassVar[str] = ""

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
        return ("dp", cls.sequence_axis) if cls.sequence_axis else ("dp",)

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
        for axis in cls.weight_axes:  # heads, MLP width and vocabulary are split over these
            for what in ("n_heads", "n_kv_heads", "ffn_hidden", "vocab_size"):
                divisible(getattr(cfg, what), layout.degree(axis), what, axis)
        if cls.sequence_axis:
            parts = layout.degree(cls.sequence_axis)
            if workload.seq_len % (2 * parts):
                raise LayoutError(
                    f"seq_len {workload.seq_len} must be divisible by 2 x "
                    f"{cls.sequence_axis} = {2 * parts} (zigzag chunks)"
                )

    @classmethod
    def comm_volume(cls, layout: Layout, workload: Workload) -> list[CommRecord]:
        """Analytic collectives of one training or inference step on one rank (every rank alike)."""
        plan = cls.planned(layout, workload)
        return [plan.record(t) for t in plan.step_traffic() if plan.mesh.size(*t.axes) > 1]

    def record(self, t: Traffic) -> CommRecord:
        label = "+".join(a for a in self.mesh.names if a in t.axes) + (f"#{t.channel}" if t.channel else "")
        return CommRecord(t.op, t.phase, self.mesh.size(*t.axes), t.msg_bytes, t.count, group=label)

    def step_traffic(self) -> list[Traffic]:
        """Everything one step moves: the strategy's own traffic with what recomputation repeats,
        the gradient all-reduces and the loss all-reduce."""
        out = with_recomputation(self.traffic(), self.workload)
        if self.workload.mode == "train":
            elt = self.workload.element_size
            for shape, placement in self.parameter_plan().values():
                if placement.reduce:
                    nbytes = math.prod(shape) * elt
                    out.append(Traffic("all_reduce", placement.reduce, nbytes, 1, "optimizer", "model"))
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

    def flop_terms(self) -> FlopTerms:
        """Hardware FLOPs of one step on this rank (see tspbench.flops)."""
        return autograd_flops(self.shapes(), self.workload.mode, self.workload.recompute)

    def predict_memory(self, terms: ActivationTerms | None = None) -> MemoryPrediction:
        elt = self.workload.element_size
        params = {n: math.prod(shape) * elt for n, (shape, _) in self.parameter_plan().items()}
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
        return model

    @classmethod
    def planned(cls, layout: Layout, workload: Workload) -> Strategy:
        """An instance for analysis: the layout's sizes, no process groups, nothing allocated."""
        return cls(layout, workload, Mesh.planning(cls.mesh_dims(layout), cls.channels), torch.device("meta"))

    def parameter_plan(self) -> dict[str, tuple[tuple[int, ...], Placement]]:
        """Local shape and placement of every parameter this rank holds (cached: building even a
        meta 7B model costs ~30 ms, and plan() asks for thousands of points)."""
        key = (type(self), self.layout, self.config, self.workload.megatron_sp)
        if key not in _PLAN_CACHE:
            self._meta_model()
            _PLAN_CACHE[key] = {name: (self.local_shape(pl), pl) for name, pl in self.placements.items()}
        return _PLAN_CACHE[key]

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
            self.config, full_name, shape, self.workload.seed, self.device, self.workload.torch_dtype
        )

    def _axis(self, axis: str | None) -> tuple[int, int]:
        return (1, 0) if axis is None else (self.mesh.size(axis), self.mesh.index(axis))

    def group(self, *axes: str, channel: int = 0) -> Group:
        return self.mesh.group(*axes, channel=channel)

    # ------------------------------------------------------------------ data and loss
    def shard_batch(self, tokens: Tensor, targets: Tensor) -> LocalBatch:
        """Split the global batch [dp B, S]: batch over dp, sequence zigzag over ``sequence_axis``."""
        dp, r = self.mesh.size("dp"), self.mesh.index("dp")
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
        return comm.all_gather(logits.contiguous(), self.group("dp"), dim=0)


def reference_shape(config: ModelConfig, full_name: str) -> tuple[int, ...]:
    """Shape of a reference parameter, read off a meta-device model (cached per config)."""
    return _shapes(config)[full_name]


_SHAPE_CACHE: dict[ModelConfig, dict[str, tuple[int, ...]]] = {}
_PLAN_CACHE: dict[tuple, dict[str, tuple[tuple[int, ...], Placement]]] = {}


def _shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    if config not in _SHAPE_CACHE:
        with torch.device("meta"):
            model = Transformer(config, seed=None)
        _SHAPE_CACHE[config] = {n: tuple(p.shape) for n, p in model.named_parameters()}
    return _SHAPE_CACHE[config]


# ---------------------------------------------------------------------------- registry

_REGISTRY: dict[str, type[Strategy]] = {}
_LOADED = False


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: add a strategy under ``cls.name``. A duplicate name raises."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"strategy {cls.name!r} is already registered by {_REGISTRY[cls.name].__module__}")
    _REGISTRY[cls.name] = cls
    return cls


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    importlib.import_module("strategies")
    for ep in importlib.metadata.entry_points(group="tspbench.strategies"):
        cls = ep.load()
        if cls.name not in _REGISTRY:
            register(cls)


def available() -> list[str]:
    _load()
    return sorted(_REGISTRY)


def get_strategy(name: str) -> type[Strategy]:
    _load()
    if name not in _REGISTRY:
        raise LayoutError(f"unknown strategy {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def check_layout(layout: Layout, workload: Workload) -> type[Strategy]:
    """Validate a layout against a workload before anything is launched; returns the strategy."""
    cls = get_strategy(layout.strategy)
    cls.check(layout, workload)
    return cls


def iter_strategies() -> Iterator[type[Strategy]]:
    _load()
    yield from (_REGISTRY[n] for n in sorted(_REGISTRY))


def divisible(value: int, by: int, what: str, axis: str) -> None:
    """Raise LayoutError unless ``value`` (named ``what``) is divisible by degree ``by`` of ``axis``."""
    if value % by:
        raise LayoutError(f"{what} {value} is not divisible by {axis} = {by}")
