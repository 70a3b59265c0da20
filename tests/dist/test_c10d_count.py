"""The dispatch-level counter (tspbench.dist.c10d_count) against collectives issued directly.

torch.distributed calls made by hand (as DDP and FSDP2 make them) must become the records
nccl-tests' convention gives, written out here; tspbench's own primitives must be seen by the
dispatcher exactly as they count themselves, and must not be counted twice in a step's log.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from tspbench.strategies.dp import ddp_buckets

from tspbench.dist import comm
from tspbench.dist.c10d_count import C10dCounter
from tspbench.dist.comm import CommRecord, summarize
from tspbench.dist.launch import launch
from tspbench.dist.mesh import Mesh

pytestmark = pytest.mark.slow  # multi-rank runs, sweeps or Slurm: make test, not make check

ROWS, COLS = 6, 5  # float64: 240 bytes per rank's buffer


def _direct(n: int) -> dict:
    """Every kind of collective issued straight through torch.distributed, counted at dispatch."""
    r = dist.get_rank()
    mesh = Mesh({"world": n}, r)
    pg = mesh.group("world").pg  # a group of tspbench's mesh: records carry its label
    x = torch.ones(ROWS, COLS, dtype=torch.float64)
    with comm.counting() as log, C10dCounter(log, mesh.labels()) as counter:
        dist.all_reduce(x, group=pg)
        dist.all_gather_into_tensor(torch.empty(n * ROWS, COLS, dtype=torch.float64), x, group=pg)
        dist.all_gather([torch.empty_like(x) for _ in range(n)], x, group=pg)
        dist.reduce_scatter_tensor(
            torch.empty(ROWS, COLS, dtype=torch.float64), torch.ones(n * ROWS, COLS).double(), group=pg
        )
        dist.broadcast(x, 0, group=pg)
        dist.reduce(x, 0, group=pg)
        dist.all_to_all_single(
            torch.empty(n * ROWS, COLS).double(), torch.ones(n * ROWS, COLS).double(), group=pg
        )
        with comm.phase("backward"):
            ops = [
                dist.P2POp(dist.isend, x, (r + 1) % n, pg),
                dist.P2POp(dist.irecv, torch.empty_like(x), (r - 1) % n, pg),
            ]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        dist.barrier()
    try:
        with C10dCounter():
            dist.gather(x, [torch.empty_like(x) for _ in range(n)] if r == 0 else None, dst=0)
        raised = ""
    except RuntimeError as exc:
        raised = str(exc)
    dist.barrier()
    return {"log": log.records, "seen": counter.records, "raised": raised, "world": mesh.group("world").name}


def _wrapped(n: int) -> dict:
    """tspbench's own primitives under the counter: seen at dispatch, counted once."""
    r = dist.get_rank()
    mesh = Mesh({"world": n}, r)
    group = mesh.group("world")
    x = torch.ones(ROWS, COLS, dtype=torch.float64)
    with comm.counting() as log, C10dCounter(log, mesh.labels()) as counter:
        comm.all_reduce(x, group)
        comm.all_gather(x, group)
        comm.reduce_scatter(torch.ones(n, ROWS, COLS).double(), group)
        comm.broadcast(x, 0, group)
        comm.reduce(x, 0, group)
        comm.all_to_all(torch.ones(n, ROWS, COLS).double(), group)
        comm.ring_shift(x, group)
        comm.all_reduce(x, group, async_op=True).future().wait()
    return {"log": log.records, "seen": counter.records}


@pytest.mark.parametrize("n", [2, 4])
def test_direct_collectives_are_counted_in_nccl_tests_convention(n: int) -> None:
    buf = ROWS * COLS * 8
    expected = [
        ("all_reduce", "forward", buf),
        ("all_gather", "forward", n * buf),  # the gathered output
        ("all_gather", "forward", n * buf),  # list form: the outputs
        ("reduce_scatter", "forward", n * buf),  # the full input
        ("broadcast", "forward", buf),
        ("reduce", "forward", buf),
        ("all_to_all", "forward", n * buf),
        ("send_recv", "backward", buf),  # the send; its recv is the other half
    ]
    for rank, out in enumerate(launch(_direct, n, n, timeout=120)):
        assert [(c.op, c.phase, c.msg_bytes) for c in out["seen"]] == expected, f"rank {rank}"
        assert all(c.group_size == n and c.group == out["world"] for c in out["seen"]), out["seen"]
        assert out["log"] == out["seen"]  # issued outside tspbench.dist.comm: all go to the log
        assert "c10d::gather_ is not counted" in out["raised"]


@pytest.mark.parametrize("n", [2, 4])
def test_wrapped_collectives_are_seen_as_counted_and_counted_once(n: int) -> None:
    for rank, out in enumerate(launch(_wrapped, n, n, timeout=120)):
        assert len(out["log"]) == 8, f"rank {rank}: {out['log']}"  # each once, by the wrapper
        assert summarize(out["seen"]) == summarize(out["log"]), f"rank {rank}"
        assert out["seen"][-1] == CommRecord("all_reduce", "forward", n, ROWS * COLS * 8, group="world")


def test_ddp_bucket_model_agrees_with_torch() -> None:
    """The analytic DDP buckets against torch's own assignment (reducer.cpp) of the same sizes."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        numels = torch.randint(1, 400_000, (int(torch.randint(1, 60, (1,), generator=gen)),), generator=gen)
        tensors = [torch.empty(int(k), dtype=torch.float32) for k in numels]
        limits = [2**20, 25 * 2**20]
        indices, _ = dist._compute_bucket_assignment_by_size(tensors, limits, [False] * len(tensors))
        torch_buckets = [sum(tensors[i].numel() * 4 for i in bucket) for bucket in indices]
        ours = ddp_buckets([t.numel() * 4 for t in tensors], *limits)
        assert sorted(ours) == sorted(torch_buckets), trial
