"""tspbench.costs.flops: the model-FLOP convention MFU uses, by hand for the paper's 7B."""

from __future__ import annotations

from tspbench.core.spec import ModelConfig
from tspbench.costs import flops


def test_the_7b_forward_is_megatron_s_count_with_a_gated_mlp() -> None:
    """Per layer 8 s h^2 (Q, K, V, O with as many key/value heads as query heads), 6 s h f (three
    MLP projections) and 2 s^2 h (QK^T and PV over the causal half); the head 2 s h V."""
    cfg = ModelConfig.preset("7b")
    s, h, f, v, layers = 32768, 4096, 16384, 32000, 32
    layer = 8 * s * h * h + 6 * s * h * f + 2 * s * s * h
    assert flops.forward_flops_per_sequence(cfg, s) == layers * layer + 2 * s * h * v
    assert flops.model_flops_per_step(cfg, 2, s, "train") == 6 * flops.forward_flops_per_sequence(cfg, s)
    assert flops.model_flops_per_step(cfg, 2, s, "infer") == 2 * flops.forward_flops_per_sequence(cfg, s)


def test_mfu_is_model_flops_over_time_gpus_and_peak() -> None:
    assert flops.mfu(8e15, 2.0, 8, 1000.0) == 8e15 / 2.0 / 8 / 1e15


def test_zigzag_area_counts_each_rank_s_chunk_pairs() -> None:
    """Zigzag gives rank r chunks r and 2P - 1 - r of 2P: a query chunk i covers the i earlier key
    chunks and its own square (counted whole, as a dense causal call is), the same area on every
    rank; one rank covers the whole square."""
    seq = 1024
    assert flops.zigzag_rectangle(seq, seq, 1) == seq * seq
    for parts in (2, 4, 8):
        chunk = seq // (2 * parts)
        for rank in range(parts):
            covered = sum((i + 1) * chunk * chunk for i in (rank, 2 * parts - 1 - rank))
            assert flops.zigzag_rectangle(seq // parts, seq, parts) == covered


def test_each_kv_exchange_s_kernel_area_by_hand() -> None:
    """P = 2, C = 4 (S = 16): the all-gather's calls cover C^2 (2P + 1) (two offset chunks);
    the ring's a 2C x 2C causal square and P - 1 blocks of 2C x C; Ulysses' the whole S x S
    square for 1/P of the heads, S^2 / P per rank's heads (#48)."""
    c, p = 4, 2
    assert flops.zigzag_rectangle(8, 16, p) == c * c * 5
    assert flops.zigzag_rectangle(8, 16, p, "ring") == (2 * c) ** 2 + (p - 1) * 2 * c * c
    assert flops.zigzag_rectangle(8, 16, p, "ulysses") == 16 * 16 / p
    assert flops.causal_fraction(p, "ring") == (2 * c) ** 2 / flops.zigzag_rectangle(8, 16, p, "ring")
    assert flops.causal_fraction(p, "ulysses") == 1.0
    assert (flops.causal_block(8, 16, p, "ring"), flops.causal_block(8, 16, p, "ulysses")) == (8, 16)
