"""Time from the executed schedule: a step trace (tspbench.core.trace) replayed on per-rank lanes.

Each rank has one compute lane per CUDA stream (one on CPU) and one communication lane per link
it uses (inside the node, or across the NIC). Its events run in program order:

    compute   starts when its stream is free; lasts its cost (below)
    issue     a collective is issued at its stream's position; it starts when every replayed
              participant has issued it and each one's link lane is free (so a rank that issues
              late - a zigzag chunk with more causal work - shows as waiting on peers), and
              lasts latency + bus bytes / bandwidth of its op, group size and link
    wait      the stream waits until the collective ends (``Pending.wait``, a blocking call, or
              the first op that touches the collective's buffers)
    record /  CUDA events order the streams (FSDP2's all-gather and reduce-scatter streams)
    stream wait

Each op costs what tspbench.analytic.replay_costs prices it at (``op_seconds``), and:

    drift         where ranks outnumber a host's cores, a rank issues each collective late by
                  the wait calibrate measured after the same compute (``Hardware.sync_s``: the
                  scheduler runs its peers meanwhile); none on GPUs (each rank has its device)
    contention    compute that runs while the rank's link carries a collective is slowed by
                  ``comm_slowdown`` of the overlap (CPU: 1 - the measured overlap efficiency;
                  GPU: the SMs NCCL/RCCL occupy, assumed), found by replaying twice

Data-parallel replicas are identical: the replay runs the ranks of the first model-parallel
group, and a collective over a group with ranks outside them (the data-parallel gradient sync)
starts when the replayed participants have issued it, priced on the link its ranks cross.
Links are shared, not multiplied: two transfers on one link take turns, as two sharing its
bandwidth would finish together; a collective's latency does not hold the link, so collectives
issued back to back pipeline it.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from tspbench.analytic import prices
from tspbench.analytic.hardware import Hardware
from tspbench.analytic.replay_costs import Costs, by_kind, kernel_seconds, kind_seconds, op_seconds
from tspbench.core.trace import (
    COMPUTE,
    ISSUE,
    MARK,
    RECORD,
    STREAM,
    WAIT,
    RankTrace,
)

__all__ = ["Costs", "Timeline", "kernel_seconds", "kind_seconds", "op_seconds", "op_times", "timeline"]
PASSES = 3  # replays: the first without contention, each next with the overlaps of the one before
Item = tuple[int, int, float]  # events [first, end) of a rank; seconds of a run of compute, or nan


# ----------------------------------------------------------------------------- the schedule


@dataclass(eq=False)
class Collective:
    """One collective instance across the replayed ranks (hashed by identity)."""

    op: str
    label: str
    ranks: tuple[int, ...]
    msg_bytes: float
    link: str
    latency: float
    transfer: float  # the part that holds the link
    issued: dict[int, float] = field(default_factory=dict)  # replayed rank -> issue time
    start: float = math.nan
    end: float = math.nan

    @property
    def scheduled(self) -> bool:
        return not math.isnan(self.end)

    @property
    def seconds(self) -> float:
        return self.latency + self.transfer


@dataclass
class RankState:
    """A rank's progress through its events in one replay."""

    trace: RankTrace
    segments: list[Item]  # (first event, end event, seconds): a run of compute
    lanes: dict[int, float] = field(default_factory=lambda: defaultdict(float))  # stream -> free at
    links: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # link -> free at
    item: int = 0
    busy: list[tuple[float, float]] = field(default_factory=list)  # default stream's compute spans
    segment_times: list[tuple[float, float]] = field(default_factory=list)  # per segment: start, end
    events_at: dict[int, tuple[float, str]] = field(default_factory=dict)  # CUDA event -> time, blocker
    blocker: dict[int, str] = field(default_factory=lambda: defaultdict(str))  # stream -> last wait's op
    waits: list[tuple[float, float, float, str]] = field(default_factory=list)  # t0, peers until, end, op
    marks: list[tuple[str, int, float]] = field(default_factory=list)  # label, end?, time
    coll_of: dict[int, Collective] = field(default_factory=dict)  # issue row -> its collective
    computed: float = 0.0  # compute seconds since the rank's last issue (its drift grows with them)


