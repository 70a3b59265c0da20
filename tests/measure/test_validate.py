"""The checks themselves: wrong strategies must fail them.

- ``validate`` compares every rank's copy, so a strategy whose replicas disagree fails
  (``fault_replica``: ranks other than 0 hold wrong norm gradients);
- the counted collectives are compared by group and channel, so weights moved on the wrong
  channel fail the comparison even though the math is right (``fault_channel``), and what the
  dispatcher saw is held against the analytic count, so an FSDP2 block left unsharded fails
  though FSDP2 counts nothing itself (``fault_fsdp``);
- the gradient synchronisation each strategy performs (torch's DDP and FSDP2 included) is
  checked against one derived here by hand, not read from its Placement, so a strategy that
  sums over the wrong axes (and says so in its Placement, which keeps counted = analytic) is
  caught (``fault_reduce``);
- TSP's overlap is a fact of its issue order: each weight transfer is started before the
  compute on the shard in hand and waited after it (a blocking schedule fails this).

The faulty strategies come from ``fault_plugin`` (an installed plugin, seen by the ranks).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import fault_plugin
import pytest
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.dist import comm
from tspbench.dist.c10d_count import C10dCounter
from tspbench.dist.comm import CommLog
from tspbench.dist.launch import launch
from tspbench.measure.runner import RankRun
from tspbench.model.transformer import Transformer

pytestmark = pytest.mark.slow  # multi-rank runs, sweeps or Slurm: make test, not make check

TINY = ModelConfig.preset("tiny")
SHORT = Workload(TINY, batch=1, seq_len=128, dtype="float32")
TINY_SHAPES = {n: tuple(p.shape) for n, p in Transformer(TINY, seed=0).named_parameters()}


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("plugin")
    return folder, fault_plugin.install(folder)


def _validate(env: dict, *flags: str) -> tuple[int, dict]:
    cmd = [sys.executable, "-m", "tspbench", "validate", *flags, "--seq-len", "128", "--mode", "train"]
    done = subprocess.run([*cmd, "--json"], env=env, capture_output=True, text=True, timeout=180)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_a_wrong_replica_fails_validate(plugin: tuple[Path, dict]) -> None:
    code, result = _validate(plugin[1], "--strategy", "fault_replica", "--tsp", "2")
    assert code == 1 and not result["passed"]
    assert result["max_rel_err"]["grads"] > result["tolerance"]
    assert "norm" in result["worst_grad_param"] and "on rank 1" in result["worst_grad_param"]
    assert result["comm_matches_analytic"]  # only the replicas are wrong
    assert result["ranks_compared"] == 2


def test_the_wrong_channel_fails_the_comm_comparison(plugin: tuple[Path, dict]) -> None:
    code, result = _validate(plugin[1], "--strategy", "fault_channel", "--tsp", "2")
    assert code == 1 and not result["comm_matches_analytic"]
    assert all(err <= result["tolerance"] for err in result["max_rel_err"].values())  # same math
    counted = {(e["op"], e["group"]) for e in result["comm_counted"]["train"]}
    analytic = {(e["op"], e["group"]) for e in result["comm_analytic"]["train"]}
    assert ("broadcast", "tsp") in counted and ("broadcast", "tsp#1") in analytic


def test_an_unsharded_fsdp_block_fails_validate(plugin: tuple[Path, dict]) -> None:
    """FSDP2 issues its own collectives, seen only at dispatch level: validate holds them against
    the analytic count (a comparison of the dispatched records with themselves passed this)."""
    code, result = _validate(plugin[1], "--strategy", "fault_fsdp", "--fsdp", "2")
    assert code == 1 and not result["passed"]
    assert not result["comm_matches_dispatch"] and not result["comm_matches_analytic"]
    assert all(err <= result["tolerance"] for err in result["max_rel_err"].values())  # same math
    gathers = [e for e in result["comm_counted"]["train"] if e["op"] == "all_gather"]
    expected = [e for e in result["comm_analytic"]["train"] if e["op"] == "all_gather"]
    assert sum(e["calls"] for e in gathers) < sum(e["calls"] for e in expected)  # one unit fewer


def test_a_wrong_reduce_fails_validate(plugin: tuple[Path, dict]) -> None:
    code, result = _validate(plugin[1], "--strategy", "fault_reduce", "--tp", "2", "--sp", "2")
    assert code == 1 and result["max_rel_err"]["grads"] > result["tolerance"]
    assert result["comm_matches_analytic"]  # its Placement agrees with what it does: counts cannot tell


# ----------------------------------------------------------------------------- gradient sync by hand


def summed_axes(strategy: str, megatron_sp: bool, name: str) -> tuple[str, ...]:
    """The mesh axes a parameter's gradient must be summed over: those over which the tokens it
    sees differ while the parameter itself does not. Derived by hand from each strategy's layout
    (the module docstrings in strategies/), never from its Placement."""
    norm = "norm" in name
    if strategy == "dp":  # the whole model on every rank, the batch split over dp
        return ("dp",)
    if strategy == "tp":  # weights split over tp, all tokens on every tp rank, except that under
        # Megatron-SP the norms see a sequence shard of the residual stream
        return ("dp", "tp") if norm and megatron_sp else ("dp",)
    if strategy == "sp":  # the whole model, tokens split over sp
        return ("dp", "sp")
    if strategy in ("tp_sp", "fault_reduce"):  # TP's weights, tokens split over sp
        return ("dp", "sp", "tp") if norm and megatron_sp else ("dp", "sp")
    if strategy == "tsp":  # weights and tokens split over tsp; a shard's partial gradients are
        # summed into its owner by the schedule itself; only the replicated norms see other tokens
        return ("dp", "tsp") if norm else ("dp",)
    raise AssertionError(f"no hand derivation for {strategy}")


def _gradient_sync(layout: Layout, workload: Workload, plugin_dir: str) -> dict:
    """The all-reduces and reduce-scatters that sum gradients: tspbench's own in the optimizer
    phase, DDP's buckets (through tspbench's comm hook) in backward, and whatever FSDP2 issues
    itself (seen only at dispatch level: ``wrapped``)."""
    sys.path.insert(0, plugin_dir)  # before the registry loads: the faulty plugins too
    run = RankRun(layout, workload)
    wrapped = CommLog()
    with comm.counting() as own, C10dCounter(wrapped, run.mesh.labels()):
        run.train_step()
    ddp = layout.strategy == "dp"
    syncing = [r for r in own.records if r.phase == "optimizer" or (ddp and r.phase == "backward")]
    syncing += [r for r in wrapped.records if r.op != "all_gather"]  # FSDP2's weight gathers aside
    synced: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in syncing:
        assert r.op in ("all_reduce", "reduce_scatter"), r
        synced[f"{r.op} {r.group}"][0] += r.count
        synced[f"{r.op} {r.group}"][1] += r.count * r.msg_bytes
    return {
        "synced": dict(synced),
        "params": {n: p.numel() * p.element_size() for n, p in run.model.named_parameters()},
        "declared": {n: run.strategy.placements[n].reduce for n, _ in run.model.named_parameters()},
        "names": run.mesh.names,
        "dims": run.mesh.dims,
    }


def _expected(layout: Layout, workload: Workload, rank: dict) -> dict[str, list[int]]:
    """One all-reduce per parameter over its hand-derived axes, where that group has > 1 rank."""
    if layout.strategy in ("fsdp", "fsdp_sp"):
        return _expected_fsdp(layout, rank)
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name, nbytes in rank["params"].items():
        axes = summed_axes(layout.strategy, workload.megatron_sp, name)
        if math.prod(rank["dims"][a] for a in axes) > 1:
            label = "all_reduce " + "+".join(a for a in rank["names"] if a in axes)
            out[label][0] += 1
            out[label][1] += nbytes
    return dict(out)


def _expected_fsdp(layout: Layout, rank: dict) -> dict[str, list[int]]:
    """FSDP2 (fully_shard on each block, then the root): every gradient is summed over the ranks
    whose tokens differ - the shard axis (its own micro-batch under fsdp, its zigzag tokens under
    fsdp_sp) and dp - by one reduce-scatter per unit over the shard axis of the unit's whole
    padded gradient (each parameter's rows rounded up to a multiple of D, float32 here), then
    with dp (HSDP) one all-reduce per unit of its shard. Units and sizes from the reference
    model's parameter shapes, never from the strategy."""
    shard = "fsdp" if layout.strategy == "fsdp" else "sp"
    d, dp = layout.degree(shard), layout.dp
    units: dict[str, int] = defaultdict(int)
    for name, shape in TINY_SHAPES.items():
        unit = ".".join(name.split(".")[:2]) if name.startswith("layers.") else "root"
        units[unit] += math.ceil(shape[0] / d) * d * math.prod(shape[1:]) * 4
    out = {f"reduce_scatter {shard}": [len(units), sum(units.values())]}
    if dp > 1:
        out["all_reduce dp"] = [len(units), sum(units.values()) // d]
    return out


SYNC_CASES = [
    (Layout("dp", dp=2), False),
    (Layout("tp", dp=2, tp=2), False),
    (Layout("tp", dp=2, tp=2), True),
    (Layout("sp", dp=2, sp=2), False),
    (Layout("tp_sp", tp=2, sp=2), False),
    (Layout("tp_sp", tp=2, sp=2), True),
    (Layout("tsp", dp=2, tsp=2), False),
    (Layout("fsdp", fsdp=2), False),
    (Layout("fsdp", dp=2, fsdp=2), False),
    (Layout("fsdp_sp", sp=2), False),
    (Layout("fsdp_sp", dp=2, sp=2), False),
]


@pytest.mark.parametrize(
    "layout, megatron_sp", SYNC_CASES, ids=[f"{c[0].describe()}{'-msp' * c[1]}" for c in SYNC_CASES]
)
def test_gradient_sync_is_the_hand_derived_one(
    layout: Layout, megatron_sp: bool, plugin: tuple[Path, dict]
) -> None:
    workload = SHORT.with_(megatron_sp=megatron_sp)
    for rank in launch(_gradient_sync, layout.world_size, layout, workload, str(plugin[0])):
        expected = _expected(layout, workload, rank)
        if layout.strategy == "dp":  # DDP: every gradient summed once, in buckets (not one call each)
            assert {g: b for g, (_, b) in rank["synced"].items()} == {g: b for g, (_, b) in expected.items()}
            continue  # its placements declare no reduce: DDP does it
        if layout.strategy.startswith("fsdp"):  # FSDP2 reduces what it shards; placements declare none
            assert rank["synced"] == expected
            continue
        assert rank["synced"] == expected
        for name, declared in rank["declared"].items():  # the declarations say the same
            assert set(declared) == set(summed_axes(layout.strategy, megatron_sp, name)), name


def test_a_sum_over_the_wrong_axis_of_the_same_size_is_caught(plugin: tuple[Path, dict]) -> None:
    layout = Layout("fault_reduce", tp=2, sp=2)
    for rank in launch(_gradient_sync, 4, layout, SHORT, str(plugin[0])):
        expected = _expected(layout, SHORT, rank)
        assert rank["synced"] != expected
        synced, want = rank["synced"], expected
        assert synced["all_reduce dp+tp"][0] == want["all_reduce dp+sp"][0] - synced["all_reduce dp+sp"][0]


# ----------------------------------------------------------------------------- TSP overlap

COMPUTE_OPS = ("mm", "addmm", "bmm", "embedding", "index", "index_add", "index_put", "_scaled_dot_product")


class _ComputeCount(TorchDispatchMode):
    """Counts compute ops (GEMMs, attention, the embedding's gathers) issued in this thread."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__.rstrip("_")
        self.count += name in COMPUTE_OPS or name.startswith("_scaled_dot_product")
        return func(*args, **(kwargs or {}))


class _TracedWork:
    def __init__(self, work: dist.Work, transfer: dict, counter: _ComputeCount) -> None:
        self.work, self.transfer, self.counter = work, transfer, counter

    def wait(self) -> bool:
        if "waited" not in self.transfer:
            self.transfer["waited"] = self.counter.count
        return self.work.wait()


def _weight_transfers(layout: Layout, workload: Workload) -> list[dict]:
    """Every weight transfer of one training step (channel 1 of the tsp group), in issue order: its
    op, whether it is an attention pass's first broadcast (W_0, from tsp rank 0), and how many
    compute ops ran between its issue and its wait."""
    run = RankRun(layout, workload)
    weights = run.mesh.group("tsp", channel=1)
    counter, transfers = _ComputeCount(), []
    real_broadcast, real_isend, real_irecv = dist.broadcast, dist.isend, dist.irecv

    def traced(op: str, works: list, first: bool = False) -> list:
        transfer = {"op": op, "first": first, "issued": counter.count}
        transfers.append(transfer)
        return [_TracedWork(w, transfer, counter) for w in works]

    def broadcast(tensor, src, group=None, async_op=False):
        work = real_broadcast(tensor, src, group, async_op=async_op)
        if group is not weights.pg:
            return work
        return traced("broadcast", [work], first=src == weights.global_rank(0))[0]

    def point_to_point(real):  # a ring shift is an isend and an irecv, each its own transfer
        def issue(tensor, peer, group=None, tag=0):
            work = real(tensor, peer, group, tag)
            return traced("send_recv", [work])[0] if group is weights.pg else work

        return issue

    patched = broadcast, point_to_point(real_isend), point_to_point(real_irecv)
    dist.broadcast, dist.isend, dist.irecv = patched
    try:
        with counter:
            run.train_step()
    finally:
        dist.broadcast, dist.isend, dist.irecv = real_broadcast, real_isend, real_irecv
    return [{**t, "between": t["waited"] - t["issued"]} for t in transfers]


def test_tsp_starts_each_weight_transfer_before_the_compute_it_hides_behind() -> None:
    layout = Layout("tsp", tsp=2)
    for overlap in (True, False):
        for transfers in launch(_weight_transfers, 2, layout, SHORT.with_(overlap=overlap)):
            firsts = [t for t in transfers if t["first"]]
            rest = [t for t in transfers if not t["first"]]
            assert len(firsts) == 2 * TINY.n_layers  # forward and backward of every attention layer
            assert {t["op"] for t in rest} == {"broadcast", "send_recv"}
            if overlap:  # issued before the compute on the shard in hand, waited after it
                assert all(t["between"] > 0 for t in rest), [t for t in rest if t["between"] == 0]
                # a pass's W_0 is issued by the pass before it and hides under the MLP between them;
                # only the step's first pass has no pass before it
                assert firsts[0]["between"] == 0
                assert all(t["between"] > 0 for t in firsts[1:]), [t for t in firsts if t["between"] == 0]
            else:  # blocking: each transfer waited at once, so this check fails for such a schedule
                assert all(t["between"] == 0 for t in transfers)
