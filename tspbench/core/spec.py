"""What a point is: the model (ModelConfig and its presets), the layout (a strategy and its
degrees) and the workload (batch, sequence, mode, precision, device). Plain frozen dataclasses,
validated on construction, so a bad value is an error before any process starts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from tspbench.core.errors import LayoutError, WorkloadError
from tspbench.core.names import AXES, DEVICES, DTYPE_BYTES, MODES, RECOMPUTE_MODES
from tspbench.core.units import degrees_text


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of the decoder. ``ffn_hidden`` is the gated-MLP width (the paper: 4 h)."""

    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    vocab_size: int = 32000
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    name: str = "custom"
    max_seq_len: int = 139264  # positions the model serves: context + generated (128K + 8K)

    def __post_init__(self) -> None:
        if self.hidden % self.n_heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if self.max_seq_len < 1:
            raise ValueError(f"max_seq_len must be >= 1, got {self.max_seq_len}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    @property
    def kv_hidden(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def params_per_layer(self) -> int:
        """Weights of one block, norms included: (2 + 2/g + 3F) h^2 + 2h, g = n_heads / n_kv_heads."""
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_hidden + 3 * h * self.ffn_hidden + 2 * h

    @property
    def n_params(self) -> int:
        return self.n_layers * self.params_per_layer + 2 * self.vocab_size * self.hidden + self.hidden

    @classmethod
    def preset(cls, name: str, **overrides: object) -> ModelConfig:
        """A named configuration; ``overrides`` replace single fields (e.g. ``vocab_size``). A
        model that differs from its preset is named for what changed ("7b+hidden5120,layers48"),
        so no record or title calls it by the preset's name; an unchanged one keeps the preset's
        (its run ids with it)."""
        if name not in PRESETS:
            raise KeyError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
        base = PRESETS[name]
        model = replace(base, **overrides)  # type: ignore[arg-type]
        if "name" in overrides:
            return model
        changed = [
            f"{SHORT_FIELDS.get(k, k)}{v:g}" if isinstance(v, float) else f"{SHORT_FIELDS.get(k, k)}{v}"
            for k, v in asdict(model).items()
            if k != "name" and v != getattr(base, k)
        ]
        return replace(model, name=f"{name}+{','.join(changed)}") if changed else model

    def cut_to(self, n_layers: int) -> ModelConfig:
        """The same model with only ``n_layers`` blocks, named for it ("7b-4layers")."""
        return replace(self, n_layers=n_layers, name=f"{self.name}-{n_layers}layers")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# How a changed field is written in a model's name: "7b+hidden5120,layers48,kv_heads8".
SHORT_FIELDS = {"n_layers": "layers", "n_heads": "heads", "n_kv_heads": "kv_heads", "ffn_hidden": "ffn",
                "vocab_size": "vocab"}  # fmt: skip


def model_label(name: str) -> str:
    """How a title names a model: '7b preset' for a preset as it is, else 'model NAME'."""
    return f"{name} preset" if name in PRESETS else f"model {name}"


CPU_MAX_SEQ_LEN = 16384
PRESETS: dict[str, ModelConfig] = {
    # The paper's "7B": 16 h^2 L = 8.59e9 block weights (gated MLP of width 4h, no GQA).
    "7b": ModelConfig(4096, 32, 32, 32, 4 * 4096, vocab_size=32000, name="7b"),
    "1b": ModelConfig(2048, 16, 16, 16, 4 * 2048, vocab_size=32000, name="1b"),
    # CPU presets: small enough for multi-rank float64 checks in seconds.
    "tiny": ModelConfig(64, 2, 4, 4, 256, vocab_size=512, name="tiny", max_seq_len=CPU_MAX_SEQ_LEN),
    "tiny-gqa": ModelConfig(64, 2, 4, 2, 256, vocab_size=512, name="tiny-gqa", max_seq_len=CPU_MAX_SEQ_LEN),
    "small": ModelConfig(256, 4, 8, 8, 1024, vocab_size=4096, name="small", max_seq_len=CPU_MAX_SEQ_LEN),
}


@dataclass(frozen=True)
class Layout:
    """A strategy and its degree on every axis (unused axes are 1); world size is their product."""

    strategy: str
    dp: int = 1
    tp: int = 1
    sp: int = 1
    tsp: int = 1
    fsdp: int = 1  # FSDP's ranks shard the weights, each with its own micro-batch (as dp)

    def __post_init__(self) -> None:
        for axis in AXES:
            value = getattr(self, axis)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LayoutError(f"degree {axis} must be a positive integer, got {value!r}")

    @property
    def world_size(self) -> int:
        return math.prod(self.degree(a) for a in AXES)

    @property
    def data_degree(self) -> int:
        """Ranks that take different sequences: dp x fsdp (the global batch is this x ``batch``)."""
        return self.dp * self.fsdp

    @property
    def replica_size(self) -> int:
        """Ranks of one model-parallel replica (the world without data parallelism)."""
        return self.world_size // self.dp

    def degree(self, axis: str) -> int:
        return getattr(self, axis)

    def degrees(self) -> dict[str, int]:
        return {a: self.degree(a) for a in AXES}

    def describe(self) -> str:
        """'tsp(tsp8 x dp128)'."""
        return f"{self.strategy}({degrees_text(self.strategy, self.degrees())})"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# How a sequence-sharded layout's attention sees the other ranks' K/V (tspbench.dist.zigzag,
# ring, ulysses): every rank gathers the whole sequence's K/V; K/V chunks passed around a ring and
# the partial attentions merged by log-sum-exp; or an all-to-all from sequence to head shards.
KV_EXCHANGES = ("allgather", "ring", "ulysses")

# How TSP's MLP shards reach every rank (strategies/tsp_mlp.py): passed around a ring (the paper's:
# one link per shift), or each broadcast from its owner as the attention's (the whole group's links).
MLP_EXCHANGES = ("ring", "broadcast")

# torch's generators take seeds in [-2**63, 2**64 - 1]; the token data is drawn with seed + 1
# (tspbench.model.reference), so the top one is left out.
SEED_RANGE = (-(2**63), 2**64 - 2)


def recompute_problem(recompute: str, modes: Sequence[str]) -> str | None:
    """Why ``recompute`` cannot apply to a run of ``modes``, or None. Recomputation re-runs
    forward work inside the backward pass, so without training there is nothing it could
    change: accepting it would label a record with a setting that did nothing."""
    if recompute == "none" or "train" in modes:
        return None
    return (
        f"recomputation applies to training only: mode {' and '.join(map(repr, modes))} has no "
        "backward pass (use recompute none)"
    )


def switch_words(w: Mapping[str, Any]) -> list[str]:
    """['kv ulysses', 'mlp broadcast', 'megatron_sp', 'no overlap']: each switch a workload's
    fields (a Workload's ``vars``, or a stored point's, where a missing key is at its default)
    set away from its default, as point labels and plans name them."""
    words = [f"kv {w['kv_exchange']}"] if w.get("kv_exchange", "allgather") != "allgather" else []
    words += [f"mlp {w['mlp_exchange']}"] if w.get("mlp_exchange", "ring") != "ring" else []
    words += ["megatron_sp"] if w.get("megatron_sp") else []
    words += ["no overlap"] if w.get("overlap", True) is False else []
    return words


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
    decode_tokens: int = 0  # decode: greedy steps after the prefill of ``seq_len`` context tokens
    kv_exchange: str = "allgather"  # sp, fsdp_sp, tp_sp: how the sequence axis shares K/V (KV_EXCHANGES)
    mlp_exchange: str = "ring"  # tsp: how the MLP's weight shards move (MLP_EXCHANGES)

    def __post_init__(self) -> None:
        checks = [
            ("mode", self.mode, MODES),
            ("recompute", self.recompute, RECOMPUTE_MODES),
            ("dtype", self.dtype, tuple(DTYPE_BYTES)),
            ("device", self.device, DEVICES),
            ("kv_exchange", self.kv_exchange, KV_EXCHANGES),
            ("mlp_exchange", self.mlp_exchange, MLP_EXCHANGES),
        ]
        for key, value, allowed in checks:
            if value not in allowed:
                raise WorkloadError(f"{key} must be one of {list(allowed)}, got {value!r}")
        for key in ("batch", "seq_len"):
            if getattr(self, key) < 1:
                raise WorkloadError(f"{key} must be >= 1, got {getattr(self, key)}")
        if not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise WorkloadError(f"seed must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}], got {self.seed}")
        self._check_decode()

    def _check_decode(self) -> None:
        n, decode = self.decode_tokens, self.mode == "decode"
        if not isinstance(n, int) or isinstance(n, bool):
            raise WorkloadError(f"decode_tokens must be an integer, got {n!r}")
        if decode and n < 1:
            raise WorkloadError(f"decode_tokens must be >= 1 in decode mode, got {n}")
        if not decode and n != 0:
            raise WorkloadError(f"decode_tokens {n} is for mode 'decode' only (mode is {self.mode!r})")
        if decode and self.seq_len + n > self.model.max_seq_len:
            raise WorkloadError(
                f"seq_len {self.seq_len} + decode_tokens {n} = {self.seq_len + n} exceeds "
                f"max_seq_len {self.model.max_seq_len} of model {self.model.name!r}"
            )

    @property
    def element_size(self) -> int:
        """Bytes per element of weights and activations."""
        return DTYPE_BYTES[self.dtype]

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["model"] = self.model.name
        return out

    def with_(self, **changes: object) -> Workload:
        return replace(self, **changes)  # type: ignore[arg-type]