def segments(trace: RankTrace, seconds: np.ndarray) -> list[Item]:
    """Maximal runs of compute events on one stream, with their summed seconds, between the
    other events (each of which is its own item, ``(i, i + 1, nan)``)."""
    ev = trace.events
    out: list[Item] = []
    n, i = len(ev), 0
    kind, stream = ev["kind"], ev["stream"]
    while i < n:
        if kind[i] != COMPUTE:
            out.append((i, i + 1, math.nan))
            i += 1
            continue
        j = i + 1
        while j < n and kind[j] == COMPUTE and stream[j] == stream[i]:
            j += 1
        out.append((i, j, float(seconds[i:j].sum())))
        i = j
    return out


class Replay:
    """One pass of the schedule over every replayed rank."""

    def __init__(
        self, traces: list[RankTrace], costs: Costs, items: dict[int, list[Item]], base: dict[int, np.ndarray]
    ) -> None:
        self.costs, self.base = costs, base  # base: each op's seconds before contention
        self.replayed = {t.rank for t in traces}
        self.states = {t.rank: RankState(t, items[t.rank]) for t in traces}
        self.instances: dict[tuple, Collective] = {}
        self.issued_count: dict[tuple[int, tuple], int] = defaultdict(int)

    def run(self) -> None:
        pending = set(self.states)
        while pending:
            progressed = False
            for rank in sorted(pending):
                progressed |= self._advance(self.states[rank])
                if self.states[rank].item == len(self.states[rank].segments):
                    pending.discard(rank)
            if not progressed and pending:
                stuck = {r: self.states[r].item for r in sorted(pending)}
                raise RuntimeError(f"the replay cannot progress: ranks waiting at items {stuck}")

    def _advance(self, s: RankState) -> bool:
        moved = False
        while s.item < len(s.segments):
            first, _, seconds = s.segments[s.item]
            if not math.isnan(seconds):
                self._compute(s, first, seconds)
            elif not self._event(s, first):
                return moved
            s.item += 1
            moved = True
        return moved

    def _compute(self, s: RankState, first: int, seconds: float) -> None:
        stream = int(s.trace.events["stream"][first])
        start = s.lanes[stream]
        s.lanes[stream] = start + seconds
        s.segment_times.append((start, start + seconds))
        s.computed += seconds
        if stream == 0 and seconds > 0:
            s.busy.append((start, start + seconds))

    def _event(self, s: RankState, i: int) -> bool:
        """Process event ``i``; False when it must wait for other ranks."""
        ev = s.trace.events[i]
        kind, stream = int(ev["kind"]), int(ev["stream"])
        s.segment_times.append((s.lanes[stream], s.lanes[stream]))
        if kind == ISSUE:
            self._issue(s, i, stream)
        elif kind == WAIT:
            coll = s.coll_of.get(int(ev["ref"]))
            if coll is None or not coll.scheduled:
                s.segment_times.pop()
                return False
            self._wait(s, stream, coll)
        elif kind == RECORD:
            s.events_at[int(ev["ref"])] = (s.lanes[stream], s.blocker[stream])
        elif kind == STREAM:
            t0, (t1, blocker) = s.lanes[stream], s.events_at.get(int(ev["ref"]), (0.0, ""))
            if t1 > t0:
                s.lanes[stream] = t1
                s.blocker[stream] = blocker
                if stream == 0:
                    s.waits.append((t0, t0, t1, blocker or "other_streams"))
        elif kind == MARK:
            s.marks.append((s.trace.names[int(ev["name"])], int(ev["ref"]), s.lanes[stream]))
        return True

    def _issue(self, s: RankState, i: int, stream: int) -> None:
        ev = s.trace.events[i]
        group = s.trace.groups[int(ev["group"])]
        key = (group.label, group.ranks)
        seq = self.issued_count[(s.trace.rank, key)]
        self.issued_count[(s.trace.rank, key)] = seq + 1
        coll = self.instances.get((key, seq))
        if coll is None:
            op = s.trace.names[int(ev["name"])]
            link, latency, transfer = self.costs.collective_seconds(op, group.ranks, float(ev["nbytes"]))
            coll = Collective(op, group.label, group.ranks, float(ev["nbytes"]), link, latency, transfer)
            self.instances[(key, seq)] = coll
        drift = prices.peer_wait_seconds(self.costs.hw, self.costs.ranks_on_node, s.computed)
        coll.issued[s.trace.rank] = s.lanes[stream] + drift
        s.computed = 0.0
        s.coll_of[i] = coll
        participants = self.replayed.intersection(coll.ranks)
        if participants.issubset(coll.issued):
            start = max(max(coll.issued.values()), *(self.states[r].links[coll.link] for r in participants))
            coll.start, coll.end = start, start + coll.seconds
            for r in participants:
                self.states[r].links[coll.link] = start + coll.transfer

    def _wait(self, s: RankState, stream: int, coll: Collective) -> None:
        t0 = s.lanes[stream]
        if coll.end > t0:
            s.lanes[stream] = coll.end
            s.blocker[stream] = coll.op
            if stream == 0:
                s.waits.append((t0, min(coll.end, max(t0, max(coll.issued.values()))), coll.end, coll.op))


