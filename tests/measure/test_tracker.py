"""The exact CPU MemoryTracker against peaks derived by hand, to the byte.

All tensors are float32 (4 bytes) unless stated. Sizes are chosen so every candidate peak in a
derivation differs from the others.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from torch import nn

from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.measure.memory_report import allocator_report
from tspbench.measure.storages import persistent_bytes
from tspbench.measure.tracker import MemoryTracker, tracked
from tspbench.model.reference import Reference


def test_allocations_views_and_in_place_ops() -> None:
    with MemoryTracker() as t:
        a = torch.empty(1000)  # 4000 B                                   live 4000
        b = torch.empty(500, dtype=torch.float64)  # 4000 B               live 8000  <- peak
        views = [a.view(10, 100), a[:500], a[::2], a.view(10, 100).t(), a.expand(3, 1000)]
        a.add_(1)
        views[1].mul_(2)  # views and in-place ops allocate nothing      live 8000
        assert t.live == 8000
        del b  #                                                          live 4000
        assert t.live == 4000
        c = views[1].clone()  # a copy of a 500-element view: 2000 B      live 6000
        assert t.live == 6000
        del a  # its views still hold the storage                         live 6000
        assert t.live == 6000
        del views  #                                                      live 2000
        assert t.live == 2000
        del c  #                                                          live 0
    assert t.live == 0
    assert t.peak == 8000
    assert t.report().peak_bytes == 8000


def test_storage_resize_frees_and_reallocates() -> None:
    """FSDP2 frees gathered weights with storage.resize_(0) and re-allocates them the same way,
    outside the dispatcher; the tracker must see both."""
    original = torch.UntypedStorage.resize_
    with MemoryTracker() as t:
        a = torch.empty(1000)  # 4000 B                                   live 4000
        a.untyped_storage().resize_(0)  #                                 live 0
        assert t.live == 0
        a.untyped_storage().resize_(6000)  #                              live 6000  <- peak
        assert t.live == 6000
        a.untyped_storage().resize_(2000)  # shrinks in place of the old    live 2000
        assert t.live == 2000
        del a  #                                                          live 0
    assert (t.live, t.peak) == (0, 6000)
    assert torch.UntypedStorage.resize_ is original  # put back on exit


def _dtensor_bytes() -> tuple[int, dict[str, int]]:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = DeviceMesh("cpu", [0])
    param = nn.Parameter(DTensor.from_local(torch.zeros(250), mesh, [Shard(0)]))  # 1000 B local
    with MemoryTracker() as t:
        t.register([param], "parameters")
        doubled = param * 2  # a DTensor op: its local result is 1000 B more
        del doubled
    return t.peak, persistent_bytes(nn.ParameterList([param]), None)


@pytest.mark.slow
def test_dtensor_counts_its_local_storage() -> None:
    from tspbench.dist.launch import launch

    peak, state = launch(_dtensor_bytes, 1)[0]
    assert peak == 2000 and state["parameters"] == 1000


T_ROWS, V_SHARD = 96, 640  # tokens, vocabulary columns per rank (2 ranks): distinct candidate peaks


def _loss_parallel_log_softmax() -> tuple[int, int]:
    """One DTensor op whose working memory lives and dies inside it: log-softmax of
    vocabulary-sharded float32 logits [T, V/2] under torch's loss_parallel (what DTensor TP's
    loss runs), on 2 ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel

    mesh = init_device_mesh("cpu", (2,))
    logits = DTensor.from_local(torch.randn(T_ROWS, V_SHARD), mesh, [Shard(1)])
    with MemoryTracker() as t, loss_parallel():
        t.register([logits], "other")
        t.reset_peak()
        out = torch.log_softmax(logits, dim=-1)
        out_bytes = out.to_local().untyped_storage().nbytes()
        del out
    return t.peak, out_bytes


