"""TSP: tensor and sequence parallelism folded onto ONE axis of D ranks (arXiv 2604.26294).

Rank p holds 1/D of every weight AND 1/D of the tokens:

    attention   packed [Wq_p; Wk_p; Wv_p; Wo_p^T]  [2 (n + m) d / D, h]   heads block p
    MLP         packed [W1_p; W3_p; W2_p^T]         [3 f / D, h]          columns/rows p
    embedding, LM head                              [V / D, h]            vocabulary block p
    norms       replicated (their gradients all-reduced over dp x tsp)
    tokens      zigzag chunks p and 2D-1-p          [B, S / D]

Attention runs the broadcast schedule (strategies/tsp_attention.py): owners broadcast their
packed shard, every rank projects its own tokens, K/V of one head block are all-gathered over
the sequence, and the output projection accumulates locally. The MLP, embedding and LM head run
the ring schedule (strategies/tsp_ring.py): shards circulate with async send/recv overlapped
with the GEMMs, gradient accumulators ride home behind them; ``mlp_exchange`` broadcast gives the
MLP the attention's owner broadcasts and reduces instead (tsp_mlp.py). No activation is all-reduced.

Weights move on channel 1 of the tsp group, K/V and gradients on channel 0, so on NCCL the two
streams proceed side by side. ``overlap=False`` issues every transfer blocking (same math).
Recomputation: ``full`` checkpoints the block (the broadcasts, gathers and ring shifts of its
forward repeat in backward); ``selective`` equals ``none`` here, because the attention core is
always recomputed in backward (keeping it would keep K/V of every head block); ``op``
(torchtitan's per-op policy, tspbench.model.recompute) keeps every other mm of TSP's own call
sequence (q, k, v per head block, then h1, h3 per MLP shard: tspbench.costs.memory.tsp_mm_calls)
and the attention kernels' outputs, and re-runs the rest of the forward, collectives included.

Read top to bottom: the shard sizes (``Shards``, the rows of the table above, computed once),
the schedule (``placement``, ``transform``), then the cost declarations in the order of a step:
what moves (``traffic``), FLOPs, memory, element-wise bytes, and last the decode step's.
"""

from __future__ import annotations

from dataclasses import dataclass

from tspbench.strategies.tsp_attention import AttentionSpec, Prefetch, TSPAttention
from tspbench.strategies.tsp_mlp import mlp_decode_traffic, mlp_exchange, mlp_traffic
from tspbench.strategies.tsp_ring import Ring, RingEmbedding, RingHead, RingMLP

from tspbench.core.spec import ModelConfig
from tspbench.costs.decode import Widths
from tspbench.costs.elementwise import over_step, tsp_block_bytes, tsp_ends_bytes
from tspbench.costs.flops import FlopTerms, ForwardFlops, op_kept_gemm, qkv_gemm_flops
from tspbench.costs.memory import ActivationTerms, autograd_terms, op_saved, tsp_mm_calls
from tspbench.model.transformer import Transformer
from tspbench.strategy import Piece, Placement, Strategy, Traffic, register