# ----------------------------------------------------------------------------- the result


@dataclass
class Timeline:
    """A replayed step: its time, where the critical rank's time went, what hid under compute."""

    step_s: float
    critical_rank: int
    compute_s: float
    exposed_s: dict[str, float]  # idle on the critical rank's default stream, by collective op
    peers_s: float  # ... waiting for peers to issue a collective
    hidden_fraction: dict[str, float]  # by op: collective time under compute (replayed ranks)
    weights_hidden_fraction: float | None  # TSP: its weight shards' traffic (channel 1)
    rank_end_s: dict[int, float]
    rank_compute_s: dict[int, float] = field(default_factory=dict)  # each rank's default-stream compute
    replay: Replay | None = None
    kind_s: dict[int, dict[str, float]] = field(default_factory=dict)  # rank -> kind -> kernel seconds

    @property
    def mean_busy_s(self) -> float:
        """Mean over the replayed ranks of each one's default-stream compute."""
        return sum(self.rank_compute_s.values()) / len(self.rank_compute_s)

    @property
    def mean_blocked_s(self) -> float:
        """Mean over the replayed ranks of the rest of each one's step."""
        return sum(self.rank_end_s[r] - c for r, c in self.rank_compute_s.items()) / len(self.rank_compute_s)

    def to_record(self, prefix: str = "timeline_") -> dict[str, object]:
        out: dict[str, object] = {
            f"{prefix}step_time_s": self.step_s,
            f"{prefix}compute_s": self.compute_s,
            f"{prefix}comm_exposed_s": sum(self.exposed_s.values()),
            f"{prefix}waits_on_peers_s": self.peers_s,
            f"{prefix}critical_rank": self.critical_rank,
        }
        if self.rank_compute_s:
            out[f"{prefix}busy_s"], out[f"{prefix}blocked_s"] = self.mean_busy_s, self.mean_blocked_s
        out.update({f"{prefix}exposed_{op}_s": v for op, v in sorted(self.exposed_s.items())})
        out.update({f"{prefix}hidden_fraction_{op}": v for op, v in sorted(self.hidden_fraction.items())})
        if self.weights_hidden_fraction is not None:
            out[f"{prefix}weights_hidden_fraction"] = self.weights_hidden_fraction
        out.update({f"{prefix}{kind}_s": s for kind, s in self.kind_s.get(self.critical_rank, {}).items()})
        return out


def timeline(traces: list[RankTrace], hw: Hardware, world_size: int) -> Timeline:
    """Replay ``traces`` (the ranks of one model-parallel group) on ``hw`` in a world of
    ``world_size`` ranks; ``PASSES`` times, each with the contention the last one found."""
    costs = Costs(hw, world_size)
    base = {t.rank: op_seconds(t, costs) for t in traces}
    cut = {t.rank: segments(t, base[t.rank]) for t in traces}
    replay = Replay(traces, costs, cut, base)
    replay.run()
    kinds = {t.rank: kind_seconds(t, costs) for t in traces}
    shared = hw.cores_per_node is not None and len(traces) > 1  # ranks share a host's cores
    if hw.comm_slowdown > 0 or shared:
        alone = {t.rank: by_kind(t, costs) for t in traces}
        for _ in range(PASSES - 1):
            priced = {r: repriced(replay, r, cut[r], alone[r], shared) for r in cut}
            replay = Replay(traces, costs, {r: p[0] for r, p in priced.items()}, base)
            replay.run()
            kinds = {r: p[1] for r, p in priced.items()} if shared else kinds
    return summarize(replay, kinds)


