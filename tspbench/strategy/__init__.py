"""The strategy plugin API: subclass ``Strategy``, decorate with ``@register``.

    base.py        Strategy (declarations, layout checks, data and loss, gradient sync), made of:
    weights.py       Weights: the parameters from their Placement, built and gathered back
    analysis.py      Analysis: the analytic costs (collectives, shapes, memory, FLOPs)
    decode.py        Decoding: decode's cache, slots, steps and their collectives
    placement.py   Piece, Placement: which slice of which reference weight a rank holds
    traffic.py     Traffic: the collectives a strategy declares, and what recomputation repeats
    registry.py    register, get_strategy, available, iter_strategies, check_layout,
                   check_fake_world, layout_for

The built-in plugins live in the repository's top-level strategies/ folder, installed as
``tspbench.strategies``; third-party ones register through the ``tspbench.strategies``
entry-point group. Importing this package never imports a plugin.
"""

from tspbench.core.spec import Workload
from tspbench.strategy.base import LocalBatch, Strategy, divisible
from tspbench.strategy.placement import Piece, Placement, reference_shape
from tspbench.strategy.registry import (
    available,
    check_fake_world,
    check_layout,
    get_strategy,
    iter_strategies,
    layout_for,
    register,
)
from tspbench.strategy.traffic import Traffic, with_recomputation

__all__ = [
    "LocalBatch", "Piece", "Placement", "Strategy", "Traffic", "Workload", "available", "check_fake_world",
    "check_layout", "divisible", "get_strategy", "iter_strategies", "layout_for", "reference_shape",
    "register", "with_recomputation",
]  # fmt: skip