@dataclass(frozen=True)
class Shards:
    """Rank p's block of every weight, in rows of h (the module doc's table): the schedule builds
    its parameters with these counts and the cost declarations price the same ones, so the two
    cannot disagree. Exact: the layout check makes heads, MLP and vocabulary divisible by D."""

    q: int  # query rows of the head block, n d / D (Wq_p, and Wo_p^T)
    kv: int  # key (and value) rows of the head block, m d / D
    ffn: int  # MLP columns, f / D (each of W1_p, W3_p, W2_p^T)
    vocab: int  # vocabulary rows, V / D (embedding and LM head)
    heads: int  # query heads of the head block, n / D
    kv_heads: int  # key/value heads of the head block, m / D
    hidden: int  # h, every shard's row length

    @classmethod
    def of(cls, cfg: ModelConfig, d: int) -> Shards:
        """Block p of D of ``cfg``'s weights (any p: every block is the same size)."""
        blocks = (cfg.hidden, cfg.kv_hidden, cfg.ffn_hidden, cfg.vocab_size, cfg.n_heads, cfg.n_kv_heads)
        return cls(*(n // d for n in blocks), hidden=cfg.hidden)

    @property
    def attention(self) -> int:
        """Rows of the packed attention shard [Wq_p; Wk_p; Wv_p; Wo_p^T]."""
        return 2 * self.q + 2 * self.kv

    @property
    def mlp(self) -> int:
        """Rows of the packed MLP shard [W1_p; W3_p; W2_p^T]."""
        return 3 * self.ffn

    def nbytes(self, elt: int) -> tuple[int, int, int]:
        """Bytes of the (attention, MLP, vocabulary) shard at ``elt`` bytes per element."""
        row = self.hidden * elt
        return self.attention * row, self.mlp * row, self.vocab * row


def _packed(prefix: str, names: tuple[str, ...], transposed: str) -> tuple[Piece, ...]:
    return tuple(Piece(f"{prefix}{n}.weight", 1 if n == transposed else 0, n == transposed) for n in names)


@register
class FoldedParallel(Strategy):
    """The module doc's layout: the schedule wires tsp_attention.py's and tsp_ring.py's modules
    into the model; the cost declarations below count what they move, compute and hold."""

    name = "tsp"
    axes = ("tsp",)
    sequence_axis = "tsp"
    channels = 2
    weight_axes = ("tsp",)
    switches = ("overlap", "mlp_exchange")
    summary = "folded tensor+sequence parallel: 1/D of every weight and 1/D of the tokens per rank"

    def shards(self) -> Shards:
        """This rank's block of every weight (one of D on the tsp axis)."""
        return Shards.of(self.config, self.mesh.size("tsp"))

    # ------------------------------------------------------------------ the schedule

    def placement(self, name: str, shape: tuple[int, ...]) -> Placement:
        if "norm" in name:
            return Placement((Piece(name),), reduce=("dp", "tsp"))
        prefix = name.removesuffix("shard")
        if name.endswith("attention.shard"):
            pieces = _packed(prefix, ("wq", "wk", "wv", "wo"), "wo")
        elif name.endswith("mlp.shard"):
            pieces = _packed(prefix, ("w1", "w3", "w2"), "w2")
        else:  # embed.weight, head.weight: vocabulary blocks
            pieces = (Piece(name, 0),)
        return Placement(pieces, axis="tsp", reduce=("dp",))

    def transform(self, model: Transformer) -> None:
        """Attention: the broadcast schedule (tsp_attention.py); MLP, embedding, LM head: the ring
        (tsp_ring.py). Weights travel on channel 1, K/V and gradients on channel 0."""
        cfg, sh = self.config, self.shards()
        kv_group, w_group = self.group("tsp"), self.group("tsp", channel=1)
        overlap = self.workload.overlap
        prefetch = Prefetch(w_group) if overlap else None
        spec = AttentionSpec(sh.q, sh.kv, cfg.head_dim, kv_group, w_group, overlap, prefetch)
        ring = Ring(w_group, kv_group, overlap)
        mlp = mlp_exchange(self.workload.mlp_exchange, w_group, kv_group, overlap)
        for layer in model.layers:
            layer.attention = TSPAttention(sh.attention, cfg.hidden, spec)
            layer.mlp = RingMLP(sh.mlp, cfg.hidden, mlp)
        model.embed = RingEmbedding(sh.vocab, cfg.hidden, ring)
        model.head = RingHead(sh.vocab, cfg.hidden, ring)

    # ------------------------------------------------------------------ its costs, in step order

    def traffic(self) -> list[Traffic]:
        """Weights move on channel 1 and hide behind compute; K/V and gradients use channel 0.
        The K/V gathers and their reduce-scatters are on the critical path. With overlap, the
        last forward pass issues the first broadcast of the backward's first pass (Prefetch).

        A weight transfer hides only behind the compute issued between it and its wait (its
        window): a broadcast and a shard's gradient reduce behind one head block (its projections
        and attention core; backward 2x the projections, 3.5x the core), a ring shift and its
        accumulator behind the GEMMs of the shard in hand (backward 2x; the LM head's 3x, as it
        recomputes its logits), the embedding's shifts behind nothing (lookups only); the MLP's by
        its ``mlp_exchange`` (tsp_mlp.mlp_traffic: ring shifts or the owners' broadcasts). The transfers
        of one window in backward (a shard's weights and its gradients) share the link. A head
        block's K/V gather waits behind its window's transfers on the link: in forward after its
        q, k, v projections, in backward at once (it is the block's first op)."""
        sh, d, elt, L = self.shards(), self.mesh.size("tsp"), self.workload.element_size, self.config.n_layers
        train = self.workload.mode == "train"
        attn_shard, mlp_shard, vocab_shard = sh.nbytes(elt)
        kv = 2 * self.local_batch * self.workload.seq_len * sh.kv * elt  # one head block's K and V
        f = ForwardFlops.of(self.shapes())
        head_block, mlp_step, head_step = (f.attn_gemm + f.core) / d, f.mlp_gemm / d, f.head / d
        block_back = (2 * f.attn_gemm + 3.5 * f.core) / d
        qkv = qkv_gemm_flops(self.shapes()) / d  # one head block's
        ax = ("tsp",)

        def hides(
            op: str, size: int, n: int, window: str, flops: float, phase: str = "backward", channel: int = 1
        ) -> Traffic:  # ``n`` transfers, each hidden behind ``flops`` of its named window
            scope = "model" if window in ("embedding", "head", "prefetch") else "block"
            return Traffic(op, ax, size, n, phase, scope, True, channel, window_flops=flops, window=window)

        mlp_fwd, mlp_bwd = mlp_traffic(self.workload.mlp_exchange, d, L, mlp_shard, mlp_step, hides)
        out = [
            hides("broadcast", attn_shard, d * L, "head block", head_block, "forward"),
            Traffic("all_gather", ax, kv, d * L, "forward", "block", queue="head block", queue_flops=qkv),
            *mlp_fwd,
            hides("send_recv", vocab_shard, d - 1, "embedding", 0.0, "forward"),
            hides("send_recv", vocab_shard, d - 1, "head", head_step, "forward"),
        ]
        if train:
            prefetched = 1 if self.workload.overlap else 0  # the first backward pass's W_0, issued in forward
            out += [
                hides("broadcast", attn_shard, prefetched, "prefetch", head_block, "forward"),
                hides("broadcast", attn_shard, d * L - prefetched, "head block", block_back),
                Traffic("all_gather", ax, kv, d * L, "backward", queue="head block"),
                Traffic("reduce_scatter", ax, kv, d * L, "backward"),
                hides("reduce", attn_shard, d * L, "head block", block_back, channel=0),  # weight gradients
                *mlp_bwd,  # weights again, and the gradients home (tsp_mlp.py)
                hides("send_recv", vocab_shard, d, "embedding", 0.0, channel=0),  # accumulators
                hides("send_recv", vocab_shard, d, "head", 3 * head_step, channel=0),  # accumulators
                hides("send_recv", vocab_shard, d - 1, "head", 3 * head_step),  # head shards
            ]
        return out

    def flop_terms(self) -> FlopTerms:
        """Every rank projects its own tokens with every shard (whole widths, local tokens).
        Backward: GEMMs 2x forward, the attention core recomputed then differentiated (1 + 2.5
        forwards), and the LM head's logits recomputed (3x forward instead of 2x)."""
        f = ForwardFlops.of(self.shapes())
        if self.workload.mode != "train":
            return f.prefill()
        gemm, attention = 3 * f.blocks_gemm + 4 * f.head, 4.5 * f.layers * f.core
        if self.workload.recompute == "full":
            gemm, attention = gemm + f.blocks_gemm, attention + f.layers * f.core
        if self.workload.recompute == "op":  # the forward's GEMMs again but the kept mm; cores kept
            s = self.shapes()
            gemm += f.blocks_gemm - f.layers * op_kept_gemm(s, tsp_mm_calls(s, self.mesh.size("tsp")))
        return f.terms(gemm, attention)

    def activation_terms(self) -> ActivationTerms:
        """Saved per block: x, x_mid, both normed inputs, q, k, v of every head block (together
        the size of the whole q, k, v projections of the local tokens) and h1, h3 of every MLP
        shard; never gathered K/V, never another rank's weights. Working memory: two weight
        shards in flight, one head block's gathered K/V (and its gradients in backward); with
        overlap, the next attention pass's first shard in flight during the MLP (and, training,
        from the last forward pass through the head to the first backward pass)."""
        s, sh, d = self.shapes(), self.shards(), self.mesh.size("tsp")
        B, T, e = s.batch, s.tokens, s.elt
        stream = s.act(T, s.hidden)
        none = 4 * stream + 2 * B * T * s.stat + s.act(T, s.q) + 2 * s.act(T, s.kv) + 2 * s.act(T, s.ffn)
        attn_shard, mlp_shard, vocab_shard = sh.nbytes(e)
        kv_block = 2 * s.act(s.seq, sh.kv)  # K and V of one head block, whole sequence
        block = s.act(T, sh.q)
        in_flight = min(2, d - 1)  # shard buffers besides the rank's own (a parameter)
        prefetched = attn_shard if self.workload.overlap else 0
        held_to_backward = prefetched if self.workload.mode == "train" else 0
        attn_fwd = in_flight * attn_shard + 2 * kv_block + 5 * block + stream
        mlp_fwd = prefetched + in_flight * mlp_shard + 4 * s.act(T, sh.ffn) + stream
        attn_bwd = 3 * attn_shard + 3 * kv_block + 6 * block + stream
        mlp_bwd = prefetched + 4 * mlp_shard + 6 * s.act(T, sh.ffn) + stream
        logits = B * T * sh.vocab * max(e, 4)
        op = op_saved(s, tsp_mm_calls(s, d))  # x, every other projection, the kernels' outputs
        return ActivationTerms(
            saved_layer={"none": none, "selective": none, "op": op, "full": stream},
            stream=stream,
            forward_work=stream + max(attn_fwd, mlp_fwd),
            backward_work=max(attn_bwd, mlp_bwd),
            fixed_saved=2 * T * (s.q // s.heads) * e + B * T * 8,
            head_saved=2 * stream + 2 * B * T * s.stat + B * T * 8,
            head_forward_work=held_to_backward + in_flight * vocab_shard + 3 * logits,  # logits, - max, exp
            head_backward_work=held_to_backward + 3 * vocab_shard + 2 * logits + stream,
            prefill_head=B * T * s.vocab * e + B * T * sh.vocab * e + in_flight * vocab_shard,
        )

    def elementwise_layer_bytes(self) -> int:
        """TSP's blocks save less than they compute (its backward recomputes the attention core,
        the gated product and the gathered K/V): their element-wise work is that of an autograd
        block of the same shapes (the rank's tokens, every head block and MLP shard)."""
        return autograd_terms(self.shapes()).saved_layer["none"]

    def elementwise_extra_bytes(self) -> int:
        """What TSP's own code moves beyond the model's operators (tsp_attention.py, tsp_ring.py):
        per layer tspbench.costs.elementwise.tsp_block_bytes (its forward again under full
        recomputation; the attention core's is always recomputed, so selective adds nothing), and
        once per step tsp_ends_bytes (the ring embedding, the loss or the prefill's logits)."""
        s, w = self.shapes(), self.workload
        forwards = 2 if w.recompute in ("full", "op") else 1
        return over_step(s.layers, w.mode, forwards, tsp_block_bytes(s), tsp_ends_bytes(s, w.mode == "train"))

    def decode_traffic(self) -> list[Traffic]:
        """One decode step still moves every weight shard: D broadcasts of the attention shard
        and D-1 ring shifts (or D broadcasts) of the MLP shard per layer, D-1 of the vocabulary shard for the
        embedding and for the head (channel 1); per head block, the sharded-cache attention's
        query all-gather and partials all-to-all (channel 0, n/D heads). Each weight transfer
        hides behind the GEMMs of the shard in hand (its b slots through the shard's rows, 2
        FLOPs per weight per row): D of them per layer for both block schedules and D for the
        head; the embedding's ring has only lookups to hide behind."""
        sh, d, elt, L = self.shards(), self.mesh.size("tsp"), self.workload.element_size, self.config.n_layers
        attn, mlp, vocab = sh.nbytes(elt)
        ax = ("tsp",)

        def hides(op: str, size: int, n: int, window: str, gemms: int, scope: str = "block") -> Traffic:
            # ``n`` transfers on channel 1, hidden behind ``gemms`` runs of their window's GEMMs
            flops = 2.0 * self.decode_slots * size / elt if gemms else 0.0
            return Traffic(op, ax, size, n, "decode", scope, True, 1, window_flops=flops, window=window,
                           window_count=gemms)  # fmt: skip

        return [
            hides("broadcast", attn, d * L, "attention", d * L),
            *self.query_traffic("tsp", sh.heads, d * L),
            *mlp_decode_traffic(self.workload.mlp_exchange, d, L, mlp, hides),
            hides("send_recv", vocab, d - 1, "embedding", 0, "model"),
            hides("send_recv", vocab, d - 1, "head", d, "model"),
        ]

    def decode_held_widths(self) -> Widths:
        """One head block and one MLP shard at a time (every one visits)."""
        sh = self.shards()
        return Widths(sh.heads, sh.kv_heads, sh.ffn, self.config.vocab_size)

    def decode_weights_bytes(self) -> int:
        """Up to two visiting shards in flight besides the rank's own (the largest of them)."""
        d = self.mesh.size("tsp")
        return min(2, d - 1) * max(self.shards().nbytes(self.workload.element_size)) if d > 1 else 0
