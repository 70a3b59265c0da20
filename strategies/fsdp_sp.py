"""FSDP+SP: FSDP2 over the same D ranks that shard the tokens, TSP's nearest peer.

torchtitan's folding of its FSDP and context-parallel dimensions onto one set of ranks: each
rank holds 1/D of every parameter, gradient and optimizer state (as strategies/fsdp.py, a block
all-gathered at a time) and 1/D of the tokens (zigzag chunks p and 2D-1-p, as strategies/sp.py),
and attention all-gathers K and V over the sequence (tspbench.dist.zigzag.ZigzagAttention: an
all-gather context parallel, so a rank holds the whole sequence's K/V of every head of one
layer at a time), or with ``kv_exchange`` ring passes K/V chunks round (two in hand at most,
tspbench.dist.ring) or ulysses all-to-alls to head shards (tspbench.dist.ulysses), as sp.
With ``--dp``: HSDP, replicas over dp.

Collectives per step: fsdp's over the sp group (weights gathered, gradients reduce-scattered),
sp's K/V all-gathers in forward and their reduce-scatters in backward, the loss all-reduce.
Decode: each step FSDP's gathers and, per layer, sp's query all-gather and partials all-to-all.
"""

from __future__ import annotations

from dataclasses import replace

from tspbench.strategies.fsdp import BLOCK_WINDOW, FullyShardedDataParallel
from tspbench.strategies.sp import ExchangesKV, kv_exchange_traffic, zigzag_extra_bytes

from tspbench.costs.flops import ForwardFlops, qkv_gemm_flops
from tspbench.strategy import Traffic, register


@register
class ShardedSequenceParallel(ExchangesKV, FullyShardedDataParallel):
    name = "fsdp_sp"
    axes = ("sp",)
    batch_axes = ()
    sequence_axis = "sp"
    weight_axes = ("sp",)
    shard_axis = "sp"
    summary = "FSDP2 and sequence parallel on one axis: 1/D of the weights and of the tokens, K/V exchanged"

    def traffic(self) -> list[Traffic]:
        """FSDP's and the K/V gathers. A K/V gather recomputed in backward waits on the link
        behind the block's FSDP transfers (window "fsdp block", issued as its backward begins),
        which run first under the compute before it: the recomputed q, k, v projections (full),
        the k projection alone (op: the recompute runs as the block's backward begins, and of
        the three only wk's output is not kept), or the MLP's and the output projection's
        backward (selective)."""
        kv = kv_exchange_traffic(self, "sp", self.config.n_heads, self.config.n_kv_heads)
        s = self.shapes()
        f, qkv = ForwardFlops.of(s), qkv_gemm_flops(s)
        before = {"full": qkv, "op": qkv * s.kv / (s.q + 2 * s.kv)}.get(
            self.workload.recompute, 2 * f.mlp_gemm + 2 * (f.attn_gemm - qkv)
        )
        queued = [
            replace(t, queue=BLOCK_WINDOW, queue_flops=before) if t.op == "all_gather" else t for t in kv
        ]
        return super().traffic() + queued

    def elementwise_extra_bytes(self) -> int:
        return super().elementwise_extra_bytes() + zigzag_extra_bytes(self)

    def decode_traffic(self) -> list[Traffic]:
        """FSDP's gathers of one step and the sharded-cache attention over sp (tspbench.dist.decode)."""
        return super().decode_traffic() + self.query_traffic("sp", self.config.n_heads, self.config.n_layers)
