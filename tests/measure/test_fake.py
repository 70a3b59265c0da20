"""The fake world (tspbench.measure.fake) against real runs and against what is derived by hand.

CPU path: for every registered strategy at world size 2 and 4 (dp training aside: torch DDP cannot
run on fake tensors, and the fake world refuses it by name), train (recomputation none,
selective, full), prefill and decode (a KV cache, then greedy steps; at world 4 the modes
``AT_WORLD_4``), the fake world's peak
memory and its breakdown equal one real gloo step's to the byte (tests/stepping.py), its
collectives equal the real run's exactly, and its FLOPs equal torch's FlopCounterMode on the
real run.

CUDA path (simulated, bf16): every strategy at world size 2 and 4 trains and prefills; every
attention call is the flash kernel, never SDPA's math path, and only with semantics every
backend documents alike (no mask, or a causal square: a chunk at an offset is split into its
key prefix and a square, tests/model/test_model.py checks the split's values on CPU); the
collectives equal the strategy's analytic count; parameters are bf16 and the optimizer keeps
float32 master weights and moments (12 bytes per parameter), except FSDP2's float32 shards (4
bytes) with float32 moments (8 bytes) and torch AdamW's 0-dim step (4 bytes a parameter tensor).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import ClassVar

import fault_plugin
import pytest
from stepping import measure_layouts
from torch.utils._python_dispatch import TorchDispatchMode

from tspbench.analytic.profile_choice import choose_profile
from tspbench.cli.main import main
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.dist.comm import summarize
from tspbench.dist.fake_world import run_fake_ranks
from tspbench.dist.launch import launch
from tspbench.measure import fake_cuda
from tspbench.measure.fake import fake_bench, fake_rank
from tspbench.strategy import check_layout, iter_strategies, layout_for, registry

pytestmark = pytest.mark.slow  # multi-rank runs, sweeps or Slurm: make test, not make check

MODES = (("train", "none"), ("train", "selective"), ("train", "full"), ("infer", "none"))
TINY = ModelConfig.preset("tiny")
STRATEGIES = [cls for cls in iter_strategies()]


def workloads(dtype: str, device: str, seq_len: int = 256, decode: bool = False) -> list[Workload]:
    loads = [Workload(TINY, 1, seq_len, m, r, dtype, device) for m, r in MODES]
    if decode:  # a context of seq_len tokens in the KV cache, then greedy steps
        loads.append(Workload(TINY, 2, seq_len, "decode", "none", dtype, device, decode_tokens=3))
    return loads


def cases(world: int, dtype: str, device: str, decode: bool = False) -> list[tuple[Layout, list[Workload]]]:
    """Every registered strategy at ``world`` ranks with the workloads it can run in the fake
    world. A layout the strategy refuses raises (no strategy may drop out unseen); what a
    strategy declares it cannot execute under fake tensors is checked to be DDP's training
    alone (``test_only_ddp_training_is_left_out``)."""
    out = []
    for cls in STRATEGIES:
        layout, loads = layout_for(cls, world), workloads(dtype, device, decode=decode)
        check_layout(layout, loads[0])
        out.append((layout, [w for w in loads if not cls.fake_world_obstacle(layout, w)]))
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_only_ddp_training_is_left_out(world: int) -> None:
    """The one point the fake world cannot execute, named: torch DDP's C++ reducer reads gradient
    storage outside the dispatcher (the fake world refuses it by name before anything starts)."""
    left_out = {
        (layout.strategy, w.mode, w.recompute)
        for layout, kept in cases(world, "float32", "cpu", decode=True)
        for w in workloads("float32", "cpu", decode=True)
        if w not in kept
    }
    assert left_out == {("dp", "train", r) for r in ("none", "selective", "full")}


# ----------------------------------------------------------------------------- CPU: equal to gloo


def _fake(cases: list[tuple[Layout, list[Workload]]]) -> list[list[dict]]:
    out = []
    for layout, loads in cases:
        ranks = [fake_rank(layout, workload) for workload in loads]
        for r in ranks:  # decode: FLOPs by part (prefill, steps); the real count is the whole run's
            r["flops"] = sum(r["flops"].values()) if isinstance(r["flops"], dict) else r["flops"]
        out.append(ranks)
    return out


# World 4 adds groups of four and the 2 x 2 meshes to world 2's checks; recomputation and a
# bare prefill do not depend on the group's size, so there it keeps training without and with
# full recomputation, and decode (whose prefill is the bare one's forward).
AT_WORLD_4 = {("train", "none"), ("train", "full"), ("decode", "none")}


@pytest.mark.parametrize("world", [2, 4])
def test_cpu_fake_world_equals_a_real_gloo_run(world: int) -> None:
    todo = cases(world, "float32", "cpu", decode=True)
    if world == 4:
        todo = [(layout, [w for w in loads if (w.mode, w.recompute) in AT_WORLD_4]) for layout, loads in todo]
    fake = run_fake_ranks(_fake, range(world), world, todo, workers=2)  # [rank][case][workload]
    real = launch(measure_layouts, world, todo, timeout=900)  # [rank][case][workload], one launch
    failures = []
    for c, (layout, loads) in enumerate(todo):
        for rank in range(world):
            for i, workload in enumerate(loads):
                r, f = real[rank][c][i], fake[rank][c][i]
                where = f"{layout.describe()} rank {rank} {workload.mode}/{workload.recompute}"
                got, want = (
                    (f["memory"].peak_bytes, f["memory"].by_category),
                    (r["memory"].peak_bytes, r["memory"].by_category),
                )
                if got != want:
                    failures.append(f"{where}: memory fake {got} != real {want}")
                if summarize(f["comm"]) != r["comm"]:
                    failures.append(f"{where}: comm fake {summarize(f['comm'])} != real {r['comm']}")
                if f["flops"] != r["flops"]:
                    failures.append(f"{where}: FLOPs fake {f['flops']} != real {r['flops']}")
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------------------- CUDA, simulated


class AttentionCalls(TorchDispatchMode):
    """The attention kernels a step calls, (op, query length, key length, causal), and any plain
    softmax (SDPA's math path would compute one over an [Sq, Sk] score matrix)."""

    CAUSAL_ARG: ClassVar[dict[str, int]] = {  # where is_causal sits in the op's arguments
        "_scaled_dot_product_flash_attention": 4,
        "_scaled_dot_product_flash_attention_backward": 11,
    }

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int, int, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if "attention" in name or name == "_softmax":
            first = 1 if name.endswith("_backward") else 0  # backward: (grad_out, q, k, v, ...)
            q, k = args[first], args[first + 1] if name != "_softmax" else args[first]
            at = self.CAUSAL_ARG.get(name, len(args))
            self.calls.append((name, q.shape[-2], k.shape[-2], bool(args[at]) if at < len(args) else False))
        return func(*args, **(kwargs or {}))


def _cuda_rank(cases: list[tuple[Layout, list[Workload]]]) -> list[list[dict]]:
    out = []
    for layout, loads in cases:
        results = []
        for workload in loads:
            with AttentionCalls() as seen:  # a user mode: runs before the fake mode, sees every op
                results.append({**fake_rank(layout, workload), "attention": seen.calls})
        out.append(results)
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_cuda_path_bf16_every_strategy(world: int) -> None:
    todo = cases(world, "bfloat16", "cuda")
    env = fake_cuda.preload_env("cuda")
    executed = [0, world - 1]  # the first and the last rank of each layout: lean
    ranks = dict(
        zip(executed, run_fake_ranks(_cuda_rank, executed, world, todo, workers=2, env=env), strict=True)
    )
    failures = []
    for c, (layout, loads) in enumerate(todo):
        cls = check_layout(layout, loads[0])
        for rank in executed:
            for i, workload in enumerate(loads):
                r = ranks[rank][c][i]
                where = f"{layout.describe()} rank {rank} {workload.mode}/{workload.recompute}"
                kernels = {name for name, *_ in r["attention"]}
                if kernels != {"_scaled_dot_product_flash_attention"} | (
                    {"_scaled_dot_product_flash_attention_backward"} if workload.mode == "train" else set()
                ):
                    failures.append(f"{where}: attention kernels {sorted(kernels)}")
                # only semantics every backend documents alike: no mask, or a causal square
                skewed = [c for c in r["attention"] if c[3] and c[1] != c[2]]
                if skewed:
                    failures.append(f"{where}: causal flash calls with Sq != Sk: {skewed[:3]}")
                sharded = cls.sequence_axis is not None and layout.degree(cls.sequence_axis) > 1
                if sharded and not any(sq < sk and not causal for _, sq, sk, causal in r["attention"]):
                    failures.append(f"{where}: no query chunk at an offset reached the flash kernel")
                if summarize(r["comm"]) != summarize(cls.comm_volume(layout, workload)):
                    failures.append(f"{where}: comm {summarize(r['comm'])} != analytic")
                local = cls.for_analysis(layout, workload).local_parameters().values()
                params = sum(math.prod(shape) for shape, _ in local)
                # bf16 weights with float32 master copies and moments in the optimizer (2 + 12 B),
                # except under FSDP2, whose shards stay float32 (the masters; bf16 only gathered)
                # and whose torch AdamW also keeps a 0-dim float32 step per parameter (4 B)
                fsdp = layout.strategy.startswith("fsdp")
                per_param, per_state = (4, 8) if fsdp else (2, 12)
                optimizer = per_state * params + (4 * len(local) if fsdp else 0)
                state = r["state"]
                if state["parameters"] != per_param * params:
                    failures.append(
                        f"{where}: parameters {state['parameters']} B != {per_param} B x {params}"
                    )
                if workload.mode == "train" and state["optimizer"] != optimizer:
                    failures.append(f"{where}: optimizer {state['optimizer']} B != {optimizer} B")
                if r["memory"].method != "fake":
                    failures.append(f"{where}: memory method {r['memory'].method}")
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------------------- failures are data


@pytest.fixture
def faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fault_plugin's faulty strategies, installed (an entry point on PYTHONPATH) for the fake
    world's workers and registered here."""
    monkeypatch.setenv("PYTHONPATH", fault_plugin.install(tmp_path)["PYTHONPATH"])
    monkeypatch.syspath_prepend(str(tmp_path))
    import tspbench_fault_plugin as module

    for name, cls_name in fault_plugin.STRATEGIES.items():  # removed again after the test
        monkeypatch.setitem(registry._REGISTRY, name, getattr(module, cls_name))


def _children() -> set[int]:
    found = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        found.update(int(p) for p in (task / "children").read_text().split())
    return found


def test_an_op_without_a_fake_kernel_or_a_raising_rank_is_a_failed_record(faults: None) -> None:
    workload = Workload(TINY, 1, 128, "infer", device="cpu")  # prefill: no DDP (cannot run on fakes)
    before, cpu = _children(), choose_profile(None, device="cpu", measured=False)
    record = fake_bench(Layout("fault_nonzero", dp=2), workload, cpu, ranks=[0])
    assert record["status"] == "failed" and record["failed_op"] == "aten.nonzero.default"
    assert record["error"].startswith("rank 0 raised FakeOpError: aten.nonzero.default")
    record = fake_bench(Layout("fault_raise", dp=2), workload, cpu, ranks=[0, 1])
    assert record["status"] == "failed" and record["failed_rank"] == 1
    assert "injected fault on rank 1" in record["error"] and "failed_op" not in record
    record = fake_bench(Layout("fault_hang", dp=2), workload, cpu, ranks=[0], timeout=3)
    assert record["status"] == "timeout"
    assert _children() <= before  # every worker is gone


# ----------------------------------------------------------------------------- command line, sweep


def test_bench_fake_json_and_its_usage_errors(capsys: pytest.CaptureFixture) -> None:
    base = ["bench", "--fake", "--device", "cpu", "--strategy", "tp", "--tp", "2", "--seq-len", "128"]
    assert main([*base, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["source"], record["peak_memory_method"], record["fake_ranks"]) == ("fake", "fake", [0, 1])
    assert (
        "step_time_s" not in record
        and record["comm_bytes_per_step"] == record["predicted_comm_bytes_per_step"]
    )
    assert [r["rank"] for r in record["peak_memory_by_rank"]] == [0, 1]
    for argv, says in (
        ([*base, "--fake-ranks", "2"], "has 2 ranks"),
        ([*base[:1], *base[2:], "--fake-ranks", "0"], "needs --fake"),
        (["bench", "--fake", "--strategy", "dp", "--dp", "2", "--seq-len", "128"], "DDP's C++ reducer"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, err


def test_the_fake_executor_runs_a_sweep(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(
        "name: fakes\nmodel: {preset: tiny}\nsettings: {seq_len: 128, device: cpu}\n"
        "layout: {strategy: sp, sp: 2}\nsweep: {grid: {dp: [1, 64]}}\nrun: {fake_ranks: first}\n"
    )
    assert main(["run", str(path), "--executor", "fake", "--results", str(tmp_path / "results")]) == 0
    records = [json.loads(p.read_text()) for p in (tmp_path / "results" / "fakes").glob("*/result.json")]
    assert sorted(r["world_size"] for r in records) == [2, 128]
    assert all(
        r["source"] == "fake" and r["fake_ranks"] == [0] and r["status"] == "completed" for r in records
    )
    assert main(["report", str(tmp_path / "results" / "fakes")]) == 0
    report = (tmp_path / "results" / "fakes" / "report" / "report.md").read_text()
    assert "executed in a fake world" in report and "memory_parity.png" in report
    summary = (tmp_path / "results" / "fakes" / "report" / "summary.md").read_text()
    assert "peak fake world" in summary and "| fake |" in summary


def test_bench_fake_decode_records_the_cache_comm_and_flops_but_no_time(
    capsys: pytest.CaptureFixture,
) -> None:
    argv = ["bench", "--fake", "--device", "cpu", "--strategy", "tsp", "--tsp", "2", "--seq-len", "64"]
    assert main([*argv, "--mode", "decode", "--decode-tokens", "3", "--batch", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    cache = 2 * TINY.n_layers * 2 * (64 + 3) * TINY.kv_hidden * 4 // 2  # K and V, half the positions a rank
    assert (r["status"], r["kv_cache_bytes"], r["peak_memory_kv_cache_bytes"]) == ("completed", cache, cache)
    assert r["decode_comm_bytes_per_step"] == r["predicted_decode_comm_bytes_per_step"] > 0
    assert r["hardware_flops_per_decode_step_per_gpu"] > 0 and r["tokens_per_step"] == 2 * 4
    assert "tpot_s" not in r and "ttft_s" not in r and r["energy_unavailable"] == "fake world: no kernel runs"
    assert main([*argv, "--mode", "decode", "--decode-tokens", "3"]) == 0
    assert "kv cache" in capsys.readouterr().out.lower()
