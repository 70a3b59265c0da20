"""Bus bytes per message byte of each collective over n ranks (the nccl-tests convention): what
one rank's link carries for a message of M bytes is ``BUS_FACTOR[op](n) * M``. No torch, so the
analytic model, the timeline and the report price collectives without importing it."""

from __future__ import annotations

from collections.abc import Callable

BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