@pytest.mark.slow
def test_memory_inside_a_dtensor_op_is_counted() -> None:
    """loss_parallel's log-softmax (torch/distributed/tensor/parallel/loss.py, _log_softmax) on a
    local x [T, V'] float32: x_max [T, 1], all-reduced into a new [T, 1]; shifted = x - x_max
    [T, V']; exp(shifted) [T, V'] summed into [T, 1] - the peak, with x, both maxima, shifted,
    the exponentials and their sum alive: 3 T V' 4 + 3 T 4 bytes (the first maximum is freed
    when the reduced one replaces it: 3 T V' 4 + 2 T 4 + the sum's T 4). A tracker that ran the
    DTensor op whole saw only x and its output: 2 T V' 4."""
    from tspbench.dist.launch import launch

    (peak, out_bytes), _ = launch(_loss_parallel_log_softmax, 2)
    big, small = T_ROWS * V_SHARD * 4, T_ROWS * 4
    assert out_bytes == big
    assert peak == 3 * big + 3 * small


HIDDEN = 48  # the TP layer's input width: x [T, 48], its weight shard [V', 48]


def _tensor_parallel_lm_head() -> tuple[int, int, int]:
    """torch's own DTensor TP on 2 ranks: an LM head ``parallelize_module``'d column-wise
    (vocabulary-sharded logits kept as a DTensor), then loss_parallel's log-softmax, forward only:
    (peak bytes, the weight shard's and the input's bytes, the logits' local bytes)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel, parallelize_module

    mesh = init_device_mesh("cpu", (2,))
    head = nn.Linear(HIDDEN, 2 * V_SHARD, bias=False)
    parallelize_module(head, mesh, ColwiseParallel(output_layouts=Shard(-1), use_local_output=False))
    x = torch.randn(T_ROWS, HIDDEN)
    with MemoryTracker() as t, loss_parallel(), torch.no_grad():
        t.register(head.parameters(), "parameters")
        t.register([x], "other")
        t.reset_peak()
        before = t.live
        logits = head(x)
        logits_bytes = logits.to_local().untyped_storage().nbytes()
        out = torch.log_softmax(logits, dim=-1)
        del logits, out
    return t.peak, before, logits_bytes


@pytest.mark.slow
def test_memory_of_a_dtensor_tensor_parallel_layer_is_counted() -> None:
    """The same through ``parallelize_module``: before the step the weight shard [V', 48] and x
    [T, 48] (T 48 4 + V' 48 4 bytes); the head's local matmul makes the logits [T, V'] (a view of
    the replicated input, no copy); the log-softmax then peaks as in the test above, the logits
    being its input: 3 T V' 4 + 3 T 4 on top of what was there."""
    from tspbench.dist.launch import launch

    (peak, before, logits_bytes), _ = launch(_tensor_parallel_lm_head, 2)
    big, small = T_ROWS * V_SHARD * 4, T_ROWS * 4
    assert before == T_ROWS * HIDDEN * 4 + V_SHARD * HIDDEN * 4
    assert logits_bytes == big
    assert peak == before + 3 * big + 3 * small


def test_cuda_categories_are_the_trackers_at_its_peak_not_the_state_after_the_step() -> None:
    """On a GPU the allocator gives the peak and the dispatch tracker, run beside it, the
    categories: a step that peaks in forward has no gradients at its peak, though gradients
    exist after the step. What the allocator holds beyond the tracked tensors (workspaces, NCCL
    buffers, rounding) is its own field, never spread over the categories."""
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    with tracked(model) as t, t.track_autograd(model):
        x = torch.randn(512, 64)
        scratch = torch.empty(512, 1024)  # a forward working buffer bigger than anything after
        out = model(x + scratch[:, :64])
        del scratch
        t.mark_activations()
        out.sum().backward()
    tracked_report = t.report()
    assert tracked_report.by_category["gradients"] == 0 and tracked_report.phase_peaks  # peaked in forward
    assert sum(p.grad.numel() for p in model.parameters()) > 0  # ... though gradients exist now
    record = allocator_report(tracked_report.peak_bytes + 4096, 2**20, tracked_report).to_record()
    assert record["peak_memory_bytes"] == tracked_report.peak_bytes + 4096
    assert record["peak_memory_gradients_bytes"] == 0
    assert record["peak_memory_untracked_bytes"] == 4096
    assert record["peak_memory_tracked_bytes"] == tracked_report.peak_bytes
    assert record["peak_memory_reserved_bytes"] == 2**20 and record["peak_memory_method"] == "cuda-allocator"


def test_registered_tensors_count_once() -> None:
    x = torch.empty(256)  # 1024 B, exists before the tracker
    t = MemoryTracker()
    t.register([x, x.view(16, 16), x[:10]], "other")
    assert t.live == t.peak == 1024
    with t:
        y = x * 2  # 1024 B
        x.add_(y)  # in place on a registered tensor: nothing new
    assert t.peak == 2048
    del y
    assert t.live == 1024


def _mlp_step(tracker: MemoryTracker) -> tuple[int, dict[str, int], dict[str, int], int]:
    """A 2-layer MLP forward + backward under ``tracker``: (forward peak, totals after forward,
    totals after backward, live bytes after backward).

    Sizes (float32, batch 2):  x [2, 8] = 64 B   W1 [32, 8] = 1024 B   W2 [4, 32] = 512 B
                               h = x W1^T, r = relu(h) [2, 32] = 256 B each   y [2, 4] = 32 B

    Forward (params 1536 + x 64 = 1600 before):
        h = mm(x, W1^T)     +256  1856
        r = relu(h)         +256  2112   <- forward peak (h is still alive while r is made)
        h dies              -256  1856   (relu saves its output r; mm saved x and W1)
        y = mm(r, W2^T)     +32   1888
        loss = y.sum()      +4    1892
        y dies              -32   1860   end of forward: params 1536, x 64, r 256, loss 4
    Backward (whatever the order of W2.grad and grad_r):
        seed dloss          +4
        W2.grad [4, 32]     +512
        grad_r [2, 32]      +256
        grad_h [2, 32]      +256  2888   (threshold_backward)
        grad_r, r die       -512  2376
        W1.grad [32, 8]     +1024 3400   <- peak: params 1536 + x 64 + loss 4 + seed 4
                                            + W2.grad 512 + grad_h 256 + W1.grad 1024
        grad_h, seed die    -260  3140   end: params 1536, grads 1536, x 64, loss 4
    """
    gen = torch.Generator().manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 32, bias=False), nn.ReLU(), nn.Linear(32, 4, bias=False))
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    x = torch.randn(2, 8, generator=gen)
    with tracker:
        tracker.register_model(mlp)
        tracker.register([x], "other")
        tracker.reset_peak()
        with tracker.track_autograd(mlp):
            loss = mlp(x).sum()
            forward_peak = tracker.peak
            tracker.mark_activations()
            after_forward = dict(tracker.totals)
            loss.backward()
    return forward_peak, after_forward, dict(tracker.totals), tracker.live


