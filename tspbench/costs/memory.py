"""Analytic per-rank memory: what each strategy keeps, and when it lives.

Two parts. A strategy supplies its ``ActivationTerms``: the bytes one decoder block saves for
backward (per recomputation mode), the working memory inside a block's forward and backward,
and the same for the embedding and the head/loss. This module holds what every strategy
shares: parameters, gradients and optimizer state from the strategy's own parameter plan,
and a timeline that walks a step and takes the peak of the moments where memory can peak:

    forward     persistent + saved so far + the head's forward working memory
    head bwd    persistent + everything saved + the loss/head backward working memory
    block bwd   persistent + gradients so far + saved of the blocks not yet done
                + the block's backward working memory (under full recomputation the
                block's forward is re-run first, so its full saved set is live too), the
                larger of its two halves: the MLP's backward runs first, the attention's
                after it, when the MLP's saved tensors are already freed
    optimizer   persistent + all gradients + the optimizer's working buffers
    prefill     persistent + one residual stream + a block's (or the head's) working memory

Two terms ride along with every moment as "other": ``resident`` (what a wrapper holds across
steps, DDP's gradient buckets) and, in all but the optimizer moment, ``held_weights`` (weights
gathered from the forward to the end of backward, FSDP's root).

Saved sizes are exact for this code (checked against the CPU tracker); working-memory terms
count the temporaries of each backward as written in tspbench/model/ and strategies/.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tspbench.core.names import CATEGORIES


@dataclass(frozen=True)
class Shapes:
    """Per-rank sizes (elements) a strategy's terms are written in."""

    batch: int  # B
    tokens: int  # T: tokens per rank seen by attention and the MLP
    stream_tokens: int  # tokens per rank in the residual stream (T / tp under Megatron-SP)
    seq: int  # S, the whole sequence
    hidden: int  # h
    q: int  # query width held: n_local * d
    kv: int  # key/value width held: m_local * d
    ffn: int  # gated-MLP width held
    vocab: int  # LM-head rows held
    heads: int  # query heads held
    kv_parts: int  # ranks K/V are gathered over (1: attention is local)
    elt: int  # bytes per element of weights and activations
    layers: int
    kv_exchange: str = "allgather"  # how K/V cross the kv_parts ranks (allgather, ring, ulysses)

    @property
    def stat(self) -> int:
        """Bytes per element of norm and softmax statistics (float32 at least)."""
        return max(self.elt, 4)

    def act(self, tokens: int, width: int) -> int:
        """Bytes of a [B, tokens, width] activation."""
        return self.batch * tokens * width * self.elt


@dataclass
class ActivationTerms:
    """Bytes one rank holds for activations and working memory, by role."""

    saved_layer: dict[str, int]  # per block, by recomputation mode
    stream: int  # one residual-stream tensor [B, T_stream, h]
    forward_work: int  # inside a block's forward, beyond what it saves (prefill peaks here)
    backward_work: int  # inside a block's (MLP) backward, beyond saved tensors and gradients
    fixed_saved: int  # saved once: rotary tables, token ids
    head_saved: int  # final norm, head and loss tensors kept for backward
    head_forward_work: int  # logits and loss working memory in the training forward
    head_backward_work: int  # loss and head backward working memory
    prefill_head: int  # prefill: the logits output and the head's working memory
    resident: int = 0  # buffers a wrapper holds across steps (DDP's gradient buckets), as other
    held_weights: int = 0  # gathered weights held from forward to the end of backward (FSDP's root)
    # the attention half of a block's backward, when it is written apart: its working memory,
    # and the block's saved bytes the MLP's backward (which runs before it) has freed by then
    attention_backward_work: int = 0
    mlp_saved: int = 0
    # op-level recomputation: kept outputs a block's recompute never reaches (it stops at the last
    # tensor backward needs), held through the block's backward beside what it recomputed
    op_unreached: int = 0


# The step phase (as the tracker labels allocations: tspbench.dist.comm.phase) of each moment.
MOMENT_PHASES = {
    "forward head": "forward",
    "head backward": "backward",
    "last block backward": "backward",
    "first block backward": "backward",
    "optimizer": "optimizer",
    "prefill block": "forward",
    "prefill head": "forward",
}


