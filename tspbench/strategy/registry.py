"""The strategy registry: plugins register by name; built-ins and entry points load on first use.

The built-in plugins (``tspbench.strategies``, the repository's top-level strategies/ folder)
and third-party ones (the ``tspbench.strategies`` entry-point group, ``name = "module:Class"``)
are imported by name the first time a strategy is asked for, as submitit loads its plugins, so
this API never imports a plugin at import time.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Iterator

from tspbench.core.errors import LayoutError, WorkloadError
from tspbench.core.spec import Layout, Workload
from tspbench.strategy.base import Strategy

BUILTIN = "tspbench.strategies"
ENTRY_POINT_GROUP = "tspbench.strategies"

_REGISTRY: dict[str, type[Strategy]] = {}
_LOADED = False


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: add a strategy under ``cls.name``. A duplicate name raises."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        taken = _REGISTRY[cls.name].__module__
        raise ValueError(
            f"strategy {cls.name!r} is already registered by {taken}; known: {', '.join(sorted(_REGISTRY))}"
        )
    _REGISTRY[cls.name] = cls
    return cls


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    importlib.import_module(BUILTIN)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        cls = ep.load()
        if cls.name not in _REGISTRY:
            register(cls)


def available() -> list[str]:
    _load()
    return sorted(_REGISTRY)


def layout_for(cls: type[Strategy], world: int) -> Layout:
    """A layout of ``world`` ranks (a power of two) for any strategy: its axes, innermost first,
    take the factors of two in turn (dp for a strategy without axes of its own)."""
    if world < 1 or world & (world - 1):
        raise LayoutError(f"a layout for {cls.name!r} needs a power-of-two world, got {world}")
    axes = list(cls.axes) or ["dp"]
    degrees = dict.fromkeys(axes, 1)
    for i in range(world.bit_length() - 1):
        degrees[axes[-1 - i % len(axes)]] *= 2
    return Layout(cls.name, **degrees)


def get_strategy(name: str) -> type[Strategy]:
    _load()
    if name not in _REGISTRY:
        raise LayoutError(f"unknown strategy {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


# A switch set away from its default, and what it does (for the error that refuses it).
SWITCHES = {
    "megatron_sp": "megatron_sp (--megatron-sp) shards the residual stream over a tensor-parallel axis",
    "overlap": "overlap: false (--no-overlap) makes TSP's weight transfers blocking",
    "kv_exchange": "kv_exchange (--kv-exchange) sets how a sequence axis exchanges K/V",
    "mlp_exchange": "mlp_exchange (--mlp-exchange) sets how TSP's MLP weight shards move",
}


def check_layout(layout: Layout, workload: Workload) -> type[Strategy]:
    """Validate a layout against a workload before anything is launched; returns the strategy."""
    cls = get_strategy(layout.strategy)
    cls.check(layout, workload)
    check_switches(cls, workload)
    return cls


def check_switches(cls: type[Strategy], workload: Workload) -> None:
    """Refuse a switch the strategy ignores (``Strategy.switches``): ``--megatron-sp`` on sp would
    run plain sp under a label that says otherwise."""
    switched = (
        ("megatron_sp", workload.megatron_sp),
        ("overlap", not workload.overlap),
        ("kv_exchange", workload.kv_exchange != "allgather"),
        ("mlp_exchange", workload.mlp_exchange != "ring"),
    )
    used = [name for name, on in switched if on]
    for switch in used:
        if switch not in cls.switches:
            takers = ", ".join(s.name for s in iter_strategies() if switch in s.switches)
            raise WorkloadError(f"{SWITCHES[switch]}: it applies to {takers} only, not {cls.name!r}")


def check_fake_world(layout: Layout, workload: Workload) -> None:
    """Validate a point for the fake world before anything is launched."""
    cls = check_layout(layout, workload)
    obstacle = cls.fake_world_obstacle(layout, workload)
    if obstacle:
        raise LayoutError(f"{layout.describe()} cannot run in the fake world: {obstacle}")


def iter_strategies() -> Iterator[type[Strategy]]:
    _load()
    yield from (_REGISTRY[n] for n in sorted(_REGISTRY))
