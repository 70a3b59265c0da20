"""Decode cost terms: the KV cache, a decode step's collectives, FLOPs and working memory, per rank.

Pure functions of the model, the layout's degrees, the context S, the batch B, the decode
tokens N and the element size, written to the shared spec of issue #15 (decode with a KV
cache; /tmp/tsp/decode_spec.md, summarised here). Per model replica:

    P   sequence degree: sp (sp, fsdp_sp), the sp axis (tp_sp), tsp (tsp); 1 otherwise
    T   tensor degree: tp (tp, tp_sp); 1 otherwise
    D   weight-sharding degree of FSDP (fsdp, fsdp_sp) and TSP (tsp); 1 otherwise
    b   slots per rank: ceil(B / P) with P > 1 (sequence b on rank b mod P, padded), else B

    cache per rank   2 L m_loc d (B S / P + b N) x elt      m_loc = m / T (TSP: every head, m)
    a decode step    one new token per slot: projections, MLP and head on b rows with the
                     rank's widths (TSP: every shard visits, so whole widths); attention of
                     P b queries to the rank's S / P context positions plus the owner's tail

Collectives of one decode step (phase "decode"), per rank, as the spec's table:

    dp        nothing
    tp        2 L all-reduces [B, 1, h]; embedding all-reduce [B, 1, h]; logits all-gather [B, 1, V]
    sp        per layer: q all-gather (msg P b n d elt) and partials all-to-all (msg P b n (d+1) x
              max(elt, 4)), n_loc = n
    tp_sp     tp's on [b, 1, .] over tp, sp's with n_loc = n / T over sp
    tsp       per layer D broadcasts of W_attn and D - 1 ring shifts of W_mlp (channel 1, hidden),
              per head block the q all-gather and partials all-to-all (n_loc = n / D); embedding
              and head: D - 1 ring shifts of W_vocab each (channel 1, hidden)
    fsdp      one all-gather of every block's and the root's parameters (FSDP2's padded shards)
    fsdp_sp   fsdp's plus sp's q/partials
    + once, at the end of the prefill (phase "forward"), with P > 1: a broadcast of the B first
      token ids (int64) over the sequence axis

Only the built-in strategies are known here (a plugin's own decode traffic is its traffic()).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tspbench.core.errors import LayoutError
from tspbench.core.names import DTYPE_BYTES
from tspbench.core.spec import Layout, ModelConfig

DECODE_STRATEGIES = ("dp", "fsdp", "tp", "sp", "tp_sp", "tsp", "fsdp_sp")
SEQUENCE_AXIS = {"sp": "sp", "tp_sp": "sp", "fsdp_sp": "sp", "tsp": "tsp"}
TENSOR_AXIS = {"tp": "tp", "tp_sp": "tp"}
WEIGHT_AXIS = {"fsdp": "fsdp", "fsdp_sp": "sp", "tsp": "tsp"}
TOKEN_ID_BYTES = 8  # int64


@dataclass(frozen=True)
class DecodeShape:
    """One replica's decode as the spec shards it: degrees, sizes and the element size."""

    strategy: str
    seq_parts: int  # P
    tensor_parts: int  # T
    weight_parts: int  # D of FSDP and TSP (1 otherwise)
    batch: int  # B sequences per replica (fsdp: per rank, as its micro-batch)
    context: int  # S
    decode_tokens: int  # N
    dtype: str

    @classmethod
    def of(cls, layout: Layout, batch: int, context: int, decode_tokens: int, dtype: str) -> DecodeShape:
        if layout.strategy not in DECODE_STRATEGIES:
            known = ", ".join(DECODE_STRATEGIES)
            raise LayoutError(f"no decode cost model for strategy {layout.strategy!r}; known: {known}")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {list(DTYPE_BYTES)}, got {dtype!r}")

        def degree(table: dict[str, str]) -> int:
            axis = table.get(layout.strategy)
            return layout.degree(axis) if axis else 1

        return cls(layout.strategy, degree(SEQUENCE_AXIS), degree(TENSOR_AXIS), degree(WEIGHT_AXIS),
                   batch, context, decode_tokens, dtype)  # fmt: skip

    @property
    def elt(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def slots(self) -> int:
        """Rows of a rank's decode GEMMs: ceil(B / P) owned slots, or all B sequences with P = 1."""
        return math.ceil(self.batch / self.seq_parts)

    @property
    def partial_elt(self) -> int:
        """Bytes per element of the attention partials and their log-sum-exp (float32 at least)."""
        return max(self.elt, 4)

    @property
    def sequence_axis(self) -> str | None:
        return SEQUENCE_AXIS.get(self.strategy)

    @property
    def tensor_axis(self) -> str | None:
        return TENSOR_AXIS.get(self.strategy)


@dataclass(frozen=True)
class Widths:
    """What a rank's decode GEMMs span: query/KV heads attended, MLP width, vocabulary rows."""

    q_heads: int  # query heads this rank attends with (TSP: all, one block at a time)
    kv_heads: int  # KV heads this rank caches
    ffn: int
    vocab: int


def widths(cfg: ModelConfig, s: DecodeShape) -> Widths:
    """TP splits heads, MLP and vocabulary; every other strategy computes whole widths (TSP as
    its shards visit)."""
    t = s.tensor_parts
    return Widths(cfg.n_heads // t, cfg.n_kv_heads // t, cfg.ffn_hidden // t, cfg.vocab_size // t)


# ----------------------------------------------------------------------------- the cache


def kv_cache_bytes(cfg: ModelConfig, s: DecodeShape) -> int:
    """K and V of every layer a rank holds: context [B, m_loc, S/P, d] and tail [b, m_loc, N, d]."""
    m_loc, d = widths(cfg, s).kv_heads, cfg.head_dim
    positions = s.batch * (s.context // s.seq_parts) + s.slots * s.decode_tokens
    return 2 * cfg.n_layers * m_loc * d * positions * s.elt


# ----------------------------------------------------------------------------- weights


def tsp_shard_bytes(cfg: ModelConfig, s: DecodeShape) -> tuple[int, int, int]:
    """Bytes of one TSP rank's packed (attention, MLP, vocabulary) shard, as tsp.traffic() counts."""
    d, h, e = s.weight_parts, cfg.hidden, s.elt
    attn = (2 * h + 2 * cfg.kv_hidden) // d * h * e
    mlp = 3 * cfg.ffn_hidden // d * h * e
    return attn, mlp, cfg.vocab_size // d * h * e


def block_shapes(cfg: ModelConfig) -> list[tuple[int, ...]]:
    """Every parameter of one decoder block, as the model builds it (rows first)."""
    h, q, kv, f = cfg.hidden, cfg.n_heads * cfg.head_dim, cfg.kv_hidden, cfg.ffn_hidden
    return [(q, h), (kv, h), (kv, h), (h, q), (f, h), (f, h), (h, f), (h,), (h,)]


def root_shapes(cfg: ModelConfig) -> list[tuple[int, ...]]:
    """The embedding, the final norm and the LM head."""
    return [(cfg.vocab_size, cfg.hidden), (cfg.hidden,), (cfg.vocab_size, cfg.hidden)]


def fsdp_gathered(shapes: list[tuple[int, ...]], parts: int) -> int:
    """Elements FSDP2 all-gathers for a group: each parameter's rows padded to a multiple of D."""
    return sum(math.ceil(shape[0] / parts) * parts * math.prod(shape[1:]) for shape in shapes)


def fsdp_gather_elt(s: DecodeShape) -> int:
    """FSDP gathers bfloat16 under the low-precision policy, the dtype otherwise."""
    return 2 if s.dtype == "bfloat16" else s.elt


def gemm_weight_bytes(cfg: ModelConfig, s: DecodeShape) -> int:
    """Bytes of the weight matrices a rank's decode GEMMs read in one step (the embedding is a
    lookup of b rows, not a GEMM): the TP shard, else the whole model (FSDP gathers it, TSP's
    shards all visit)."""
    w = widths(cfg, s)
    h, d = cfg.hidden, cfg.head_dim
    block = h * d * (2 * w.q_heads + 2 * w.kv_heads) + 3 * h * w.ffn
    return (cfg.n_layers * block + w.vocab * h) * s.elt


# ----------------------------------------------------------------------------- collectives


@dataclass(frozen=True)
class Transfer:
    """A collective of a decode step (or of the prefill's end), per rank: the spec's table."""

    op: str
    axis: str
    msg_bytes: int
    count: int
    phase: str = "decode"
    hidden: bool = False
    channel: int = 0
    what: str = ""


def attention_exchange(cfg: ModelConfig, s: DecodeShape, q_heads: int, count: int) -> list[Transfer]:
    """The q all-gather and the partials all-to-all over the sequence axis, ``count`` times."""
    p, b, d, ax = s.seq_parts, s.slots, cfg.head_dim, s.sequence_axis
    return [
        Transfer("all_gather", ax, p * b * q_heads * d * s.elt, count, what="queries"),
        Transfer("all_to_all", ax, p * b * q_heads * (d + 1) * s.partial_elt, count, what="partials"),
    ]


def decode_transfers(cfg: ModelConfig, s: DecodeShape) -> list[Transfer]:
    """Every collective of one decode step (phase "decode") and the prefill's token broadcast
    (phase "forward"), per rank; none over a group of one rank."""
    L, h, V, D = cfg.n_layers, cfg.hidden, cfg.vocab_size, s.weight_parts
    out: list[Transfer] = []
    if s.tensor_parts > 1:
        rows, tp = s.slots, s.tensor_axis
        out += [
            Transfer("all_reduce", tp, rows * h * s.elt, 2 * L, what="block outputs"),
            Transfer("all_reduce", tp, rows * h * s.elt, 1, what="embedding"),
            Transfer("all_gather", tp, rows * V * s.elt, 1, what="logits"),
        ]
    if s.strategy == "tsp" and D > 1:
        attn, mlp, vocab = tsp_shard_bytes(cfg, s)
        out += [
            Transfer("broadcast", "tsp", attn, D * L, hidden=True, channel=1, what="W_attn"),
            *attention_exchange(cfg, s, cfg.n_heads // D, D * L),
            Transfer("send_recv", "tsp", mlp, (D - 1) * L, hidden=True, channel=1, what="W_mlp"),
            Transfer("send_recv", "tsp", vocab, 2 * (D - 1), hidden=True, channel=1, what="W_vocab"),
        ]
    elif s.seq_parts > 1:
        out += attention_exchange(cfg, s, widths(cfg, s).q_heads, L)
    if s.strategy in ("fsdp", "fsdp_sp") and D > 1:
        g, ax = fsdp_gather_elt(s), WEIGHT_AXIS[s.strategy]
        out += [
            Transfer("all_gather", ax, fsdp_gathered(root_shapes(cfg), D) * g, 1, what="root"),
            Transfer(
                "all_gather", ax, fsdp_gathered(block_shapes(cfg), D) * g, L, hidden=True, what="blocks"
            ),
        ]
    if s.seq_parts > 1:
        out.append(
            Transfer(
                "broadcast", s.sequence_axis, s.batch * TOKEN_ID_BYTES, 1, "forward", what="first tokens"
            )
        )
    return out


# ----------------------------------------------------------------------------- FLOPs


@dataclass(frozen=True)
class DecodeFlops:
    """Hardware FLOPs of one rank's decode step, and the bytes its kernels must read."""

    gemm: float
    attention: float
    weight_bytes: int  # weight matrices the GEMMs read
    cache_bytes: int  # K/V the attention reads (the context and the tail filled so far)


def decode_flops(cfg: ModelConfig, s: DecodeShape, step: int) -> DecodeFlops:
    """Step ``step`` (0-based: the token at position S + step): GEMMs on b rows at the rank's
    widths (2 m n k each), attention 4 d per (query head, key) pair, as FlopCounterMode counts
    SDPA: P b queries to S / P context keys plus each owned slot to its tail (step + 1 keys)."""
    w, h, d = widths(cfg, s), cfg.hidden, cfg.head_dim
    rows = s.slots
    block = 2 * rows * h * d * (2 * w.q_heads + 2 * w.kv_heads) + 6 * rows * h * w.ffn
    gemm = cfg.n_layers * block + 2 * rows * h * w.vocab
    pairs = s.seq_parts * rows * (s.context // s.seq_parts) + rows * (step + 1)
    attention = cfg.n_layers * 4 * w.q_heads * d * pairs
    cache = 2 * cfg.n_layers * w.kv_heads * d * (s.batch * (s.context // s.seq_parts) + rows * (step + 1))
    return DecodeFlops(float(gemm), float(attention), gemm_weight_bytes(cfg, s), cache * s.elt)


def tsp_shard_gemm_flops(cfg: ModelConfig, s: DecodeShape) -> tuple[float, float, float]:
    """GEMM FLOPs a TSP rank spends on one (attention, MLP, vocabulary) shard: its b slots
    through the shard's rows (2 flops per weight element per row)."""
    attn, mlp, vocab = tsp_shard_bytes(cfg, s)
    return tuple(2.0 * s.slots * nbytes / s.elt for nbytes in (attn, mlp, vocab))  # type: ignore[return-value]


ELEMENTWISE_PASSES = 4  # passes over a step's [rows, h] and [rows, ffn] tensors per layer


def decode_elementwise_bytes(cfg: ModelConfig, s: DecodeShape) -> int:
    """Bytes a decode step's element-wise ops move on one rank: ELEMENTWISE_PASSES passes over
    its rows' [b, h] and [b, ffn] tensors (4 of h, 3 of the rank's MLP width) per layer."""
    return ELEMENTWISE_PASSES * cfg.n_layers * s.slots * (4 * cfg.hidden + 3 * widths(cfg, s).ffn) * s.elt


# ----------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class DecodeWork:
    """Working memory of a decode step on one rank, beyond parameters and the cache, by term."""

    activations: int  # the step's own tensors: stream, projections, MLP, scores, logits
    exchange: int  # gathered queries and the partials sent and received (P > 1)
    weights: int  # weights in flight: TSP's visiting shards, FSDP's gathered block and root

    @property
    def total(self) -> int:
        return self.activations + self.exchange + self.weights


def decode_work(cfg: ModelConfig, s: DecodeShape) -> DecodeWork:
    """The larger moment of a decode step (at its last step, the longest keys): the rank's rows
    through the widths it holds at once (TSP: one head block, one MLP shard, the whole logits
    row its argmax needs), attention scores [P b, heads, keys] at max(elt, 4) as an unfused
    kernel holds them (a flash kernel holds none: this overstates a GPU's by that much)."""
    w, h, d, e, D = widths(cfg, s), cfg.hidden, cfg.head_dim, s.elt, s.weight_parts
    rows, p = s.slots, s.seq_parts
    tsp = s.strategy == "tsp"
    q_heads, kv_heads = (cfg.n_heads // D, cfg.n_kv_heads // D) if tsp else (w.q_heads, w.kv_heads)
    ffn = cfg.ffn_hidden // D if tsp else w.ffn
    keys = s.context // p + s.decode_tokens
    scores = p * rows * q_heads * keys * s.partial_elt
    vocab = cfg.vocab_size if tsp or s.tensor_parts > 1 else w.vocab  # TP gathers the row for argmax
    logits = rows * (w.vocab + vocab) * e if s.tensor_parts > 1 else rows * vocab * e
    block = rows * e * (3 * h + (2 * q_heads + 2 * kv_heads) * d + 3 * ffn)
    activations = max(block + scores, rows * h * e + logits)
    exchange = 0
    if p > 1:
        exchange = p * rows * q_heads * d * e + 2 * p * rows * q_heads * (d + 1) * s.partial_elt
    weights = 0
    if tsp and D > 1:
        weights = min(2, D - 1) * max(tsp_shard_bytes(cfg, s))
    elif s.strategy in ("fsdp", "fsdp_sp") and D > 1:
        g = fsdp_gather_elt(s)
        weights = (fsdp_gathered(root_shapes(cfg), D) + 2 * fsdp_gathered(block_shapes(cfg), D)) * g
    return DecodeWork(activations, exchange, weights)
