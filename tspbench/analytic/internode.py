"""Which of a layout's process groups cross nodes, and what share of its step their traffic takes.

A replica inside one node keeps its model-parallel traffic on the node's fabric; what crosses
the NICs is then only the data-parallel gradient all-reduce (and the loss's). A replica wider
than a node (TP+SP 8x2 or 8x8 on 8-GPU nodes) sends its own sequence traffic across them too.
Ranks are placed row-major, model-parallel innermost (tspbench.dist.mesh), so an axis' groups
cross nodes when its stride times its size reaches past one node; rank 0's group is the one
each time model prices (tspbench.analytic.timing), so it is the one judged here.

    crossing axes     the mesh axes (degree > 1) whose groups span more than one node
    inter-node s      sum over the step's collectives whose group crosses nodes of
                      count x (latency + bus bytes / NIC bandwidth): the seconds its traffic holds
                      the inter-node links, hidden under compute or not
    inter-node share  inter-node s / the step's seconds (the analytic model's step)
"""

from __future__ import annotations

from tspbench.analytic import prices
from tspbench.analytic.hardware import Hardware
from tspbench.analytic.timing import call_seconds, crosses_nodes
from tspbench.dist.mesh import Mesh
from tspbench.strategy.traffic import Traffic


def crossing_axes(mesh: Mesh, gpus_per_node: int) -> tuple[str, ...]:
    """The axes of ``mesh`` (degree above 1) whose groups span more than one node, outer first."""
    return tuple(
        a for a in mesh.names if mesh.size(a) > 1 and prices.crosses_nodes(mesh.group(a).ranks, gpus_per_node)
    )


def internode_seconds(mesh: Mesh, traffic: list[Traffic], hw: Hardware) -> float:
    """Seconds the step's collectives over groups that cross nodes hold the inter-node links
    (latency and transfer of every call, whether the schedule hides it or not)."""
    calls = [t for t in traffic if t.count and mesh.size(*t.axes) > 1]
    return sum(t.count * call_seconds(mesh, t, hw) for t in calls if crosses_nodes(mesh, t, hw.gpus_per_node))


def internode_fields(mesh: Mesh, traffic: list[Traffic], hw: Hardware, step_s: float) -> dict[str, object]:
    """The record's ``crossing_axes`` ("dp+sp"; "" where every group stays in a node),
    ``internode_comm_s`` and ``internode_share`` (of the step ``step_s``)."""
    seconds = internode_seconds(mesh, traffic, hw)
    return {
        "crossing_axes": "+".join(crossing_axes(mesh, hw.gpus_per_node)),
        "internode_comm_s": seconds,
        "internode_share": seconds / step_s if step_s > 0 else 0.0,
    }
