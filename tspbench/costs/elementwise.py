"""Bytes the element-wise kernels of a step read and write on one rank, operator by operator.

Counted from the code the step runs (tspbench/model: eager PyTorch, every line below a kernel
that reads its inputs and writes its output), in the per-rank sizes of a strategy's Shapes, with
e the activations' element size and s that of the statistics (float32 at least):

    RMSNorm  [B, T, h]  forward   norm e, x * rstd e + s, cast s + e (16-bit only), * weight 2e
                        backward  x-hat e + s, dy * x-hat e + 2s, sum s, dy * w e + s, products
                                  and updates 3s + s + 2s + 3s + 2s, cast s + e (16-bit only)
    rotary   q, k       each way  2 x (x * table 2e per element + the [T, d] table e), the
                                  rotated half: neg e, cat 2e, sum 3e
    SwiGLU   [B, T, f]  forward   silu 2e, product 3e
                        backward  sigmoid 2e, six products 6 x 3e, 1 - sig 2e, 1 + ... 2e
    residual [B, T, h]  forward   two sums 2 x 3e; backward the same two, and the gradients of
                                  the input shared by wq, wk, wv (two sums) and by w1, w3 (one)
    loss     [B, T, V]  forward   upcast e + s (16-bit), log-softmax 2s, nll s
                        backward  nll 2s, log-softmax 3s, cast s + e (16-bit)

A strategy adds what its own code moves (``Strategy.elementwise_extra_bytes``: K/V put in
sequence order, TSP's concatenations, FSDP2's copies in and out of its gather buffers).
"""

from __future__ import annotations

from dataclasses import dataclass

from tspbench.costs.memory import Shapes


@dataclass(frozen=True)
class ElementwiseWork:
    """A step's element-wise work as the time model takes it (tspbench.analytic.timing)."""

    counted: int  # bytes the step's element-wise kernels move, the optimizer apart (step_bytes)
    layer: int  # bytes of the activations a block computes: the basis of measured or fitted passes
    params: int  # bytes of the parameters the rank's optimizer steps
    param_element_size: int


def _cast(s: Shapes) -> int:
    """Bytes per element of a cast between the statistics and 16-bit activations (else none)."""
    return s.stat + s.elt if s.stat != s.elt else 0


def norm_bytes(s: Shapes, tokens: int) -> tuple[int, int]:
    """(forward, backward) bytes of one RMSNorm over [B, tokens, h]."""
    n, e, f = s.batch * tokens * s.hidden, s.elt, s.stat
    forward = e + (e + f) + _cast(s) + 2 * e
    backward = 3 * e + 16 * f + _cast(s)
    return n * forward, n * backward