def test_mlp_peak_by_hand() -> None:
    t = MemoryTracker()
    forward_peak, after_forward, after_backward, live = _mlp_step(t)
    assert forward_peak == 2112
    assert t.peak == 3400
    assert live == 3140
    assert after_forward == {
        "parameters": 1536,
        "gradients": 0,
        "optimizer": 0,
        "activations": 324,
        "kv_cache": 0,
        "other": 0,
    }
    # r was freed by backward; x and the loss are still referenced by the caller.
    assert after_backward == {
        "parameters": 1536,
        "gradients": 1536,
        "optimizer": 0,
        "activations": 68,
        "kv_cache": 0,
        "other": 0,
    }
    report = t.report()
    assert report.peak_bytes == 3400
    assert sum(report.by_category.values()) == 3400
    assert report.by_category["parameters"] == 1536
    assert report.to_record()["peak_memory_bytes"] == 3400


def test_mlp_peak_breakdown_counts_the_new_gradient_as_gradient() -> None:
    t = MemoryTracker()
    _mlp_step(t)
    # At the peak: W2.grad 512 and the just-made W1.grad 1024 are gradients; the seed gradient
    # (4) and grad_h (256) are working buffers; x (64, saved by mm) and the loss (4, alive at
    # mark_activations) are activations.
    assert t.report().by_category == {
        "parameters": 1536,
        "gradients": 1536,
        "optimizer": 0,
        "activations": 68,
        "kv_cache": 0,
        "other": 260,
    }


