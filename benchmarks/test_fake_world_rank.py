"""The fake world's speed and footprint: one rank of the paper's biggest job, executed for real.

Rank 0 of TSP 8 x dp 128 (1,024 ranks), the 7B model at 128K tokens, bf16, full recomputation,
a training step on simulated CUDA: wall time of ``fake_bench`` (worker start included) and the
worker process's peak RSS (real memory: a fake 7B rank holds none of its ~21 GiB). The suite
runs it once untimed on a 2-layer 7B (same widths and sequence), so it cannot rot; ``make
bench`` runs all 32 layers. The record must also be right: comm bytes equal to the model's,
peak within 15% of it, RSS under 2 GiB.
"""

from __future__ import annotations

from tspbench.analytic.profile_choice import choose_profile
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.measure.fake import fake_bench

LAYOUT = Layout("tsp", dp=128, tsp=8)


def test_fake_7b_rank_at_128k(benchmark) -> None:
    layers = 2 if benchmark.disabled else 32
    model = ModelConfig.preset("7b", n_layers=layers)
    workload = Workload(model, 1, 131072, "train", "full", "bfloat16", "cuda")
    benchmark.group = (
        f"fake world, one rank of tsp8 x dp128, 7B ({layers} layers), 128K, train, full recompute"
    )
    record = benchmark.pedantic(
        fake_bench,
        args=(LAYOUT, workload, choose_profile(None, device="cuda", measured=False)),  # mi300x
        kwargs={"ranks": [0]},
        rounds=1,
        iterations=1,
    )
    assert record["status"] == "completed", record["error"]
    assert record["comm_bytes_per_step"] == record["predicted_comm_bytes_per_step"]
    assert abs(record["predicted_memory_error"]) <= 0.15
    assert record["fake_peak_rss_bytes"] <= 2 * 2**30
    benchmark.extra_info.update(
        fake_seconds=record["fake_seconds"],
        worker_peak_rss_mib=record["fake_peak_rss_bytes"] / 2**20,
        peak_memory_gib=record["peak_memory_bytes"] / 2**30,
    )
