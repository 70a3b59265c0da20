"""Measurements for one GPU beside gpu-check (tools/h200_session.sh runs them), each a JSON file:

model_vs_transformers.json  the model (the 7B cut to 4 layers, bf16) forward + backward against
                            transformers' LlamaForCausalLM with the same dimensions and SDPA,
                            at 8K and 32K tokens: median seconds, peak allocated
launch_costs.json           a tiny kernel's cost: launched eagerly, inside a replayed graph,
                            and a whole graph replay
attention_kernels.json      causal squares and offset rectangles, cuDNN and FlashAttention-2
                            by name, forward + backward, by size: seconds and TFLOP/s
op_kinds.json               one training step of dp, tsp and fsdp at world 1 (7B cut to 4
                            layers, 8K) under torch.profiler: device time by kernel kind
decode_kernels.json         the 7B decoding (16K context, batch 4): TPOT eager and graphed
                            against the floor from a copy bandwidth measured in the same run

python -m tools.h200_probes OUT [names...]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from tspbench.calibrate.launches import timed
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.dist.launch import launch
from tspbench.model import attention

SEVEN_B_4 = ModelConfig.preset("7b").cut_to(4)


def median_s(fn, repeats: int = 5) -> float:
    """Median seconds on the GPU after two warm-ups (gpu-check's timer)."""
    return timed(fn, "cuda", repeats)


def model_vs_transformers() -> list[dict]:
    return launch(_compare_rank, 1, device="cuda", timeout=600)[0]


def _compare_rank() -> list[dict]:
    from tspbench.measure.runner import RankRun

    out = []
    for seq in (8192, 32768):
        workload = Workload(SEVEN_B_4, 1, seq, "train", "none", "bfloat16", "cuda")
        torch.cuda.reset_peak_memory_stats()
        ours_s, tokens = _model_fwd_bwd(RankRun(Layout("dp", dp=1), workload))
        ours_peak = torch.cuda.max_memory_allocated()
        torch.cuda.empty_cache()
        row = {"seq_len": seq, "model_s": ours_s, "model_peak_bytes": ours_peak}
        row.update(transformers_llama(tokens, seq))
        row["ratio"] = row["model_s"] / row["transformers_s"] if row.get("transformers_s") else None
        out.append(row)
    return out


def _model_fwd_bwd(run) -> tuple[float, torch.Tensor]:
    def ours() -> None:
        run.strategy.loss(run.model, run.batch).backward()
        run.model.zero_grad(set_to_none=True)

    return median_s(ours), run.batch.tokens


def transformers_llama(tokens: torch.Tensor, seq: int) -> dict:
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        return {"transformers_error": str(exc)}
    import transformers

    cfg = LlamaConfig(
        hidden_size=4096,
        intermediate_size=16384,
        num_hidden_layers=4,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        max_position_embeddings=seq,
        attn_implementation="sdpa",
    )
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    tokens = tokens.reshape(1, -1)[:, :seq]

    def theirs() -> None:
        model(input_ids=tokens, labels=tokens).loss.backward()
        model.zero_grad(set_to_none=True)

    torch.cuda.reset_peak_memory_stats()
    seconds = median_s(theirs)
    return {
        "transformers_s": seconds,
        "transformers_peak_bytes": torch.cuda.max_memory_allocated(),
        "transformers_version": transformers.__version__,
    }


def launch_costs() -> dict:
    x = torch.zeros(1, device="cuda")
    n = 2000

    def eager() -> None:
        for _ in range(n):
            x.add_(1)

    graph = torch.cuda.CUDAGraph()
    eager()  # warm-up before capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for _ in range(n):
            x.add_(1)
    one = torch.cuda.CUDAGraph()
    with torch.cuda.graph(one):
        x.add_(1)

    def replays() -> None:
        for _ in range(n):
            one.replay()

    return {
        "kernels": n,
        "eager_us_per_kernel": median_s(eager) / n * 1e6,
        "graphed_us_per_kernel": median_s(graph.replay) / n * 1e6,
        "replay_us_per_graph_of_one_kernel": median_s(replays) / n * 1e6,
    }


def attention_kernels() -> list[dict]:
    rows = []
    heads, d = 32, 128
    for seq in (1024, 2048, 4096, 8192, 16384, 32768):
        for case in ("square", "offset"):
            for name, kernels in (("cudnn", attention.CUDA_CUDNN), ("flash", attention.CUDA_FLASH)):
                q, k, v = (
                    torch.randn(1, heads, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    for _ in "qkv"
                )
                chunk = q[:, :, seq // 2 :].detach().requires_grad_()

                def call(case=case, kernels=kernels, q=q, k=k, v=v, chunk=chunk) -> None:
                    if case == "square":
                        o = kernels.square(q, k, v)
                    else:
                        o = attention.LowerRightCausal.apply(chunk, k, v, kernels)
                    o.backward(torch.ones_like(o))

                seconds = median_s(call, repeats=5 if seq < 32768 else 3)
                sq = seq if case == "square" else seq // 2
                flops = 4 * heads * d * sq * seq * 3.5 / (2 if case == "square" else 1)  # fwd 1 + bwd 2.5
                if case == "offset":
                    flops -= 4 * heads * d * sq * sq * 3.5 / 2  # the causal square's masked half
                rows.append(
                    {"seq": seq, "case": case, "kernel": name, "s": seconds, "tflops": flops / seconds / 1e12}
                )
    return rows


def _op_kinds_rank(strategy: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from tspbench.measure.runner import RankRun

    workload = Workload(SEVEN_B_4, 1, 8192, "train", "none", "bfloat16", "cuda")
    run = RankRun(Layout(strategy), workload)
    for _ in range(2):
        run.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run.step()
        torch.cuda.synchronize()
    kinds: dict[str, float] = {}
    top: dict[str, float] = {}
    for event in prof.key_averages():
        us = event.device_time_total
        if us <= 0:
            continue
        name = event.key.lower()
        kind = (
            "attention"
            if any(t in name for t in ("flash", "fmha", "cudnn", "attn", "sdpa"))
            else "gemm"
            if any(t in name for t in ("gemm", "cutlass", "xmma", "nvjet", "sm90", "matmul"))
            else "elementwise"
        )
        kinds[kind] = kinds.get(kind, 0.0) + us / 1e6
        top[event.key] = us / 1e6
    biggest = dict(sorted(top.items(), key=lambda kv: -kv[1])[:25])
    point = {"model": "7b", "n_layers": 4, "batch": workload.batch, "seq_len": workload.seq_len}
    return {"strategy": strategy, "point": point, "seconds_by_kind": kinds, "top_kernels_s": biggest}


def op_kinds() -> list[dict]:
    return [launch(_op_kinds_rank, 1, s, device="cuda", timeout=300)[0] for s in ("dp", "tsp", "fsdp")]


def decode_kernels() -> dict:
    return launch(_decode_rank, 1, device="cuda", timeout=600)[0]


def copy_gbs() -> float:
    """HBM bandwidth of a 4 GiB device-to-device copy, bytes read plus bytes written."""
    source = torch.randn(2**31, device="cuda", dtype=torch.bfloat16)
    target = torch.empty_like(source)
    return 2 * source.numel() * 2 / median_s(lambda: target.copy_(source), 10) / 1e9


def one_query_layer_seconds() -> dict:
    """Decode's one-query attention alone over one layer's cache of the decode point (B 4, 16K;
    a prefix of a longer cache, as decode reads it), and the bandwidth that makes."""
    q = torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (
        torch.randn(4, 32, 16384 + 16, 128, device="cuda", dtype=torch.bfloat16)[:, :, :16384] for _ in "kv"
    )
    seconds = median_s(lambda: attention.one_query_attention(q, k, v), 20)
    nbytes = 2 * k.numel() * k.element_size()
    return {"model_s": seconds, "cache_bytes": nbytes, "gbs": nbytes / seconds / 1e9}


def _decode_rank() -> dict:
    """The 7B decoding 32 tokens after 16K of context, batch 4 (gpu-check's decode/tpot point), on
    the one-query attention alone over one layer's cache, TPOT eager and graphed, the tokens of
    both, and the floor from a device-to-device copy's bandwidth measured here. (At 959b60b it
    also compared a two-matmul one-query kernel: results/h200/2026-12-04_959b60b.)"""
    from tspbench.checks.gpu_rows import decode_floor_s
    from tspbench.measure.decode_bench import tokens_digest
    from tspbench.measure.decode_graphs import DecodeGraphs
    from tspbench.measure.runner import RankRun

    model = ModelConfig.preset("7b")
    workload = Workload(model, 4, 16384, "decode", "none", "bfloat16", "cuda", decode_tokens=32)
    run = RankRun(Layout("dp", dp=1), workload)
    bandwidth = copy_gbs()
    cache = run.strategy.cache_bytes()
    point = {"seq_len": 16384, "decode_tokens": 32, "kv_cache_bytes": cache}
    out: dict = {"copy_gbs": bandwidth, "floor_s": decode_floor_s(point, model, 2, bandwidth)}
    out["layer_attention"] = one_query_layer_seconds()
    run.decode_run()
    eager = [run.decode_run(timed=True) for _ in range(2)]
    graphs = DecodeGraphs(run.strategy, run.model)
    run.decode_run(graphs=graphs)
    graphed = [run.decode_run(timed=True, graphs=graphs) for _ in range(3)]
    out.update(
        eager_tpot_s=statistics.median(t for r in eager for t in r.times_s[1:]),
        graphed_tpot_s=statistics.median(t for r in graphed for t in r.times_s[1:]),
        graphed_tpot_p99_s=max(t for r in graphed for t in r.times_s[1:]),
        ttft_s=statistics.median(r.times_s[0] for r in graphed),
        eager_tokens=tokens_digest([torch.cat([t.reshape(-1) for t in eager[-1].tokens]).cpu()]),
        graphed_tokens=tokens_digest([torch.cat([t.reshape(-1) for t in graphed[-1].tokens]).cpu()]),
    )
    out["graphed_over_floor"] = out["graphed_tpot_s"] / out["floor_s"]
    out["kernels_per_graphed_step"] = kernels_in(lambda: graphs.step(graphs.tokens.clone(), 8))
    return out


def kernels_in(fn) -> dict:
    """GPU activities (kernels, copies, memsets) torch.profiler sees during ``fn()``, by kind."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
    copies = sum("memcpy" in n.lower() or "memset" in n.lower() for n in names)
    return {"kernels": len(names) - copies, "copies": copies}


def _calibrate_part(part: str, tokens: int = 8192) -> dict:
    """One of calibrate's GPU figures on the 7B cut to 4 layers at 8K tokens, timed; a stack
    trace on stderr if it runs past 50 s (a hang in gpu-check's calibrate at 887f825 left no
    record)."""
    import faulthandler

    from tspbench.calibrate import launches, opcosts, profiled

    faulthandler.dump_traceback_later(50, exit=False)
    start = time.perf_counter()
    if part == "elementwise":
        rates = profiled.elementwise_rank(SEVEN_B_4, tokens, 3, "cuda", "bfloat16")
        result: dict = {k: r.value for k, r in rates.items()}
    elif part == "timeline_costs":
        result = opcosts.timeline_costs_rank(SEVEN_B_4, tokens, 3, "cuda", "bfloat16")
    else:
        result = launches.launch_costs(5)
    faulthandler.cancel_dump_traceback_later()
    return {"seconds": time.perf_counter() - start, "result": result}


def calibrate_parts() -> dict:
    out = {}
    tokens = int(os.environ.get("CALIBRATE_TOKENS", 8192))
    for part in os.environ.get("CALIBRATE_PARTS", "launches,elementwise,timeline_costs").split(","):
        try:
            out[part] = launch(_calibrate_part, 1, part, tokens, device="cuda", timeout=75)[0]
        except Exception as exc:
            out[part] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        print(part, json.dumps(out[part], default=str)[:400], flush=True)
    return out


PROBES = {
    "calibrate_parts": calibrate_parts,
    "model_vs_transformers": model_vs_transformers,
    "launch_costs": launch_costs,
    "attention_kernels": attention_kernels,
    "op_kinds": op_kinds,
    "decode_kernels": decode_kernels,
}


def main(out: Path, names: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in names or list(PROBES):
        start = time.perf_counter()
        try:
            result = PROBES[name]()
        except Exception as exc:  # one probe's failure is its file, not the end of the others
            result = {"error": f"{type(exc).__name__}: {exc}"}
        (out / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
        print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