def test_mlp_peak_is_deterministic() -> None:
    a, b = MemoryTracker(), MemoryTracker()
    _mlp_step(a)
    _mlp_step(b)
    assert a.report() == b.report()
    assert a.totals == b.totals


def test_register_model_categories() -> None:
    model = nn.Linear(16, 8, bias=True)  # 128 + 8 floats = 544 B
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    model(torch.ones(2, 16)).sum().backward()
    opt.step()  # exp_avg and exp_avg_sq: 2 x 544 B, and a 0-dim float32 step per parameter: 2 x 4 B
    with tracked(model, opt) as t:
        pass
    assert t.totals == {
        "parameters": 544,
        "gradients": 544,
        "optimizer": 1096,
        "activations": 0,
        "kv_cache": 0,
        "other": 0,
    }
    assert t.peak == 544 * 4 + 8
    assert persistent_bytes(model, opt) == {"parameters": 544, "gradients": 544, "optimizer": 1096}


def _fake_world_and_mem_tracker(layout: Layout, workload: Workload) -> tuple[int, int, int]:
    """One rank's step under fake tensors measured twice, as the fake world measures it
    (tspbench.measure.fake: the optimizer state made first, then ``measured_step``) and by torch's
    own MemTracker, told of the same state beforehand (model, optimizer, the strategy's resident
    tensors, the batch); and the bytes of AdamW's 0-dim ``step`` tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from tspbench.measure.fake import create_optimizer_state, fake_device
    from tspbench.measure.runner import RankRun

    with FakeTensorMode():
        run = RankRun(layout, workload, fake_device(workload))
        create_optimizer_state(run)
        ours = run.measured_step().memory.peak_bytes
        run.optimizer.zero_grad(set_to_none=True)  # as create_optimizer_state left it
        torch_tracker = MemTracker()
        batch = (run.batch.tokens, run.batch.targets, run.batch.positions)
        torch_tracker.track_external(run.model, run.optimizer, *run.strategy.resident_tensors(), *batch)
        with torch_tracker:
            run.step()
        (theirs,) = (snap["Total"] for snap in torch_tracker.get_tracker_snapshot("peak").values())
        steps = [s["step"] for s in run.optimizer.state.values()]
        step_bytes = sum(t.untyped_storage().nbytes() for t in steps if t.dim() == 0)
    return ours, theirs, step_bytes


@pytest.mark.slow
def test_fake_world_peak_is_torch_mem_tracker_s_on_an_fsdp2_step() -> None:
    """On an FSDP2 (fully_shard) training step of 2 ranks under fake tensors, the fake world's
    peak equals torch's MemTracker's to the byte, AdamW's 0-dim ``step`` tensors included (4 B
    each on CPU, one per parameter: the tracker once left them out). The expected number is
    torch's tracker's, independent of this code."""
    from tspbench.dist.fake_world import run_fake_ranks

    layout, workload = Layout("fsdp", fsdp=2), Workload(ModelConfig.preset("tiny"), 1, 256, dtype="float32")
    ranks = run_fake_ranks(_fake_world_and_mem_tracker, range(2), 2, layout, workload)
    for ours, theirs, step_bytes in ranks:
        assert step_bytes > 0  # what used to be missed is there to count
        assert ours == theirs, (ours, theirs, step_bytes)


def test_capacity_raises_torch_out_of_memory_exactly_above_it() -> None:
    t = MemoryTracker(capacity_bytes=8000)
    with t:
        a = torch.empty(1000)
        b = torch.empty(1000)  # exactly at capacity: fine
        assert t.live == 8000
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(1, dtype=torch.uint8)
    assert isinstance(info.value, torch.OutOfMemoryError)
    assert "capacity" in str(info.value)
    del a, b


def test_capacity_at_the_measured_peak_passes_one_byte_less_fails() -> None:
    _mlp_step(MemoryTracker(capacity_bytes=3400))  # does not raise
    with pytest.raises(torch.OutOfMemoryError):
        _mlp_step(MemoryTracker(capacity_bytes=3399))


def test_tracker_overhead_on_a_tiny_training_step() -> None:
    """Prints the tracker's cost; asserts only that it does not change the numbers.

    One thread, as on a launched rank: two threads on this 2-core machine make the timing swing
    by 10x whenever anything else runs.
    """
    workload = Workload(ModelConfig.preset("tiny"), seq_len=128, dtype="float32")
    plain, measured = Reference(workload, n_seqs=2), Reference(workload, n_seqs=2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plain.train_step(), measured.train_step()  # warm-up (optimizer state appears)
        times_plain, times_tracked = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            loss_plain = plain.train_step()
            times_plain.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            with (
                tracked(measured.model, measured.optimizer) as tracker,
                tracker.track_autograd(measured.model),
            ):
                loss_tracked = measured.train_step()
            times_tracked.append(time.perf_counter() - t0)
            assert torch.equal(loss_plain, loss_tracked)
            assert tracker.peak > tracker.totals["parameters"] + tracker.totals["optimizer"]
    finally:
        torch.set_num_threads(threads)
    plain_ms, tracked_ms = statistics.median(times_plain) * 1e3, statistics.median(times_tracked) * 1e3
    print(
        f"\nMemoryTracker overhead, tiny step (seq 128, 2 seqs, 1 thread): {tracked_ms / plain_ms:.2f}x "
        f"(median {plain_ms:.1f} ms -> {tracked_ms:.1f} ms)"
    )


def test_a_storage_reallocated_in_place_is_counted_at_its_new_size() -> None:
    with MemoryTracker() as t:
        x = torch.empty(10)  #                                   40 B
        x.resize_(1000)  # the same storage, reallocated:       4000 B (not 4040)
        assert t.live == 4000
        out = torch.empty(0)
        torch.mm(torch.ones(4, 4), torch.ones(4, 4), out=out)  # out= grows it to 64 B
        assert t.live == 4064
        x.resize_(10)  # shrinking keeps the allocation
        del x
        assert t.live == 64
        del out
    assert t.live == 0
    assert t.peak == 4000 + 64 + 64 + 64  # x, out and the two ones() while mm ran


def test_storages_made_in_another_thread_are_not_seen() -> None:
    """A documented limit (the dispatch mode is per thread); tspbench's steps allocate in one."""
    import threading

    held = []
    with MemoryTracker() as t:
        worker = threading.Thread(target=lambda: held.append(torch.empty(1000)))
        worker.start()
        worker.join()
        assert t.live == 0 and held[0].numel() == 1000


