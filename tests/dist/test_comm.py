"""Every collective in tspbench.comm against a single-process computation from all ranks' inputs.

One world per size (2 and 4) runs everything once and returns its outputs and CommRecords; the
tests below check them. Each rank draws its inputs from (rank, seed), so this process recomputes
every rank's input and the expected result on its own. Float64 throughout.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

from tspbench.dist import comm
from tspbench.dist.comm import CommRecord, summarize
from tspbench.dist.launch import launch
from tspbench.dist.mesh import Mesh

pytestmark = pytest.mark.slow  # multi-rank runs, sweeps or Slurm: make test, not make check

SIZES = (2, 4)
SHAPE = (3, 4)  # a plain buffer: 96 bytes in float64
ROWS = 3  # rows per rank along dim 1 for the "along a dim" forms: [2, ROWS, 5] per rank


def _x(rank: int, seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Rank ``rank``'s input number ``seed``: the same tensor in the rank and in the test."""
    return torch.randn(
        shape, generator=torch.Generator().manual_seed(1000 * seed + rank), dtype=torch.float64
    )


def _nbytes(*shape: int) -> int:
    return 8 * torch.Size(shape).numel()


# ----------------------------------------------------------------------------- on the ranks


def _primitives(group: comm.Group, n: int, r: int) -> dict[str, Callable[[bool], object]]:
    """Each op, on fresh inputs: async_op -> (result, input after the call)."""

    def case(primitive: Callable, make: Callable[[], torch.Tensor], **kw: object) -> Callable[[bool], object]:
        def run(async_op: bool) -> object:
            x = make()
            out = primitive(x, group=group, async_op=async_op, **kw)
            return (out.wait() if async_op else out), x

        return run

    return {
        "all_reduce": case(comm.all_reduce, lambda: _x(r, 1, SHAPE)),
        "all_reduce_max": case(comm.all_reduce, lambda: _x(r, 1, SHAPE), op="max"),
        "all_reduce_avg": case(comm.all_reduce, lambda: _x(r, 1, SHAPE), op="avg"),
        "all_gather": case(comm.all_gather, lambda: _x(r, 2, SHAPE)),
        "all_gather_dim1": case(comm.all_gather, lambda: _x(r, 3, (2, ROWS, 5)), dim=1),
        "reduce_scatter": case(comm.reduce_scatter, lambda: _x(r, 4, (n, *SHAPE))),
        "reduce_scatter_dim1": case(comm.reduce_scatter, lambda: _x(r, 5, (2, n * ROWS, 5)), dim=1),
        "broadcast": case(comm.broadcast, lambda: _x(r, 6, SHAPE), src=1),
        "reduce": case(comm.reduce, lambda: _x(r, 7, SHAPE), dst=1),
        "all_to_all": case(comm.all_to_all, lambda: _x(r, 8, (n, *SHAPE))),
        "ring_shift": case(comm.ring_shift, lambda: _x(r, 9, SHAPE)),
    }


def _autograd_pairs(group: comm.Group, n: int, r: int) -> dict[str, tuple]:
    """Forward output, x.grad and the forward/backward CommRecords of each autograd pair.

    Each rank's loss is (w_r * y).sum() with its own upstream weight w_r (seed 20 + k).
    """
    cases = {
        "copy_to_group": (lambda x: comm.copy_to_group(x, group), _x(0, 10, SHAPE), SHAPE),
        "reduce_from_group": (lambda x: comm.reduce_from_group(x, group), _x(r, 11, SHAPE), SHAPE),
        "gather_from_group": (lambda x: comm.gather_from_group(x, group), _x(r, 12, SHAPE), (n, *SHAPE)),
        "gather_from_group_dim1": (
            lambda x: comm.gather_from_group(x, group, dim=1),
            _x(r, 13, (2, ROWS, 5)),
            (2, n * ROWS, 5),
        ),
        "reduce_scatter_to_group": (
            lambda x: comm.reduce_scatter_to_group(x, group),
            _x(r, 14, (n, *SHAPE)),
            SHAPE,
        ),
        "reduce_scatter_to_group_dim1": (
            lambda x: comm.reduce_scatter_to_group(x, group, dim=1),
            _x(r, 15, (2, n * ROWS, 5)),
            (2, ROWS, 5),
        ),
    }
    out = {}
    for k, (name, (fn, x, y_shape)) in enumerate(cases.items()):
        x = x.requires_grad_()
        with comm.counting() as fwd:
            y = fn(x)
        with comm.counting() as bwd, comm.phase("backward"):
            (y * _x(r, 20 + k, y_shape)).sum().backward()
        out[name] = (y.detach(), x.grad, fwd.records, bwd.records)
    return out


