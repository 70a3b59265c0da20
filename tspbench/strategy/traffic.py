"""What a strategy says it moves: a Traffic entry per kind of collective in a step, and what
recomputation repeats. The analytic count, the time model and validate's comparison all read
these declarations (tspbench.strategy.base.Strategy.traffic)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tspbench.core.spec import Workload


@dataclass(frozen=True)
class Traffic:
    """A collective a strategy issues in a step, for its analytic count and time.

    ``axes`` name the group (its size follows from the layout; ``channel`` > 0 is a second
    communicator over the same ranks). ``hidden`` says the schedule overlaps it with compute.
    ``scope`` says what recomputation repeats it: "core" (inside the attention core: selective
    and full recomputation re-issue it in backward), "block" (inside a decoder block: full
    recomputation re-issues it), "block_end" (the block's last op: torch's checkpoint stops
    recomputing once every saved tensor is back, so nothing after the last saving op is
    re-run), "model" (outside the blocks: never repeated). ``batched`` says it is issued
    async together with the other batched collectives of its phase and waited on once (the
    gradient all-reduces after backward), not one blocking call after another.
    ``window_flops`` (hidden calls): each call overlaps only the compute its schedule issues
    between the call and its wait, this many FLOPs (priced at the GEMM rate), and what outlasts
    them is exposed; None: it may hide anywhere in the step's compute. ``window`` names it:
    the calls of one phase that name the same window are in flight together, on one link, so
    their times add up before the window's compute hides them (TSP's backward: a head block's
    weight broadcast and its gradient reduce; a ring shift and its accumulator). A hidden call
    may name a window without bounding it (``window_flops`` None: FSDP's per-block transfers).
    ``queue`` (blocking calls): the window, of the same phase and link, whose transfers the
    schedule issues before this call, which it waits behind on the link; ``queue_flops`` is
    the compute issued between those transfers and this call (what they get to run under first).
    ``window_count`` (decode): how many times a step runs its window's compute where that is not
    the calls' count (a ring's D shards in hand behind its D - 1 shifts); 0: once per call.
    """

    op: str
    axes: tuple[str, ...]
    msg_bytes: int
    count: int = 1
    phase: str = "forward"
    scope: str = "block"
    hidden: bool = False
    channel: int = 0
    batched: bool = False
    window_flops: float | None = None
    window: str = ""
    queue: str = ""
    queue_flops: float = 0.0
    window_count: int = 0


# op: every collective of the block runs again in its recompute, as under full (none is cached:
# tspbench.model.recompute)
RECOMPUTED_SCOPES = {"none": (), "selective": ("core",), "op": ("core", "block"), "full": ("core", "block")}


def with_recomputation(traffic: list[Traffic], workload: Workload) -> list[Traffic]:
    """The step's traffic plus the forward traffic that recomputation repeats in backward."""
    repeat = RECOMPUTED_SCOPES[workload.recompute] if workload.mode == "train" else ()
    out = [t for t in traffic if t.count]
    out += [replace(t, phase="backward") for t in out if t.phase == "forward" and t.scope in repeat]
    return out