def repriced(
    replay: Replay, rank: int, items: list[Item], alone: np.ndarray, shared: bool
) -> tuple[list[Item], dict[str, float]]:
    """Each run of compute repriced from what overlapped it in ``replay``: at the share of the
    device its kind gets with as many ranks computing as did on average over the run (``shared``:
    ranks on one host's cores; else the static share), lengthened by ``comm_slowdown`` x the
    time the rank's links carried a collective meanwhile: a fixed point, reached in a few passes.
    Also each kind's kernel seconds so priced (the host's apart)."""
    hw, s = replay.costs.hw, replay.states[rank]
    totals = dict.fromkeys(KINDS[:3], 0.0)
    links = merged([(c.start, c.start + c.transfer) for c in set(s.coll_of.values()) if c.scheduled])
    others = [merged(o.busy) for r, o in replay.states.items() if r != rank]
    out = []
    for (first, end, seconds), (start, stop) in zip(items, s.segment_times, strict=True):
        if not math.isnan(seconds) and stop > start:
            if shared:
                busy = 1 + sum(overlap(o, start, stop) for o in others) / (stop - start)
                kinds = alone[first:end].sum(axis=0) / [hw.kind_share_at(k, busy) for k in KINDS]
                for name, value in zip(KINDS[:3], kinds[:3], strict=True):
                    totals[name] += value
                seconds = float(kinds.sum())
            seconds += hw.comm_slowdown * overlap(links, start, stop)
        out.append((first, end, seconds))
    return out, totals


KINDS = ("gemm", "attention", "elementwise", "host")


def op_times(replay: Replay, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, seconds) of every event of ``rank`` in the replay: a run of compute spread over
    its ops in proportion to their own cost; other events last no time."""
    state, base = replay.states[rank], replay.base[rank]
    start, seconds = np.zeros(len(base)), np.zeros(len(base))
    for (first, end, _), (t0, t1) in zip(state.segments, state.segment_times, strict=True):
        own = base[first:end]
        total = own.sum()
        scaled = own * ((t1 - t0) / total) if total > 0 else own * 0
        seconds[first:end] = scaled
        start[first:end] = t0 + np.concatenate(([0.0], np.cumsum(scaled)[:-1]))
    return start, seconds


def merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap(spans: list[tuple[float, float]], a: float, b: float) -> float:
    """How much of [a, b) the sorted, disjoint ``spans`` cover."""
    i = max(0, bisect.bisect_right(spans, (a, math.inf)) - 1)
    total = 0.0
    while i < len(spans) and spans[i][0] < b:
        total += max(0.0, min(b, spans[i][1]) - max(a, spans[i][0]))
        i += 1
    return total


def summarize(replay: Replay, kinds: dict[int, dict[str, float]]) -> Timeline:
    states = replay.states
    ends = {r: max(s.lanes.values(), default=0.0) for r, s in states.items()}
    critical = max(ends, key=ends.__getitem__)
    s = states[critical]
    exposed: dict[str, float] = defaultdict(float)
    peers = 0.0
    for t0, peers_until, t1, op in s.waits:
        peers += peers_until - t0
        exposed[op] += t1 - peers_until
    hidden, total = defaultdict(float), defaultdict(float)
    weights = [0.0, 0.0]
    for st in states.values():
        busy = merged(st.busy)
        for coll in dict.fromkeys(st.coll_of.values()):  # issue order: sums that repeat bit for bit
            if not coll.scheduled or coll.seconds <= 0:
                continue
            under = overlap(busy, coll.start, coll.end)
            hidden[coll.op] += under
            total[coll.op] += coll.end - coll.start
            if coll.label.startswith("tsp#1"):
                weights[0] += under
                weights[1] += coll.end - coll.start
    return Timeline(
        step_s=ends[critical],
        critical_rank=critical,
        compute_s=sum(b - a for a, b in s.busy),
        exposed_s=dict(exposed),
        peers_s=peers,
        hidden_fraction={op: hidden[op] / total[op] for op in total if total[op] > 0},
        weights_hidden_fraction=weights[0] / weights[1] if weights[1] > 0 else None,
        rank_end_s=ends,
        rank_compute_s={r: sum(b - a for a, b in st.busy) for r, st in states.items()},
        replay=replay,
        kind_s=kinds,
    )