def _phases(group: comm.Group) -> list[str]:
    with comm.counting() as log:
        comm.all_reduce(torch.zeros(2), group)
        with comm.phase("backward"):
            comm.all_reduce(torch.zeros(2), group)
            with comm.phase("optimizer"):
                comm.broadcast(torch.zeros(2), 0, group)
            comm.all_reduce(torch.zeros(2), group)
        comm.all_reduce(torch.zeros(2), group)
    return [rec.phase for rec in log.records]


def _mesh_2x2() -> dict[str, object]:
    """On a {"dp": 2, "tp": 2} mesh: group members, and ops whose member index != global rank."""
    r = dist.get_rank()
    mesh = Mesh({"dp": 2, "tp": 2}, r)
    dp, tp = mesh.group("dp"), mesh.group("tp")
    return {
        "coords": (mesh.index("dp"), mesh.index("tp")),
        "groups": {axes: (mesh.group(*axes).ranks, mesh.group(*axes).rank) for axes in [("dp",), ("tp",)]},
        "both": mesh.group("tp", "dp").ranks,
        "tp_sum": comm.all_reduce(torch.tensor([float(r)]), tp).item(),
        "dp_sum": comm.all_reduce(torch.tensor([float(r)]), dp).item(),
        "dp_broadcast_from_1": comm.broadcast(_x(r, 30, SHAPE), 1, dp),
        "dp_reduce_to_1": comm.reduce(_x(r, 31, SHAPE), 1, dp),
        "dp_ring_shift": comm.ring_shift(_x(r, 32, SHAPE), dp),
        "tp_all_gather": comm.all_gather(_x(r, 33, SHAPE), tp),
    }


def _run_all(n: int) -> dict[str, object]:
    r = dist.get_rank()
    group = Mesh({"world": n}, r).group("world")
    out: dict[str, object] = {"primitives": {}, "staged": {}}
    for name, run in _primitives(group, n, r).items():
        for async_op in (False, True):
            with comm.counting() as log:
                result, x_after = run(async_op)
            out["primitives"][name, async_op] = (result, x_after, log.records)
            with comm.staging():  # on copies gloo never sees the program's tensors
                result, x_after = run(async_op)
            out["staged"][name, async_op] = (result, x_after, x_after._version)
    with comm.staging():  # DDP's comm hook takes the result as a Future
        x = _x(r, 1, SHAPE)
        out["staged_future"] = (comm.all_reduce(x, group, async_op=True).future().wait(), x)
    out["late_frees"] = _frees_on_other_threads(group)
    out["autograd"] = _autograd_pairs(group, n, r)
    out["phases"] = _phases(group)
    if n == 4:
        out["mesh"] = _mesh_2x2()
    dist.barrier()
    return out


def _frees_on_other_threads(group: comm.Group, calls: int = 400) -> dict[str, int]:
    """How often a tensor the program gave a collective, and then dropped, died on another thread
    (gloo's worker, releasing the finished work after the caller's wait returned), under staging."""
    main, late = threading.get_ident(), {"all_reduce": 0, "all_gather": 0, "ring_shift": 0}

    def died(op: str) -> None:
        late[op] += threading.get_ident() != main

    with comm.staging():
        for _ in range(calls):
            for op in late:
                x = torch.randn(64, 256)
                weakref.finalize(x.untyped_storage(), died, op)
                if op == "ring_shift":
                    y = comm.ring_shift(x, group, async_op=True).wait()
                else:
                    y = getattr(comm, op)(x, group)
                del x, y
                torch.empty(16)  # the program moves on at once
    return late