def test_bench_records_the_spread_of_per_step_peaks() -> None:
    """Per tracked step the max over ranks; the record's peak is the median step's (its breakdown
    too), with min, max and every step's peak beside it."""
    from tspbench.measure.bench import measurement_record
    from tspbench.measure.memory_report import MemoryReport

    def rank(r: int, peaks: list[int]) -> dict:
        memory = [MemoryReport(p, {"other": p}, phase=f"step{i}") for i, p in enumerate(peaks)]
        state = {"parameters": 1, "gradients": 1, "optimizer": 2}
        return {"rank": r, "times": [1.0], "loss": 0.5, "comm": [], "memory": memory, "state": state,
                "flops": 1, "first_tracked_step": 3}  # fmt: skip

    ranks = [rank(0, [100, 130, 110]), rank(1, [120, 90, 105])]  # per step, max over ranks: 120 130 110
    workload = Workload(ModelConfig.preset("tiny"), seq_len=128)
    record = measurement_record(Layout("dp", dp=2), workload, ranks)
    assert record["peak_memory_step_bytes"] == [120, 130, 110]
    assert (
        record["peak_memory_min_bytes"],
        record["peak_memory_bytes"],
        record["peak_memory_max_bytes"],
    ) == (
        110,
        120,
        130,
    )
    assert record["peak_memory_phase"] == "step0" and record["peak_memory_other_bytes"] == 120
    assert record["peak_memory_bytes_per_rank"] == [100, 120] and record["peak_memory_rank"] == 1
    assert record["peak_memory_first_tracked_step"] == 3