@dataclass
class MemoryPrediction:
    """Predicted per-rank peak and the category totals at the peak moment."""

    peak_bytes: int
    by_category: dict[str, int]
    moment: str
    moments: dict[str, int] = field(default_factory=dict)
    persistent: dict[str, int] = field(default_factory=dict)

    @property
    def phase(self) -> str:
        """The step phase the peak moment falls in (forward, backward, optimizer)."""
        return MOMENT_PHASES[self.moment]

    def phase_peaks(self) -> dict[str, int]:
        """The highest predicted total in each phase (what the tracker's per-phase peaks measure)."""
        out: dict[str, int] = {}
        for moment, total in self.moments.items():
            phase = MOMENT_PHASES[moment]
            out[phase] = max(out.get(phase, 0), total)
        return out


def optimizer_bytes(param_bytes: int, elt: int) -> int:
    """AdamW state: m and v in the parameter dtype, or float32 master + m + v for 16-bit weights."""
    return 2 * param_bytes if elt >= 4 else 12 * (param_bytes // elt)


def optimizer_work(max_param_bytes: int, elt: int) -> int:
    """Per-parameter AdamW temporaries: sqrt(v) and its scaled copy (plus the float32 grad copy)."""
    return 2 * max_param_bytes if elt >= 4 else 3 * (max_param_bytes // elt) * 4


def predict_memory(
    terms: ActivationTerms,
    param_bytes: dict[str, int],
    mode: str,
    recompute: str,
    elt: int,
) -> MemoryPrediction:
    """Walk the step's moments; ``param_bytes`` maps parameter name -> local bytes."""
    params = sum(param_bytes.values())
    train = mode == "train"
    opt = optimizer_bytes(params, elt) if train else 0
    persistent = {"parameters": params, "gradients": 0, "optimizer": opt}
    moments: dict[str, tuple[int, dict[str, int]]] = {}

    def add(name: str, held: int = terms.held_weights, **cats: int) -> None:
        by = {c: 0 for c in CATEGORIES}
        by.update(parameters=params, optimizer=opt, other=terms.resident + held)
        for k, v in cats.items():
            by[k] += v
        moments[name] = (sum(by.values()), by)

    if not train:
        add("prefill block", other=terms.stream + terms.forward_work + terms.fixed_saved)
        add("prefill head", other=terms.stream + terms.prefill_head + terms.fixed_saved)
    else:
        L = terms_layers(param_bytes)
        saved = terms.saved_layer[recompute]
        all_saved = terms.fixed_saved + L * saved + terms.head_saved
        layer_grads = _layer_grad_bytes(param_bytes)
        head_grads = params - sum(layer_grads) - _embedding_bytes(param_bytes)
        add("forward head", activations=all_saved, other=terms.head_forward_work)
        add("head backward", activations=all_saved, other=terms.head_backward_work)
        rerun = recomputed_layer(terms, recompute)
        # the last block's backward (most saved left) and the first's (most gradients done)
        for label, done in (("last block backward", 0), ("first block backward", L - 1)):
            live = terms.fixed_saved + (L - done) * saved + rerun
            grads = head_grads + sum(layer_grads[L - done :])
            halves = ((live, terms.backward_work), (live - terms.mlp_saved, terms.attention_backward_work))
            saved_now, work = max(halves, key=sum)
            add(label, activations=saved_now, gradients=grads, other=terms.stream + work)
        add("optimizer", 0, gradients=params, other=optimizer_work(max(param_bytes.values()), elt))
    name = max(moments, key=lambda k: moments[k][0])
    peak, by = moments[name]
    return MemoryPrediction(peak, by, name, {k: v[0] for k, v in moments.items()}, persistent)


def recomputed_layer(terms: ActivationTerms, recompute: str) -> int:
    """Bytes the block being differentiated holds beyond its saved_layer share, once its forward
    is re-run: full rebuilds the whole saved set; op rebuilds it too, the kept outputs it
    consumes dying into it, the unreached ones held beside it; none and selective add nothing
    (selective's core is rebuilt inside its own backward, within backward_work)."""
    none, saved = terms.saved_layer["none"], terms.saved_layer[recompute]
    if recompute == "full":
        return none - saved
    if recompute == "op":
        return none + terms.op_unreached - saved
    return 0


def terms_layers(param_bytes: dict[str, int]) -> int:
    return len({n.split(".")[1] for n in param_bytes if n.startswith("layers.")})


def _layer_grad_bytes(param_bytes: dict[str, int]) -> list[int]:
    per: dict[int, int] = {}
    for name, nbytes in param_bytes.items():
        if name.startswith("layers."):
            i = int(name.split(".")[1])
            per[i] = per.get(i, 0) + nbytes
    return [per[i] for i in sorted(per)]


def _embedding_bytes(param_bytes: dict[str, int]) -> int:
    return sum(v for k, v in param_bytes.items() if k.startswith("embed."))


# ----------------------------------------------------------------------------- the autograd family


def autograd_terms(s: Shapes, megatron_sp: bool = False, vocab_parallel: bool = False) -> ActivationTerms:
    """Terms of strategies that run the shared model under plain autograd (dp, tp, sp, tp_sp).

    Saved per block (recompute none), as tspbench/model/'s autograd keeps them:
        residual stream x_in, x_mid and their norm statistics   2 [B, T_stream, h] + 2 [B, T_stream]
        normed inputs of the projections xn, xn2                2 [B, T, h] (gathered under Megatron-SP)
        q after RoPE                                           [B, T, q]
        k after RoPE and v (local) | gathered K, V            2 [B, T, kv] | 2 [B, S, kv]
        attention output (the flash output; with a K/V gather
            also the reshaped copy the output projection saves) [B, T, q] (x2 with a gather)
        log-sum-exp                                            [B, n, T]
        MLP h1, h3 and the gated product                       3 [B, T, f]
    """
    B, T, Tr = s.batch, s.tokens, s.stream_tokens
    gathered = s.kv_parts > 1 and s.kv_exchange == "allgather"
    stream = s.act(Tr, s.hidden)
    norms = 2 * stream + 2 * B * Tr * s.stat
    inputs = 2 * s.act(T, s.hidden)
    kv = 2 * s.act(s.seq, s.kv) if gathered else 2 * s.act(T, s.kv)
    expand = _gqa_expansion(s) if gathered else 0
    out = s.act(T, s.q) * (2 if s.kv_parts > 1 else 1)  # ring, ulysses: the core's own output too
    lse = B * s.heads * T * s.stat
    mlp = 3 * s.act(T, s.ffn)
    none = norms + inputs + s.act(T, s.q) + kv + expand + out + lse + mlp
    selective = norms + inputs + s.act(T, s.q) + 2 * s.act(T, s.kv) + s.act(T, s.q) + mlp
    ce = max(s.elt, 4)
    logits = B * T * s.vocab
    head_saved = (
        stream + B * Tr * s.stat + s.act(T, s.hidden) + logits * ce + B * T * (9 if vocab_parallel else 8)
    )
    upcast = logits * 4 if s.elt < 4 else 0
    return ActivationTerms(
        saved_layer={"none": none, "selective": selective, "op": op_saved(s), "full": stream},
        stream=stream,
        forward_work=stream + s.act(T, s.hidden) + 4 * s.act(T, s.ffn) + (inputs if megatron_sp else 0),
        backward_work=5 * s.act(T, s.ffn),  # six [B, T, f] temporaries, the gated product (saved) freed
        attention_backward_work=_attention_backward_work(s, gathered) + exchange_backward_work(s),
        mlp_saved=mlp + s.act(T, s.hidden),
        op_unreached=s.act(T, s.hidden),  # w2's output: the recompute stops at w2's inputs
        fixed_saved=2 * T * (s.q // s.heads) * s.elt + B * T * (9 if vocab_parallel else 8),
        head_saved=head_saved,
        head_forward_work=logits * s.elt + upcast,
        # the whole-vocab loss's backward reuses the upcast logits' memory (2 [B, T, V] in fp32 at
        # most); a vocab-parallel loss keeps the upcast beside its own working tensors
        head_backward_work=(upcast if vocab_parallel else 2 * logits * ce) + s.act(T, s.hidden),
        prefill_head=logits * s.elt + s.act(T, s.hidden),
    )


# ----------------------------------------------------------------------------- op-level recomputation


def block_mm_calls(s: Shapes) -> list[tuple[int, int]]:
    """(k, n) of each mm of the shared model's block forward, in call order, on [B T, k] inputs:
    wq, wk, wv, wo, w1, w3, w2 at the rank's widths."""
    h, q, kv, f = s.hidden, s.q, s.kv, s.ffn
    return [(h, q), (h, kv), (h, kv), (q, h), (h, f), (h, f), (f, h)]


def tsp_mm_calls(s: Shapes, parts: int) -> list[tuple[int, int]]:
    """(k, n) of each mm of a TSP block forward (strategies/tsp_attention.py, tsp_ring.py), in
    call order: q, k, v of each of the ``parts`` head blocks, then h1, h3 of each MLP shard.
    Its output projections accumulate with addmm, never an mm: never kept, always re-run."""
    h = s.hidden
    attention = [(h, s.q // parts), (h, s.kv // parts), (h, s.kv // parts)] * parts
    return attention + [(h, s.ffn // parts), (h, s.ffn // parts)] * parts


def op_kept(calls: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The mm calls whose outputs op-level recomputation keeps: the 1st, 3rd, 5th ..."""
    return calls[::2]


def op_saved(s: Shapes, calls: list[tuple[int, int]] | None = None) -> int:
    """Per block under op-level recomputation (tspbench.model.recompute): the block input the
    checkpoint keeps, the kept mm outputs [B, T, n] (the shared block's wq, wv, w1, w2 by
    default) and the attention kernels' outputs and log-sum-exps. Without a K/V gather that is
    one kernel call per head ([B, T, q] and [B, n, T]); with one, each local chunk at an offset
    is a prefix call and a square call of its own length, both kept: twice that on every rank
    but the first (whose first chunk is a square, one call), the most any rank keeps."""
    calls = block_mm_calls(s) if calls is None else calls
    mm = sum(s.act(s.tokens, n) for _, n in op_kept(calls))
    kernel_calls = 2 if s.kv_parts > 1 else 1
    attention = kernel_calls * (s.act(s.tokens, s.q) + s.batch * s.heads * s.tokens * s.stat)
    return s.act(s.stream_tokens, s.hidden) + mm + attention


def exchange_backward_work(s: Shapes) -> int:
    """What the ring's or Ulysses' backward holds beyond a local attention's (tspbench.dist.ring,
    ulysses): the ring its K/V stacked, the chunk arriving, the dK/dV accumulator (float32 at
    least) and the one in flight, dQ's accumulator; Ulysses the head-sharded gradients of q, k, v
    [B, S, (n + 2m)/D] and their all-to-all's send and receive buffers."""
    if s.kv_parts == 1 or s.kv_exchange == "allgather":
        return 0
    kv, wide = s.act(s.tokens, s.kv), max(s.elt, 4) / s.elt
    if s.kv_exchange == "ring":
        return int(4 * kv + 4 * kv * wide + s.act(s.tokens, s.q) * wide)
    return 3 * s.act(s.tokens, s.q + 2 * s.kv)


def _gqa_expansion(s: Shapes) -> int:
    """Grouped K/V repeated to the query heads for chunks at an offset (Sq < Sk), saved for backward."""
    if s.q == s.kv:
        return 0
    return math.ceil(2 * s.act(s.seq, s.q) * (2 * s.kv_parts + 1) / (2 * s.kv_parts))


def _attention_backward_work(s: Shapes, gathered: bool) -> int:
    """Working memory of a block's attention backward, beyond its saved tensors (the MLP's are
    freed by then): the output-projection grad and the flash gradients dq, dk, dv; with a K/V
    gather also the prefix dK, dV and the whole-sequence dK, dV they are concatenated into."""
    attention = 2 * s.act(s.tokens, s.q) + 2 * s.act(s.tokens, s.kv)
    if gathered:  # dK, dV of the key prefix, and the whole-sequence dK, dV they are joined into
        attention += 4 * s.act(s.seq, s.kv)
    return attention
