"""tspbench.costs.memory: what one block saves for backward under plain autograd, by hand."""

from __future__ import annotations

from tspbench.costs.memory import Shapes, autograd_terms


def test_a_block_saves_its_inputs_q_k_v_output_statistics_and_mlp() -> None:
    """float32, B 1, T = S = 16 tokens, h = q = kv = 8, f = 32, 2 heads (bytes):
    x_in, x_mid 2 T h 4 = 1,024 and their norm statistics 2 T 4 = 128; the normed inputs 1,024;
    q 512; k, v 1,024; the attention output 512; the log-sum-exp 2 T 4 = 128; h1, h3 and the
    gated product 3 T f 4 = 6,144. Selective recomputation drops the log-sum-exp (the core is
    run again); full keeps the block's input only."""
    s = Shapes(batch=1, tokens=16, stream_tokens=16, seq=16, hidden=8, q=8, kv=8, ffn=32, vocab=64, heads=2,
               kv_parts=1, elt=4, layers=2)  # fmt: skip
    saved = autograd_terms(s).saved_layer
    assert saved["none"] == 1024 + 128 + 1024 + 512 + 1024 + 512 + 128 + 6144
    assert saved["selective"] == saved["none"] - 128
    assert saved["full"] == 16 * 8 * 4


def test_bf16_counts_the_upcast_logits_once_in_the_loss_backward() -> None:
    """bf16 [B T V] logits 2 bytes each; the loss's backward holds two fp32 [B T V] tensors
    (its input's upcast reused) and the head's input gradient [B T h]."""
    s = Shapes(batch=1, tokens=16, stream_tokens=16, seq=16, hidden=8, q=8, kv=8, ffn=32, vocab=64, heads=2,
               kv_parts=1, elt=2, layers=2)  # fmt: skip
    assert autograd_terms(s).head_backward_work == 2 * 16 * 64 * 4 + 16 * 8 * 2


def test_a_ring_or_ulysses_block_saves_local_k_v_where_the_all_gather_saves_the_whole_sequence() -> None:
    """float32, B 1, S 64 over 4 ranks (T 16), h = q = kv = 8: the all-gather saves K, V of all
    64 tokens (2 S kv 4 = 4,096 bytes) and the output twice (the core's and the projection's
    copy); a ring or Ulysses saves the local K, V (1,024) and the output twice as well (#48).
    Neither adds to the forward; their backward buffers are the attention half's."""
    base = dict(batch=1, tokens=16, stream_tokens=16, seq=64, hidden=8, q=8, kv=8, ffn=32, vocab=64,
                heads=2, kv_parts=4, elt=4, layers=2)  # fmt: skip
    gathered = autograd_terms(Shapes(**base))
    for exchange in ("ring", "ulysses"):
        terms = autograd_terms(Shapes(**base, kv_exchange=exchange))
        assert gathered.saved_layer["none"] - terms.saved_layer["none"] == 4096 - 1024
        assert terms.saved_layer["selective"] == gathered.saved_layer["selective"]
        assert terms.forward_work == gathered.forward_work
        assert terms.attention_backward_work > 2 * 16 * 8 * 4 + 2 * 16 * 8 * 4