# ----------------------------------------------------------------------------- in the test


@pytest.fixture(scope="module")
def worlds() -> Callable[[int], list[dict]]:
    cache: dict[int, list[dict]] = {}

    def get(n: int) -> list[dict]:
        if n not in cache:
            cache[n] = launch(_run_all, n, n, timeout=120)
        return cache[n]

    return get


def _all(seed: int, shape: tuple[int, ...], n: int) -> list[torch.Tensor]:
    return [_x(r, seed, shape) for r in range(n)]


def _expected(name: str, n: int, r: int) -> torch.Tensor | None:
    """What rank r should hold after op ``name``, from every rank's input (None: undefined)."""
    if name == "all_reduce":
        return sum(_all(1, SHAPE, n))
    if name == "all_reduce_max":
        return torch.stack(_all(1, SHAPE, n)).amax(0)
    if name == "all_reduce_avg":
        return torch.stack(_all(1, SHAPE, n)).mean(0)
    if name == "all_gather":
        return torch.stack(_all(2, SHAPE, n))
    if name == "all_gather_dim1":
        return torch.cat(_all(3, (2, ROWS, 5), n), dim=1)
    if name == "reduce_scatter":
        return sum(x[r] for x in _all(4, (n, *SHAPE), n))
    if name == "reduce_scatter_dim1":
        return sum(x.chunk(n, dim=1)[r] for x in _all(5, (2, n * ROWS, 5), n))
    if name == "broadcast":
        return _x(1, 6, SHAPE)
    if name == "reduce":
        return sum(_all(7, SHAPE, n)) if r == 1 else None
    if name == "all_to_all":
        return torch.stack([x[r] for x in _all(8, (n, *SHAPE), n)])
    if name == "ring_shift":
        return _x((r - 1) % n, 9, SHAPE)
    raise KeyError(name)


# op, message bytes as nccl-tests counts them, bus factor: written out here, not read from comm.
def _expected_record(name: str, n: int) -> tuple[str, int, float]:
    ring = (n - 1) / n
    return {
        "all_reduce": ("all_reduce", _nbytes(*SHAPE), 2 * ring),
        "all_reduce_max": ("all_reduce", _nbytes(*SHAPE), 2 * ring),
        "all_reduce_avg": ("all_reduce", _nbytes(*SHAPE), 2 * ring),
        "all_gather": ("all_gather", _nbytes(n, *SHAPE), ring),  # the output
        "all_gather_dim1": ("all_gather", _nbytes(2, n * ROWS, 5), ring),  # the output
        "reduce_scatter": ("reduce_scatter", _nbytes(n, *SHAPE), ring),  # the input
        "reduce_scatter_dim1": ("reduce_scatter", _nbytes(2, n * ROWS, 5), ring),  # the input
        "broadcast": ("broadcast", _nbytes(*SHAPE), 1.0),
        "reduce": ("reduce", _nbytes(*SHAPE), 1.0),
        "all_to_all": ("all_to_all", _nbytes(n, *SHAPE), ring),
        "ring_shift": ("send_recv", _nbytes(*SHAPE), 1.0),
    }[name]