def rope_bytes(s: Shapes, width: int) -> int:
    """Bytes one way (forward or backward) of the rotation of a [B, T, width] query or key."""
    n, e = s.batch * s.tokens * width, s.elt
    table = s.tokens * (s.q // s.heads) * e
    return 2 * (2 * e * n + table) + 5 * e * n


def block_bytes(s: Shapes) -> tuple[int, int]:
    """(forward, backward) bytes of one decoder block on the rank."""
    e = s.elt
    norm_f, norm_b = norm_bytes(s, s.stream_tokens)
    stream = s.batch * s.stream_tokens * s.hidden
    inputs = s.batch * s.tokens * s.hidden  # the projections' input (gathered under Megatron-SP)
    mlp = s.batch * s.tokens * s.ffn
    rope = rope_bytes(s, s.q) + rope_bytes(s, s.kv)
    forward = 2 * norm_f + 2 * 3 * e * stream + rope + 5 * e * mlp
    backward = 2 * norm_b + 2 * 3 * e * stream + 3 * 3 * e * inputs + rope + 24 * e * mlp
    return forward, backward


def ends_bytes(s: Shapes, train: bool = True, vocab_parts: int = 1) -> tuple[int, int]:
    """(forward, backward) bytes outside the blocks: the embedding (its whole table, as the
    recorder counts a gather, and its [B, T, h] output; backward the table's gradient), the
    rotary tables (float64 angles, cat, cos, sin, cast: 52 + 2 (8 + e) per [T, d] element), the
    final norm and the loss over the rank's logits. A vocabulary-parallel embedding masks its
    output (2e per element, each way) and a vocabulary-parallel loss (torch's loss_parallel)
    makes its own passes: max s, subtract 2s, exp 2s, sum s, divide 2s, gather s; backward
    scale 2s, scatter-add 2s, cast. A forward (prefill) returns the logits: no loss."""
    e, f, vocab_parallel = s.elt, s.stat, vocab_parts > 1
    norm_f, norm_b = norm_bytes(s, s.stream_tokens)
    logits, table = s.batch * s.tokens * s.vocab, s.vocab * s.hidden * e
    upcast = e + f if e < 4 else 0
    embed = table + s.batch * s.stream_tokens * s.hidden * e * (3 if vocab_parallel else 1)
    rope = (52 + 2 * (8 + e)) * s.tokens * (s.q // s.heads)
    if not train:
        return embed + rope + norm_f, 0
    loss_f, loss_b = (10 * f, 4 * f + _cast(s)) if vocab_parallel else (3 * f, 5 * f + _cast(s))
    return embed + rope + norm_f + logits * (upcast + loss_f), embed + norm_b + logits * loss_b


def over_step(
    layers: int, mode: str, forwards: int, block: tuple[int, int], ends: tuple[int, int] = (0, 0)
) -> int:
    """A step's total of per-block (forward, backward) bytes and once-per-step ones: a training
    step runs each block's forward ``forwards`` times (twice where it is recomputed) and its
    backward once; a forward, each forward once."""
    if mode != "train":
        return layers * block[0] + ends[0]
    return layers * (forwards * block[0] + block[1]) + ends[0] + ends[1]


def step_bytes(s: Shapes, mode: str, recompute: str, vocab_parts: int = 1) -> int:
    """Element-wise bytes of the step's blocks and head (the optimizer apart): a training step
    runs each block's forward once more under full or op recomputation (op re-runs every
    element-wise op, keeping only GEMM and attention outputs); a forward, the forward."""
    forwards = 2 if recompute in ("full", "op") else 1
    return over_step(s.layers, mode, forwards, block_bytes(s), ends_bytes(s, mode == "train", vocab_parts))


def zigzag_core_bytes(s: Shapes) -> tuple[int, int]:
    """(forward, backward) bytes of zigzag_causal_attention (tspbench/dist/zigzag.py) on a rank
    that is not rank 0 (the heaviest: both its chunks sit at an offset), its queries [B, T, q]
    against the whole sequence's K/V [B, S, kv] over D = kv_parts ranks. The rank's two chunks
    of C = T / 2 tokens see key prefixes ending at (r + 1) C and (2D - r) C, E = (2D + 1) C keys
    in all; each runs LowerRightCausal (tspbench/model/layers.py).

        forward   per chunk its two partials merged (upcast, scale, add, cast: 3e + 6s per
                  output element); the chunks' outputs joined 2e T q; grouped K/V repeated to the
                  query heads 2 x 2e E q
        backward  per chunk the output gradient made contiguous 2e and the two dq summed 3e (per
                  output element), its prefix's dK, dV joined 2 x 2e E q; the chunks' dq joined
                  2e T q; the key-prefix slices' gradients widened to S 2 x e (E + 2S) kv and the
                  two chunks' dK, dV summed 2 x 3e S kv; grouped: repeats summed 2 x e E (q + kv)
    """
    if s.kv_parts == 1:
        return 0, 0
    e, f, b, t, seq, q, kv = s.elt, s.stat, s.batch, s.tokens, s.seq, s.q, s.kv
    keys = (2 * s.kv_parts + 1) * (t // 2)
    grouped = q != kv
    forward = (3 * e + 6 * f) * t * q + 2 * e * t * q + (4 * e * keys * q if grouped else 0)
    backward = (
        5 * e * t * q + 4 * e * keys * q + 2 * e * t * q + 2 * e * (keys + 2 * seq) * kv + 6 * e * seq * kv
    )
    backward += 2 * e * keys * (q + kv) if grouped else 0
    return b * forward, b * backward


def zigzag_attention_bytes(s: Shapes) -> tuple[int, int]:
    """(forward, backward) bytes ZigzagAttention adds to a block (tspbench/dist/zigzag.py):
    the core (zigzag_core_bytes); K, V made contiguous for the gather 2 x 2e T kv and put in
    sequence order 2 x 2e S kv, the output transposed back 2e T q; backward dK, dV cut back per
    rank 2 x 2e S kv, dq, dK, dV transposed 2e T (q + 2 kv)."""
    if s.kv_parts == 1:
        return 0, 0
    e, b, t, seq, q, kv = s.elt, s.batch, s.tokens, s.seq, s.q, s.kv
    core_f, core_b = zigzag_core_bytes(s)
    forward = core_f + b * (4 * e * t * kv + 4 * e * seq * kv + 2 * e * t * q)
    backward = core_b + b * (4 * e * seq * kv + 2 * e * t * (q + 2 * kv))
    return forward, backward


def tsp_block_bytes(s: Shapes) -> tuple[int, int]:
    """(forward, backward) bytes TSP's block adds to the model's (strategies/tsp_attention.py,
    tsp_ring.py), D = kv_parts ranks, each holding T tokens and one of D blocks of every weight:

        attention  y (dx) zeroed e T h; per head block K, V stacked for the gather 2 x 2e T kv and
                   put in sequence order 2 x 2e S kv, the zigzag core, o flattened 2e T q; the
                   rotary tables read once per head block (4e T d, D - 1 more times each way);
                   backward the gather and the core's forward again, then its backward, dK, dV
                   stacked and cut back per rank 2 x 2 x 2e S kv, o, dq, dk, dv flattened
                   2e T (2q + 2kv), each block's weight gradient joined 2e (2q + 2kv) h
        MLP        y (dx) zeroed e T h; backward the gated product recomputed 5e T f, each shard's
                   gradient joined 2e 3f h / D and added to the arriving accumulator 3e 3f h / D
                   (D - 1 shards of D)
        and no autograd sums of the input the projections share (dx accumulates in the GEMMs):
        3 x 3e T h less than the model's backward.
    """
    e, b, t, seq, h, q, kv, ffn, d = s.elt, s.batch, s.tokens, s.seq, s.hidden, s.q, s.kv, s.ffn, s.kv_parts
    core_f, core_b = zigzag_core_bytes(s)
    zeros, tables = e * b * t * h, 4 * e * (d - 1) * t * (q // s.heads)
    gather = b * (4 * e * t * kv + 4 * e * seq * kv)
    attn_f = zeros + gather + core_f + 2 * e * b * t * q + tables
    weights = 2 * e * (2 * q + 2 * kv) * h
    attn_b = (
        zeros
        + gather
        + core_f
        + core_b
        + b * (8 * e * seq * kv + 2 * e * t * (2 * q + 2 * kv))
        + weights
        + tables
    )
    mlp_b = zeros + 5 * e * b * t * ffn + 6 * e * ffn * h + 9 * e * ffn * h * (d - 1) // d
    return attn_f + zeros, attn_b + mlp_b - 9 * e * b * t * h


def tsp_ends_bytes(s: Shapes, train: bool = True) -> tuple[int, int]:
    """(forward, backward) bytes TSP's ring embedding and loss add to the model's (tsp_ring.py):
    the embedding's D lookups, each masked 2e T h and added 3e T h into a zeroed output (6D e T h
    more than one lookup); backward each shard's gradient rows masked 2e T h, a zeroed partial
    e V h / D with the rows added 2e V h / D + e T h, and the accumulators added 3e V h / D
    (D - 1 shards). The online log-sum-exp loss picks, maxes, subtracts, exponentiates and sums
    each block of logits (4s more per logit than the model's loss); backward it recomputes the
    logits (upcast), subtracts, exponentiates, scatters and scales (upcast + 3s more), dx zeroed
    e T h, the accumulators added 3e V h / D (D - 1 shards). A forward (prefill): the lookups,
    and each vocabulary block's logits copied into place 2e T V."""
    e, f, b, t, h, v, d = s.elt, s.stat, s.batch, s.tokens, s.hidden, s.vocab, s.kv_parts
    stream, table, logits = b * t * h, v * h, b * t * v
    embed_f = 6 * d * e * stream
    if not train:
        return embed_f + 2 * e * logits, 0
    upcast = e + f if e < 4 else 0
    accumulators = 3 * e * table * (d - 1) // d
    embed_b = 3 * d * e * stream + 3 * e * table + accumulators - e * table - e * stream
    return embed_f + 4 * f * logits, embed_b + (upcast + 3 * f) * logits + e * stream + accumulators


def recomputed_forwards(mode: str, recompute: str) -> int:
    """How many times a training step runs the attention core's element-wise work (once more
    under selective, op or full recomputation: op keeps the kernels' outputs, not the merges and
    copies around them); once for a forward."""
    return 2 if mode == "train" and recompute in ("selective", "op", "full") else 1
