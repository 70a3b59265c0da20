"""Every field of a record (results/<experiment>/<run>/result.json, records.csv, bench --json),
with its unit and where its number comes from. docs/results.md is generated from this table
(``tools/gen_docs.py``), and tests/project/test_docs.py checks that every key of every stored record
is one of these, so neither can drift from the code.

A name may hold a placeholder: <category> (peak memory categories), <op> (collective ops),
<phase> (step phases), <key> (environment keys).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from tspbench.core.names import CATEGORIES, PHASES

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "send_recv")
PLACEHOLDERS = {
    "<category>": "|".join(CATEGORIES),
    "<op>": "|".join((*OPS, "other_streams")),
    "<phase>": "|".join(PHASES),
    "<key>": r"[a-z0-9_]+",
}


@dataclass(frozen=True)
class Field:
    name: str
    unit: str
    origin: str  # point | measured | fake | predicted | timeline | run
    meaning: str

    def pattern(self) -> re.Pattern[str]:
        text = re.escape(self.name)
        for holder, choices in PLACEHOLDERS.items():
            text = text.replace(re.escape(holder), f"(?:{choices})")
        return re.compile(f"^{text}$")


def _f(name: str, unit: str, origin: str, meaning: str) -> Field:
    return Field(name, unit, origin, meaning)


FIELDS: tuple[Field, ...] = (
    # ------------------------------------------------------------------ what the point is
    _f("strategy", "", "point", "the layout's strategy (dp, fsdp, fsdp_sp, tp, sp, tp_sp, tsp)"),
    *(_f(a, "ranks", "point", f"degree of the {a} axis") for a in ("dp", "tp", "sp", "tsp", "fsdp")),
    _f("world_size", "ranks", "point", "the job's ranks (GPUs): the product of the degrees"),
    _f("model", "", "point", "model preset or name"),
    _f("batch", "sequences", "point", "micro-batch per model replica"),
    _f("seq_len", "tokens", "point", "sequence length (decode: the context)"),
    _f("mode", "", "point", "train, infer (prefill) or decode"),
    _f("recompute", "", "point", "activation recomputation: none, selective, full"),
    _f("dtype", "", "point", "float64, float32 or bfloat16 (bf16 weights keep float32 masters)"),
    _f("device", "", "point", "cpu or cuda (a fake world's cuda is simulated)"),
    _f("seed", "", "point", "seed of the weights and the synthetic tokens"),
    _f("megatron_sp", "", "point", "TP with Megatron sequence parallelism"),
    _f("overlap", "", "point", "TSP's weight transfers async (true) or blocking"),
    _f("decode_tokens", "tokens", "point", "decode: greedy steps after the prefill"),
    _f("kv_exchange", "", "point", "how the sequence axis shares K/V: allgather, ring or ulysses"),
    _f("mlp_exchange", "", "point", "how TSP's MLP weight shards move: ring or broadcast"),
    _f("source", "", "point", "measured, fake (executed in a fake world) or predicted"),
    _f("status", "", "run", "completed, oom, failed, timeout, cancelled"),
    _f("error", "", "run", "the failure's excerpt (full text in logs/)"),
    _f("failed_rank", "rank", "run", "the rank that failed first"),
    _f("steps", "steps", "run", "timed steps per round"),
    _f("warmup", "steps", "run", "untimed steps first"),
    _f("repeats", "rounds", "run", "rounds of timed steps"),
    _f("capacity_bytes", "B", "run", "simulated device capacity (CPU), None: none"),
    _f("hardware", "", "run", "the hardware profile a predicted record is for"),
    _f("hardware_choice", "", "run", "the one profile time, timeline and MFU are priced on, and why"),
    _f("env_<key>", "", "run", "the environment: versions, host, device, git sha, Slurm job"),
    _f("published_entries", "", "run", "backtest: the published runs this fake record stands for"),
    _f("trace_path", "", "run", "where the traced step was written (.npz, or a Chrome trace)"),
    # ------------------------------------------------------------------ time and throughput
    _f("step_time_s", "s", "measured", "median step time, each step the slowest rank's"),
    _f("step_time_p10_s", "s", "measured", "10th percentile of the timed steps"),
    _f("step_time_p90_s", "s", "measured", "90th percentile of the timed steps"),
    _f("step_times_s", "s", "measured", "every timed step"),
    _f("tokens_per_step", "tokens", "point", "tokens one step processes over all replicas"),
    _f("tokens_per_s_per_gpu", "tokens/s", "measured", "tokens per step / step time / world size"),
    _f("model_flops_per_step", "FLOP", "point", "model FLOPs (causal attention as half the square)"),
    _f("tflops_per_gpu", "TFLOP/s", "measured", "model FLOPs per step / step time / world size"),
    _f("mfu", "", "measured", "model FLOPs per second per GPU / the device's peak (mfu_peak_tflops)"),
    _f("predicted_mfu", "", "predicted", "the same from the model's step time"),
    _f("mfu_peak_tflops", "TFLOP/s", "run", "the peak MFU divides by"),
    _f("mfu_peak_source", "", "run", "which profile's peak, and where its number comes from"),
    _f("mfu_flop_convention", "", "run", "how model FLOPs count causal attention"),
    _f("loss", "", "measured", "the step's global mean loss"),
    # ------------------------------------------------------------------ memory
    _f("peak_memory_bytes", "B", "measured", "peak per rank, max over ranks (the median tracked step)"),
    _f("peak_memory_<category>_bytes", "B", "measured", "live bytes of the category at the peak"),
    _f("peak_memory_method", "", "measured", "cpu-dispatch (exact tracker), cuda-allocator, or fake"),
    _f("peak_memory_phase", "", "measured", "the phase the peak fell in"),
    _f("peak_memory_in_<phase>_bytes", "B", "measured", "the highest live total in the phase"),
    _f("peak_memory_reserved_bytes", "B", "measured", "CUDA: the caching allocator's reserved peak"),
    _f("peak_memory_tracked_bytes", "B", "measured", "CUDA: the dispatch tracker's peak"),
    _f("peak_memory_untracked_bytes", "B", "measured", "CUDA: allocated - tracked (workspaces, NCCL)"),
    _f("peak_memory_rank", "rank", "measured", "the rank with the highest peak"),
    _f("peak_memory_bytes_per_rank", "B", "measured", "each rank's peak"),
    _f("peak_memory_by_rank", "B", "fake", "each executed rank's peak by category"),
    _f("peak_memory_min_bytes", "B", "measured", "the lowest tracked step's peak"),
    _f("peak_memory_max_bytes", "B", "measured", "the highest tracked step's peak"),
    _f("peak_memory_step_bytes", "B", "measured", "each tracked step's peak"),
    _f("peak_memory_first_tracked_step", "step", "measured", "which step the first tracked one was"),
    _f("state_<category>_bytes", "B", "measured", "parameters, gradients, optimizer state after the step"),
    _f("kv_cache_bytes", "B", "measured", "decode: the KV cache per rank"),
    _f("attention_kernel", "", "measured", "attention kernels called: cudnn, flash, cpu_flash, *_one_query"),
    _f("decode_cuda_graphs", "", "point", "decode: whether the timed steps replayed captured CUDA graphs"),
    _f("decode_tokens_sha1", "", "measured", "decode: digest of the generated tokens (graphed = eager)"),
    _f("prefill_peak_memory_bytes", "B", "predicted", "decode model: the prefill's peak"),
    _f("decode_step_peak_memory_bytes", "B", "predicted", "decode model: a step's peak"),
    _f("fits", "", "predicted", "whether the predicted peak fits the device's usable memory"),
    _f("fake_peak_rss_bytes", "B", "fake", "real memory of a fake-world worker process"),
    _f("fake_ranks", "", "fake", "the ranks executed in the fake world"),
    _f("fake_seconds", "s", "fake", "wall time of the fake execution"),
    # ------------------------------------------------------------------ communication and FLOPs
    _f("cpu_busy_s", "s", "measured", "CPU, Linux: a rank's step on a core or waiting for one, mean"),
    _f("cpu_runqueue_s", "s", "measured", "... of it waiting for a core (the kernel's schedstat)"),
    _f("cpu_blocked_s", "s", "measured", "... asleep: on a collective or a peer"),
    _f("cpu_comm_threads_s", "s", "measured", "... CPU its other (gloo's) threads ran meanwhile"),
    _f("comm_bytes_per_step", "B", "measured", "bus bytes per step (nccl-tests convention), busiest rank"),
    _f("comm_<op>_bytes", "B", "measured", "bus bytes of the op per step"),
    _f("comm_<phase>_bytes", "B", "measured", "bus bytes of the phase per step"),
    _f("crossing_axes", "", "predicted", "axes whose groups span nodes ('dp+sp'; '': none)"),
    _f("internode_comm_s", "s", "predicted", "model: collectives over node-crossing groups, hidden or not"),
    _f("internode_share", "", "predicted", "internode_comm_s / the model's step time"),
    _f("hardware_flops_per_step_per_gpu", "FLOP", "measured", "FlopCounterMode's count, recompute included"),
    _f("hardware_flops_prefill_per_gpu", "FLOP", "measured", "decode: the prefill's"),
    _f("hardware_flops_per_decode_step_per_gpu", "FLOP", "measured", "decode: one step's"),
    _f("decode_comm_bytes_per_step", "B", "measured", "decode: bus bytes per decode step"),
    _f("decode_comm_<op>_bytes_per_step", "B", "measured", "decode: bus bytes of the op per step"),
    # ------------------------------------------------------------------ decode time and energy
    _f("ttft_s", "s", "measured", "decode: time to the first token (the prefill)"),
    _f("ttft_p99_s", "s", "measured", "decode: TTFT 99th percentile over the timed runs (one prefill each)"),
    _f("ttft_times_s", "s", "measured", "decode: every timed prefill"),
    _f("tpot_s", "s", "measured", "decode: median time per output token"),
    _f("tpot_p50_s", "s", "measured", "decode: TPOT 50th percentile"),
    _f("tpot_p90_s", "s", "measured", "decode: TPOT 90th percentile"),
    _f("tpot_p99_s", "s", "measured", "decode: TPOT 99th percentile"),
    _f("tpot_times_s", "s", "measured", "decode: every step's time"),
    _f("decode_tokens_per_s", "tokens/s", "measured", "decode: batch x data degree / TPOT median"),
    _f("energy_source", "", "measured", "which counter the energy came from"),
    _f("energy_unavailable", "", "measured", "why there is no energy figure"),
    # ------------------------------------------------------------------ cost (analytic/cost.py, #43)
    _f("gpu_hours_per_btok", "GPU-h", "run", "world x step time / tokens per step / 3600 x 1e9"),
    _f("gpu_hours_per_mtok", "GPU-h", "run", "decode: world x TPOT / (batch x dp) / 3600 x 1e6"),
    _f("gpu_hours_source", "", "run", "measured (the step time measured) or projected (model, timeline)"),
    _f("energy_per_token_j", "J", "run", "per token (decode: generated): measured, else projected"),
    _f("energy_per_token_source", "", "run", "measured (NVML, amdsmi, RAPL) or projected (board_power_w)"),
    # ------------------------------------------------------------------ the analytic model
    _f("predicted_hardware", "", "predicted", "the profile the model's time is for"),
    _f("predicted_peak_memory_bytes", "B", "predicted", "the model's peak per rank"),
    _f("predicted_<category>_bytes", "B", "predicted", "the model's bytes of the category at its peak"),
    _f("predicted_peak_memory_moment", "", "predicted", "the step moment the model's peak is at"),
    _f("predicted_peak_memory_phase", "", "predicted", "the phase of that moment"),
    _f("predicted_memory_error", "", "predicted", "predicted / measured peak - 1"),
    _f("predicted_peak_memory_bytes_error", "", "predicted", "decode: predicted / measured peak - 1"),
    _f("predicted_comm_bytes_per_step", "B", "predicted", "the strategy's analytic bus bytes"),
    _f("predicted_hardware_flops_per_gpu", "FLOP", "predicted", "the strategy's analytic hardware FLOPs"),
    _f("predicted_flops_error", "", "predicted", "predicted / counted hardware FLOPs - 1"),
    _f("predicted_step_time_s", "s", "predicted", "the closed-form step time on predicted_hardware"),
    _f("predicted_compute_s", "s", "predicted", "its compute"),
    _f("predicted_gemm_s", "s", "predicted", "... of it GEMMs"),
    _f("predicted_attention_s", "s", "predicted", "... attention"),
    _f("predicted_elementwise_s", "s", "predicted", "... element-wise ops"),
    _f("predicted_comm_exposed_s", "s", "predicted", "its communication on the critical path"),
    _f("predicted_comm_hidden_s", "s", "predicted", "its communication hidden under compute"),
    _f("predicted_step_time_error", "", "predicted", "predicted / measured step time - 1"),
    _f("comm_exposed_s", "s", "predicted", "predict executor: communication on the critical path"),
    _f("comm_hidden_s", "s", "predicted", "predict executor: communication hidden under compute"),
    _f("compute_s", "s", "predicted", "predict executor: compute"),
    _f("gemm_s", "s", "predicted", "predict executor: ... of it GEMMs"),
    _f("attention_s", "s", "predicted", "predict executor: ... attention"),
    _f("elementwise_s", "s", "predicted", "predict executor: ... element-wise ops"),
    _f("predicted_ttft_s", "s", "predicted", "decode model: time to the first token"),
    _f("predicted_ttft_s_error", "", "predicted", "decode: predicted / measured TTFT - 1"),
    _f("predicted_tpot_p50_s", "s", "predicted", "decode model: median time per output token"),
    _f("predicted_tpot_p50_s_error", "", "predicted", "decode: predicted / measured TPOT - 1"),
    _f("predicted_kv_cache_bytes", "B", "predicted", "decode model: the KV cache per rank"),
    _f("predicted_kv_cache_bytes_error", "", "predicted", "decode: predicted / measured cache - 1"),
    _f("predicted_decode_comm_bytes_per_step", "B", "predicted", "decode model: bus bytes per step"),
    _f("predicted_decode_comm_bytes_per_step_error", "", "predicted", "decode: predicted / counted - 1"),
    _f("decode_gemm_s", "s", "predicted", "decode model: a step's GEMMs"),
    _f("decode_attention_s", "s", "predicted", "decode model: a step's attention over the cache"),
    _f("decode_comm_exposed_s", "s", "predicted", "decode model: a step's exposed communication"),
    _f("decode_comm_hidden_s", "s", "predicted", "decode model: a step's hidden communication"),
    _f("break_even_batch", "sequences", "predicted", "decode model: TSP hides its weights from here"),
    # ------------------------------------------------------------------ the timeline
    _f("timeline_hardware", "", "timeline", "the profile the traced step was replayed on"),
    _f("timeline_step_time_s", "s", "timeline", "the replayed step: the critical rank's end"),
    _f("timeline_step_time_error", "", "timeline", "replayed / measured step time - 1"),
    _f("timeline_compute_s", "s", "timeline", "the critical rank's compute on its default stream"),
    _f("timeline_gemm_s", "s", "timeline", "its GEMM kernels, each with the per-op overhead"),
    _f("timeline_attention_s", "s", "timeline", "... its attention kernels"),
    _f("timeline_elementwise_s", "s", "timeline", "... its element-wise kernels"),
    _f("timeline_comm_exposed_s", "s", "timeline", "its idle time waiting for collectives"),
    _f("timeline_exposed_<op>_s", "s", "timeline", "... by the op waited for"),
    _f("timeline_waits_on_peers_s", "s", "timeline", "its idle time waiting for peers to issue"),
    _f("timeline_critical_rank", "rank", "timeline", "the rank that ends last"),
    _f("timeline_busy_s", "s", "timeline", "mean over the replayed ranks: computing (default stream)"),
    _f("timeline_blocked_s", "s", "timeline", "mean over the replayed ranks: the rest of each one's step"),
    _f("timeline_hidden_fraction_<op>", "", "timeline", "the op's time under compute (all ranks)"),
    _f("timeline_weights_hidden_fraction", "", "timeline", "TSP: its weight shards' traffic under compute"),
)


@cache
def field_for(key: str) -> Field | None:
    """The field a record key is, or None."""
    return next((f for f, pattern in _patterns() if pattern.match(key)), None)


@cache
def _patterns() -> list[tuple[Field, re.Pattern[str]]]:
    return [(f, f.pattern()) for f in FIELDS]


def markdown_table() -> str:
    """The fields as docs/results.md shows them."""
    rows = ["| field | unit | from | meaning |", "|---|---|---|---|"]
    rows += [f"| `{f.name}` | {f.unit or '-'} | {f.origin} | {f.meaning} |" for f in FIELDS]
    return "\n".join(rows) + "\n"