PRIMITIVES = [
    "all_reduce",
    "all_reduce_max",
    "all_reduce_avg",
    "all_gather",
    "all_gather_dim1",
    "reduce_scatter",
    "reduce_scatter_dim1",
    "broadcast",
    "reduce",
    "all_to_all",
    "ring_shift",
]
IN_PLACE = {"all_reduce", "all_reduce_max", "all_reduce_avg", "broadcast", "reduce"}


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("name", PRIMITIVES)
@pytest.mark.parametrize("n", SIZES)
def test_primitive_result(worlds, n: int, name: str, async_op: bool) -> None:
    for r, out in enumerate(worlds(n)):
        result, x_after, _ = out["primitives"][name, async_op]
        expected = _expected(name, n, r)
        if expected is None:
            continue
        torch.testing.assert_close(result, expected, rtol=1e-12, atol=1e-12, msg=f"rank {r}")
        if name in IN_PLACE:  # documented as in place: the caller's tensor holds the result
            torch.testing.assert_close(x_after, expected, rtol=1e-12, atol=1e-12, msg=f"rank {r}")


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("name", PRIMITIVES)
@pytest.mark.parametrize("n", SIZES)
def test_staged_primitive_gives_the_same_result_and_keeps_the_autograd_version(
    worlds, n: int, name: str, async_op: bool
) -> None:
    """Under ``comm.staging`` (what the memory tracker turns on) the collective runs on copies:
    the same result, in place where the op is, and the caller's tensor keeps its autograd
    version (gloo's own in-place writes leave it at 0, so saved tensors stay valid)."""
    for r, out in enumerate(worlds(n)):
        result, x_after, version = out["staged"][name, async_op]
        expected = _expected(name, n, r)
        assert version == 0, f"rank {r}: version {version}"
        if expected is None:
            continue
        torch.testing.assert_close(result, expected, rtol=1e-12, atol=1e-12, msg=f"rank {r}")
        if name in IN_PLACE:
            torch.testing.assert_close(x_after, expected, rtol=1e-12, atol=1e-12, msg=f"rank {r}")


