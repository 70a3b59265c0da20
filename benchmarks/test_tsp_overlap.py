"""TSP overlap at world size 2: each schedule with overlap on and off, beside its two bounds.

For one layer's forward + backward (the ring MLP, or the broadcast attention):
    overlap    async transfers in flight while the GEMMs run (the default)
    blocking   the same math with every transfer waited on at once (``overlap=False``)
    compute    the same step with collectives simulated (tspbench.comm.simulate): no data moves
    comm       the step's recorded collectives replayed back to back with no compute
A perfect overlap runs in max(compute, comm); no overlap in compute + comm.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from tspbench.strategies.tsp_attention import AttentionSpec, TSPAttention
from tspbench.strategies.tsp_ring import Ring, RingMLP

from tspbench.dist import comm
from tspbench.dist.mesh import Mesh
from tspbench.model.layers import rope_tables

# (hidden, ffn or heads, local tokens): weights of a few MB moved per step against GEMMs
# of similar duration on one CPU core, so that overlap can show.
MLP_SHAPES = {"h512-f2048-T256": (512, 2048, 256)}
ATTN_SHAPES = {"h512-n8-T512": (512, 8, 512)}
VARIANTS = ("overlap", "blocking", "compute", "comm")
_CACHE: dict = {}


def _setup(kind: str, shape: tuple[int, int, int]) -> dict:
    key = (kind, shape)
    if key in _CACHE:
        return _CACHE[key]
    torch.manual_seed(dist.get_rank())
    mesh = Mesh({"dp": 1, "tsp": 2}, dist.get_rank(), channels=2)
    kv_group, w_group = mesh.group("tsp"), mesh.group("tsp", channel=1)
    h, width, tokens = shape
    x = torch.randn(1, tokens, h, requires_grad=True)
    modules = {}
    for overlap in (True, False):
        if kind == "mlp":
            module = RingMLP(3 * width // 2, h, Ring(w_group, kv_group, overlap))
        else:
            spec = AttentionSpec(h // 2, h // 2, h // width, kv_group, w_group, overlap)
            module = TSPAttention(spec.rows, h, spec)
        torch.nn.init.normal_(module.shard, std=0.02)
        modules[overlap] = module
    positions = torch.arange(tokens) + dist.get_rank() * tokens  # contiguous halves: same work
    rope = rope_tables(positions, h // width, 1e4, x.dtype) if kind == "attn" else None
    state = {"x": x, "modules": modules, "rope": rope, "mesh": mesh}
    with comm.counting() as log:
        _step(state, True)
    state["records"] = list(log.records)
    _CACHE[key] = state
    return state


def _step(state: dict, overlap: bool) -> None:
    y = state["modules"][overlap](state["x"], state["rope"])
    y.backward(torch.ones_like(y))


def run_variant(kind: str, shape: tuple[int, int, int], variant: str) -> None:
    state = _setup(kind, shape)
    if variant == "comm":
        comm.replay(state["records"], state["mesh"].by_name)
    elif variant == "compute":
        with comm.simulate():
            _step(state, True)
    else:
        _step(state, variant == "overlap")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", list(MLP_SHAPES))
def test_ring_mlp(benchmark, world2, shape: str, variant: str) -> None:
    world2.call(run_variant, "mlp", MLP_SHAPES[shape], variant)  # warm-up and state
    benchmark.group = f"tsp-ring-mlp-{shape}"
    args = (run_variant, "mlp", MLP_SHAPES[shape], variant)
    benchmark.pedantic(world2.call, args=args, rounds=15, iterations=1)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", list(ATTN_SHAPES))
def test_broadcast_attention(benchmark, world2, shape: str, variant: str) -> None:
    world2.call(run_variant, "attn", ATTN_SHAPES[shape], variant)
    benchmark.group = f"tsp-broadcast-attention-{shape}"
    args = (run_variant, "attn", ATTN_SHAPES[shape], variant)
    benchmark.pedantic(world2.call, args=args, rounds=15, iterations=1)
