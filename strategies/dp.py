"""DP: a full replica per rank, the batch split, every gradient all-reduced over dp.

Gradients are not bucketed: one in-place async all-reduce per gradient after backward (see
Strategy.sync_grads). The forward and backward passes issue no collective at all.
"""

from __future__ import annotations

from tspbench.strategy import Strategy, register


@register
class DataParallel(Strategy):
    name = "dp"
    axes = ()
    summary = "data parallel: whole model per rank, batch split, gradients all-reduced"