@pytest.mark.parametrize("n", SIZES)
def test_staged_future_gives_the_result_in_place(worlds, n: int) -> None:
    for r, out in enumerate(worlds(n)):
        result, x_after = out["staged_future"]
        torch.testing.assert_close(result, _expected("all_reduce", n, r), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(x_after, _expected("all_reduce", n, r), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", SIZES)
def test_under_staging_no_program_tensor_dies_on_gloos_thread(worlds, n: int) -> None:
    """Without staging, about 1 in 200 of these tensors died on gloo's worker thread here (it
    releases a finished work a moment after the caller's wait returns), at a random point of
    the step: the same step's peak memory differed from run to run."""
    for r, out in enumerate(worlds(n)):
        assert out["late_frees"] == dict.fromkeys(out["late_frees"], 0), f"rank {r}"


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("name", PRIMITIVES)
@pytest.mark.parametrize("n", SIZES)
def test_primitive_is_counted(worlds, n: int, name: str, async_op: bool) -> None:
    op, msg_bytes, bus_factor = _expected_record(name, n)
    for r, out in enumerate(worlds(n)):
        records = out["primitives"][name, async_op][2]
        assert records == [CommRecord(op, "forward", n, msg_bytes, group="world")], f"rank {r}"
        assert records[0].bus_bytes == pytest.approx(bus_factor * msg_bytes)


# ----------------------------------------------------------------------------- autograd pairs


def _pair_expectations(name: str, n: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(forward output, x.grad) on rank r, computed as if all ranks were one process.

    The upstream weight of rank j is _x(j, 20 + k, y_shape); the total loss is the sum of every
    rank's loss, so x.grad is the true gradient of that sum (for reduce_from_group the output
    is replicated and each rank back-propagates its own replica: the identity).
    """
    k = list(PAIRS).index(name)
    if name == "copy_to_group":
        return _x(0, 10, SHAPE), sum(_all(20 + k, SHAPE, n))
    if name == "reduce_from_group":
        return sum(_all(11, SHAPE, n)), _x(r, 20 + k, SHAPE)
    if name == "gather_from_group":
        return torch.stack(_all(12, SHAPE, n)), sum(w[r] for w in _all(20 + k, (n, *SHAPE), n))
    if name == "gather_from_group_dim1":
        weights = _all(20 + k, (2, n * ROWS, 5), n)
        return torch.cat(_all(13, (2, ROWS, 5), n), dim=1), sum(w.chunk(n, dim=1)[r] for w in weights)
    if name == "reduce_scatter_to_group":
        return sum(x[r] for x in _all(14, (n, *SHAPE), n)), torch.stack(_all(20 + k, SHAPE, n))
    if name == "reduce_scatter_to_group_dim1":
        inputs = _all(15, (2, n * ROWS, 5), n)
        return sum(x.chunk(n, dim=1)[r] for x in inputs), torch.cat(_all(20 + k, (2, ROWS, 5), n), dim=1)
    raise KeyError(name)


# pair -> (forward op, backward op) and which buffer nccl-tests counts (here: message bytes).
# The gather and reduce-scatter pairs move the stacked [n, *SHAPE] buffer, or [2, n ROWS, 5] along dim 1.
FULL_BYTES = {"": lambda n: _nbytes(n, *SHAPE), "_dim1": lambda n: _nbytes(2, n * ROWS, 5)}
PAIRS = {
    "copy_to_group": (None, ("all_reduce", lambda n: _nbytes(*SHAPE))),
    "reduce_from_group": (("all_reduce", lambda n: _nbytes(*SHAPE)), None),
    **{f"gather_from_group{s}": (("all_gather", b), ("reduce_scatter", b)) for s, b in FULL_BYTES.items()},
    **{
        f"reduce_scatter_to_group{s}": (("reduce_scatter", b), ("all_gather", b))
        for s, b in FULL_BYTES.items()
    },
}


@pytest.mark.parametrize("name", list(PAIRS))
@pytest.mark.parametrize("n", SIZES)
def test_autograd_pair_forward_and_backward(worlds, n: int, name: str) -> None:
    for r, out in enumerate(worlds(n)):
        y, grad, _, _ = out["autograd"][name]
        y_expected, grad_expected = _pair_expectations(name, n, r)
        torch.testing.assert_close(y, y_expected, rtol=1e-12, atol=1e-12, msg=f"forward, rank {r}")
        torch.testing.assert_close(grad, grad_expected, rtol=1e-12, atol=1e-12, msg=f"backward, rank {r}")


@pytest.mark.parametrize("name", list(PAIRS))
@pytest.mark.parametrize("n", SIZES)
def test_autograd_pair_is_counted_in_its_phase(worlds, n: int, name: str) -> None:
    forward, backward = PAIRS[name]
    expected_fwd = [CommRecord(forward[0], "forward", n, forward[1](n), group="world")] if forward else []
    expected_bwd = [CommRecord(backward[0], "backward", n, backward[1](n), group="world")] if backward else []
    for r, out in enumerate(worlds(n)):
        _, _, fwd, bwd = out["autograd"][name]
        assert fwd == expected_fwd, f"rank {r}"
        assert bwd == expected_bwd, f"rank {r}"


# ----------------------------------------------------------------------------- phases, groups of one


@pytest.mark.parametrize("n", SIZES)
def test_phase_tags_records_and_restores(worlds, n: int) -> None:
    for out in worlds(n):
        assert out["phases"] == ["forward", "backward", "optimizer", "backward", "forward"]


def test_unknown_phase_is_rejected() -> None:
    with pytest.raises(ValueError, match="phase must be one of"), comm.phase("warmup"):
        pass


def test_group_of_one_is_identity_and_not_counted() -> None:
    """No process group exists here: a 1-rank group must not touch torch.distributed at all."""
    solo = Mesh({"tp": 1}, 0, create=False).group("tp")
    x = _x(0, 40, SHAPE)

    def run(primitive: Callable, *args: object, async_op: bool, **kw: object) -> torch.Tensor:
        out = primitive(*args, group=solo, async_op=async_op, **kw)
        return out.wait() if async_op else out

    with comm.counting() as log:
        for a in (False, True):
            assert torch.equal(run(comm.all_reduce, x.clone(), async_op=a), x)
            assert torch.equal(run(comm.all_gather, x, async_op=a), x[None])
            assert torch.equal(run(comm.all_gather, x, dim=1, async_op=a), x)
            assert torch.equal(run(comm.reduce_scatter, x[None], async_op=a), x)
            assert torch.equal(run(comm.reduce_scatter, x, dim=1, async_op=a), x)
            assert torch.equal(run(comm.broadcast, x.clone(), 0, async_op=a), x)
            assert torch.equal(run(comm.reduce, x.clone(), 0, async_op=a), x)
            assert torch.equal(run(comm.all_to_all, x[None], async_op=a), x[None])
            assert torch.equal(run(comm.ring_shift, x, async_op=a), x)
        xg = x.clone().requires_grad_()
        y = (
            comm.copy_to_group(xg, solo)
            + comm.reduce_from_group(xg, solo)
            + comm.gather_from_group(xg, solo)[0]
            + comm.reduce_scatter_to_group(xg[None], solo)
        )
        y.sum().backward()
        torch.testing.assert_close(xg.grad, torch.full(SHAPE, 4.0, dtype=torch.float64))
        comm.barrier(solo)
    assert log.records == []
    assert log.bus_bytes == 0


# ----------------------------------------------------------------------------- mesh groups


@pytest.mark.parametrize(
    "dims",
    [{"dp": 2, "tp": 2}, {"dp": 2, "tp": 4}, {"dp": 2, "sp": 2, "tp": 2}],
    ids=["dp2xtp2", "dp2xtp4", "dp2xsp2xtp2"],
)
def test_mesh_groups_place_the_last_axis_innermost(dims: dict[str, int]) -> None:
    """Row-major over the axes: the last axis holds consecutive ranks, the first is strided."""
    names = list(dims)
    world = 1
    for size in dims.values():
        world *= size
    inner, outer = names[-1], names[0]
    n_inner, n_outer = dims[inner], dims[outer]
    for rank in range(world):
        mesh = Mesh(dims, rank, create=False)
        base = rank - rank % n_inner
        assert mesh.group(inner).ranks == tuple(range(base, base + n_inner))
        assert mesh.group(inner).rank == rank % n_inner
        stride = world // n_outer
        assert mesh.group(outer).ranks == tuple(rank % stride + i * stride for i in range(n_outer))
        assert mesh.group(*names).ranks == tuple(range(world))
        assert mesh.size(*names) == world
        # Every group along an axis has that axis' size and contains this rank at its coordinate.
        for axis in names:
            g = mesh.group(axis)
            assert g.size == dims[axis]
            assert g.ranks[mesh.index(axis)] == rank


def test_mesh_rejects_unknown_axis() -> None:
    with pytest.raises(KeyError, match="unknown mesh axes"):
        Mesh({"dp": 2, "tp": 2}, 0, create=False).group("sp")


def test_mesh_groups_communicate_within_their_ranks(worlds) -> None:
    """dp2 x tp2 on 4 ranks: tp = {0,1},{2,3}; dp = {0,2},{1,3} (member 1 of a dp group is rank 2 or 3)."""
    results = worlds(4)
    for r, out in enumerate(results):
        m = out["mesh"]
        tp_partners = (r - r % 2, r - r % 2 + 1)
        dp_partners = (r % 2, r % 2 + 2)
        assert m["coords"] == (r // 2, r % 2)
        assert m["groups"][("tp",)] == (tp_partners, r % 2)
        assert m["groups"][("dp",)] == (dp_partners, r // 2)
        assert m["both"] == (0, 1, 2, 3)
        assert m["tp_sum"] == sum(tp_partners)
        assert m["dp_sum"] == sum(dp_partners)
        torch.testing.assert_close(m["dp_broadcast_from_1"], _x(dp_partners[1], 30, SHAPE))
        if r == dp_partners[1]:
            torch.testing.assert_close(m["dp_reduce_to_1"], sum(_x(p, 31, SHAPE) for p in dp_partners))
        other = dp_partners[0] if r == dp_partners[1] else dp_partners[1]
        torch.testing.assert_close(m["dp_ring_shift"], _x(other, 32, SHAPE))
        torch.testing.assert_close(m["tp_all_gather"], torch.stack([_x(p, 33, SHAPE) for p in tp_partners]))


def test_counts_compare_by_group_and_channel() -> None:
    """Two counts agree only on the same group: the same size over other axes, or the same ranks
    on another channel, is a different collective."""
    sp, tp = (CommRecord("all_reduce", "optimizer", 2, 64, group=g) for g in ("dp+sp", "dp+tp"))
    weights, kv = (CommRecord("broadcast", "forward", 4, 64, 3, group=g) for g in ("tsp#1", "tsp"))
    assert summarize([sp]) != summarize([tp]) and summarize([weights]) != summarize([kv])
    assert summarize([weights, weights]) == {("broadcast", "forward", "tsp#1", 4): (6, 384)}
