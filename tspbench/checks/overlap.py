"""How much of TSP's weight traffic really hides behind its GEMMs, at world size 2 and 4.

For one TSP layer's forward + backward (the ring MLP, or the broadcast attention), four variants:
    overlap    async transfers in flight while the GEMMs run (the default schedule)
    blocking   the same math with every transfer waited on at once (``overlap=False``)
    compute    the same step with collectives simulated (tspbench.dist.comm.simulate): no data moves
    comm       the step's recorded collectives replayed back to back with no compute
run round by round in a seeded random order (so drift on a shared host cannot decide the
comparison), each timed on the slowest rank. A perfect overlap runs in max(compute, comm), none
in compute + comm; the fraction hidden is (compute + comm - overlap) / comm, beside what the
time model assumes (the profile's ``overlap_efficiency``).

    tspbench check overlap [--rounds 15] [--worlds 2 4] [--hardware cpu] [--json] [--out FILE]
"""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tspbench.analytic.hardware import Hardware
from tspbench.core.files import write_atomic
from tspbench.dist import comm
from tspbench.dist.launch import launch
from tspbench.dist.mesh import Mesh
from tspbench.model.layers import rope_tables
from tspbench.strategies.tsp_attention import AttentionSpec, TSPAttention
from tspbench.strategies.tsp_ring import Ring, RingMLP

# (hidden, ffn width or heads, local tokens): a few MB of weights per step against GEMMs of
# similar duration on one CPU core, so that overlap can show.
SHAPES = {"mlp": (512, 2048, 256), "attn": (512, 8, 512)}
VARIANTS = ("overlap", "blocking", "compute", "comm")


def _setup(kind: str, shape: tuple[int, int, int]) -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(rank)
    mesh = Mesh({"dp": 1, "tsp": world}, rank, channels=2)
    kv_group, w_group = mesh.group("tsp"), mesh.group("tsp", channel=1)
    h, width, tokens = shape
    x = torch.randn(1, tokens, h, requires_grad=True)
    modules = {}
    for overlap in (True, False):
        if kind == "mlp":
            module = RingMLP(3 * width // world, h, Ring(w_group, kv_group, overlap))
        else:
            spec = AttentionSpec(h // world, h // world, h // width, kv_group, w_group, overlap)
            module = TSPAttention(spec.rows, h, spec)
        torch.nn.init.normal_(module.shard, std=0.02)
        modules[overlap] = module
    positions = torch.arange(tokens) + rank * tokens  # contiguous pieces: the same work on each rank
    rope = rope_tables(positions, h // width, 1e4, x.dtype) if kind == "attn" else None
    state = {"x": x, "modules": modules, "rope": rope, "mesh": mesh}
    with comm.counting() as log:
        _step(state, True)
    state["records"] = list(log.records)
    return state


def _step(state: dict, overlap: bool) -> None:
    y = state["modules"][overlap](state["x"], state["rope"])
    y.backward(torch.ones_like(y))


def run_variant(state: dict, variant: str) -> None:
    if variant == "comm":
        comm.replay(state["records"], state["mesh"].by_name)
    elif variant == "compute":
        with comm.simulate():
            _step(state, True)
    else:
        _step(state, variant == "overlap")


def study_rank(kind: str, shape: tuple[int, int, int], rounds: int, seed: int) -> dict[str, list[float]]:
    """Every variant once per round, in a seeded random order; seconds on the slowest rank."""
    torch.set_num_threads(1)
    state = _setup(kind, shape)
    for variant in VARIANTS:  # warm-up
        run_variant(state, variant)
    order, samples = random.Random(seed), {v: [] for v in VARIANTS}
    group = state["mesh"].group("tsp")
    for _ in range(rounds):
        names = list(VARIANTS)
        order.shuffle(names)
        for name in names:
            comm.barrier(group)
            start = time.perf_counter()
            run_variant(state, name)
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            samples[name].append(float(elapsed.item()))
    return samples


def summarize(samples: dict[str, list[float]]) -> dict[str, float]:
    med = {v: statistics.median(s) for v, s in samples.items()}
    hidden = (med["compute"] + med["comm"] - med["overlap"]) / med["comm"]
    return {**{f"{v}_ms": m * 1e3 for v, m in med.items()}, "hidden_fraction": hidden,
            "overlap_vs_blocking": med["overlap"] / med["blocking"]}  # fmt: skip


def study(worlds: tuple[int, ...], rounds: int, seed: int = 0) -> list[dict[str, object]]:
    rows = []
    for world in worlds:
        for kind, shape in SHAPES.items():
            samples = launch(study_rank, world, kind, shape, rounds, seed, timeout=1800)[0]
            rows.append(
                {"kind": kind, "world": world, "shape": shape, "rounds": rounds, **summarize(samples)}
            )
    return rows


def overlap(worlds: tuple[int, ...], rounds: int, hw: Hardware, out: Path | None = None) -> dict[str, object]:
    """The study's rows beside what the profile ``hw`` assumes; written to ``out`` (JSON) when
    given (the study stores nothing by default: its numbers are this host's of the day)."""
    result = {"assumed_overlap_efficiency": hw.overlap_efficiency,
              "rows": study(worlds, rounds)}  # fmt: skip
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, json.dumps(result, indent=1) + "\n")
    return result
