"""The timeline (tspbench.analytic.timeline) on hand-built traces, whose replayed times are
derived here by hand; and on a traced fake-world step, its Chrome trace.

The profile is round: 1 TFLOP/s GEMMs, 1 GB/s memory, collectives at 1 GB/s bus bandwidth with no
latency, so a GEMM of 1e12 FLOPs, an element-wise op moving 1e9 bytes and a 2-rank all-reduce of
0.5e9 bytes (bus bytes 2 (n-1)/n x 0.5e9 = 0.5e9) take 1 s, 1 s and 0.5 s.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tspbench.analytic.hardware import Hardware
from tspbench.analytic.timeline import timeline
from tspbench.cli.main import main
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.core.trace import (
    ASYNC,
    COLLECTIVE,
    COMPUTE,
    ELEMENTWISE,
    EVENT,
    GEMM,
    ISSUE,
    RECORD,
    STREAM,
    WAIT,
    Group,
    RankTrace,
    load_traces,
    save_traces,
)
from tspbench.strategy import get_strategy

ROUND = Hardware(
    name="round",
    gpus_per_node=8,
    memory_bytes=2**40,
    peak_tflops=1.0,
    gemm_tflops=1.0,
    attention_tflops=1.0,
    hbm_bandwidth_gbs=1.0,
    intra_node_bandwidth_gbs=1.0,
    intra_node_latency_us=0.0,
    inter_node_bandwidth_gbs=0.1,
    inter_node_latency_us=0.0,
)
PAIR = Group("tp", (0, 1))


class Program:
    """A rank's events, written as a program is: ``gemm(s)``, ``issue()``, ``wait(row)``..."""

    def __init__(self, rank: int) -> None:
        self.rank, self.rows, self.names = rank, [], ["mm", "add", "all_reduce", "record", "wait_event"]

    def _add(self, kind: int, name: str, **cols: float) -> int:
        row = np.zeros(1, dtype=EVENT)[0]
        row["kind"], row["name"], row["sig"], row["group"], row["ref"] = (
            kind,
            self.names.index(name),
            -1,
            -1,
            -1,
        )
        for key, value in cols.items():
            row[key] = value
        self.rows.append(row)
        return len(self.rows) - 1

    def gemm(self, seconds: float, stream: int = 0) -> None:
        self._add(COMPUTE, "mm", cls=GEMM, flops=seconds * 1e12, stream=stream)

    def elementwise(self, seconds: float) -> None:
        self._add(COMPUTE, "add", cls=ELEMENTWISE, nbytes=seconds * 1e9)

    def issue(self, seconds: float, async_op: bool = True, stream: int = 0) -> int:
        flags = ASYNC if async_op else 0
        return self._add(
            ISSUE, "all_reduce", cls=COLLECTIVE, nbytes=seconds * 1e9, group=0, flags=flags, stream=stream
        )

    def wait(self, row: int, stream: int = 0) -> None:
        self._add(WAIT, "all_reduce", ref=row, stream=stream)

    def record(self, event: int, stream: int) -> None:
        self._add(RECORD, "record", ref=event, stream=stream)

    def stream_wait(self, event: int, stream: int) -> None:
        self._add(STREAM, "wait_event", ref=event, stream=stream)

    def trace(self) -> RankTrace:
        events = np.array(self.rows, dtype=EVENT)
        return RankTrace(self.rank, events, self.names, [], [PAIR], ["default", "side"])


def test_serial_ops_add_up() -> None:
    p = Program(0)
    p.gemm(1.0)
    p.elementwise(1.0)
    p.gemm(0.5)
    tl = timeline([p.trace()], ROUND, 1)
    assert tl.step_s == pytest.approx(2.5) and tl.compute_s == pytest.approx(2.5)
    assert tl.exposed_s == {} and tl.peers_s == 0


def _pair(build) -> list[RankTrace]:
    programs = [Program(0), Program(1)]
    for p in programs:
        build(p)
    return [p.trace() for p in programs]


def test_an_async_collective_under_a_long_gemm_costs_nothing_extra() -> None:
    def build(p: Program) -> None:
        row = p.issue(0.5)
        p.gemm(1.0)
        p.wait(row)

    tl = timeline(_pair(build), ROUND, 2)
    assert tl.step_s == pytest.approx(1.0)
    assert tl.hidden_fraction == {"all_reduce": pytest.approx(1.0)} and sum(tl.exposed_s.values()) == 0


def test_a_collective_waited_on_at_once_is_exposed() -> None:
    def build(p: Program) -> None:
        row = p.issue(0.5, async_op=False)
        p.wait(row)
        p.gemm(1.0)

    tl = timeline(_pair(build), ROUND, 2)
    assert tl.step_s == pytest.approx(1.5)
    assert tl.exposed_s == {"all_reduce": pytest.approx(0.5)} and tl.hidden_fraction == {"all_reduce": 0.0}


def test_a_slow_participant_delays_the_collective_for_all() -> None:
    """Rank 1 computes 2 s before it issues: rank 0 (1 s) waits 1 s on its peer, then 0.5 s on the
    transfer; both end at 2.5 s."""
    fast, slow = Program(0), Program(1)
    for p, seconds in ((fast, 1.0), (slow, 2.0)):
        p.gemm(seconds)
        p.wait(p.issue(0.5, async_op=False))
    tl = timeline([fast.trace(), slow.trace()], ROUND, 2)
    assert tl.rank_end_s == {0: pytest.approx(2.5), 1: pytest.approx(2.5)}
    record = tl.to_record()  # mean over the ranks: computing 1 and 2 s, the rest 1.5 and 0.5 s of 2.5
    assert record["timeline_busy_s"] == pytest.approx(1.5)
    assert record["timeline_blocked_s"] == pytest.approx(1.0)
    states = tl.replay.states
    ((t0, peers_until, t1, op),) = states[0].waits
    assert (t0, peers_until, t1, op) == (
        pytest.approx(1.0),
        pytest.approx(2.0),
        pytest.approx(2.5),
        "all_reduce",
    )


def test_two_collectives_on_one_link_take_turns() -> None:
    """Two async 0.5 s transfers issued together share the node's link: the second ends at 1.0 s,
    under a 2 s GEMM (hidden), after which the step ends."""

    def build(p: Program) -> None:
        first, second = p.issue(0.5), p.issue(0.5)
        p.gemm(2.0)
        p.wait(first)
        p.wait(second)

    tl = timeline(_pair(build), ROUND, 2)
    ends = sorted(c.end for c in set(tl.replay.states[0].coll_of.values()))
    assert ends == [pytest.approx(0.5), pytest.approx(1.0)] and tl.step_s == pytest.approx(2.0)


def test_latency_does_not_hold_the_link_so_back_to_back_collectives_pipeline_it() -> None:
    """With 0.25 s latency: two async 0.5 s transfers issued together each take 0.75 s; the
    second's transfer starts when the first's ends (0.5 s), not when its latency does, so they
    end at 0.75 s and 1.25 s (not 1.5 s); waited on at once, the step is 1.25 s."""
    from dataclasses import replace

    def build(p: Program) -> None:
        first, second = p.issue(0.5), p.issue(0.5)
        p.wait(first)
        p.wait(second)

    tl = timeline(_pair(build), replace(ROUND, intra_node_latency_us=0.25e6), 2)
    ends = sorted(c.end for c in set(tl.replay.states[0].coll_of.values()))
    assert ends == [pytest.approx(0.75), pytest.approx(1.25)] and tl.step_s == pytest.approx(1.25)


def test_a_stream_waits_for_the_event_it_is_told_to() -> None:
    """Side stream: a 1 s GEMM, then an event; the default stream's 0.2 s GEMM, then a wait on
    that event, then 0.3 s more: the step ends at 1.3 s, not 0.5 s."""
    p = Program(0)
    p.gemm(1.0, stream=1)
    p.record(7, stream=1)
    p.gemm(0.2)
    p.stream_wait(7, stream=0)
    p.gemm(0.3)
    tl = timeline([p.trace()], ROUND, 1)
    assert tl.step_s == pytest.approx(1.3)


def test_contention_slows_compute_that_overlaps_a_transfer() -> None:
    """With half the overlap charged (comm_compute_slowdown 0.5): a 1 s GEMM under a 0.5 s
    transfer takes 1.25 s."""
    from dataclasses import replace

    def build(p: Program) -> None:
        row = p.issue(0.5)
        p.gemm(1.0)
        p.wait(row)

    tl = timeline(_pair(build), replace(ROUND, comm_compute_slowdown=0.5), 2)
    assert tl.step_s == pytest.approx(1.25, rel=1e-3)


def test_where_ranks_outnumber_cores_each_issue_is_late_by_the_measured_wait() -> None:
    """A profile that measured a 0.2 s wait after 1 s of compute (sync_us, proportional below):
    two ranks compute 1 s, then 0.5 s, each time before a blocking 0.5 s all-reduce. Each
    all-reduce starts late by its wait (0.2 s, then 0.1 s): the step ends at 1.2 + 0.5 + 0.5 +
    0.1 + 0.5 = 2.8 s, waiting on peers 0.3 s; without the measurement (a GPU) at 2.5 s."""
    from dataclasses import replace

    def build(p: Program) -> None:
        p.gemm(1.0)
        p.wait(p.issue(0.5, async_op=False))
        p.gemm(0.5)
        p.wait(p.issue(0.5, async_op=False))

    shared = replace(ROUND, sync_us={2: {1e6: 0.2e6}})
    tl = timeline(_pair(build), shared, 2)
    assert tl.step_s == pytest.approx(2.8) and tl.peers_s == pytest.approx(0.3)
    assert timeline(_pair(build), ROUND, 2).step_s == pytest.approx(2.5)


def test_mismatched_traces_do_not_hang() -> None:
    waiting = Program(0)
    waiting.wait(waiting.issue(0.5, async_op=False))
    with pytest.raises(RuntimeError, match="cannot progress"):
        timeline([waiting.trace(), Program(1).trace()], ROUND, 2)


def test_traces_round_trip_through_npz(tmp_path: Path) -> None:
    p = Program(0)
    p.gemm(1.0)
    path = save_traces(tmp_path / "t.npz", [p.trace()], {"what": "test"})
    (back,), meta = load_traces(path)
    assert (
        meta == {"what": "test"} and back.names == p.names and np.array_equal(back.events, p.trace().events)
    )
    assert math.isclose(timeline([back], ROUND, 1).step_s, 1.0)


# ----------------------------------------------------------------------------- a traced fake step


@pytest.mark.slow
def test_bench_fake_trace_is_a_chrome_trace_with_every_lane_and_collective(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "t.json.gz"
    argv = ["bench", "--fake", "--strategy", "tsp", "--tsp", "2", "--dp", "2", "--seq-len", "128"]
    assert main([*argv, "--dtype", "bfloat16", "--trace", str(out), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["timeline_step_time_s"] > 0 and record["timeline_hardware"] == "mi300x"
    assert 0 <= record["timeline_weights_hidden_fraction"] <= 1
    events = json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for rank in record["fake_ranks"]:  # the executed ranks of the first model-parallel group
        assert (rank, "compute: default") in names and (rank, "link: node") in names
    links = [e for e in events if e["ph"] == "X" and e["tid"] >= 1000]
    assert links and all(e["args"]["bytes"] > 0 and e["dur"] > 0 for e in links)
    # every collective of the step on each rank: as many as the strategy's analytic count
    layout = Layout("tsp", tsp=2, dp=2)
    workload = Workload(ModelConfig.preset("tiny"), 1, 128, dtype="bfloat16", device="cuda")
    calls = sum(r.count for r in get_strategy("tsp").comm_volume(layout, workload))
    per_rank = {rank: sum(1 for e in links if e["pid"] == rank) for rank in record["fake_ranks"]}
    assert per_rank == dict.fromkeys(record["fake_ranks"], calls)


@pytest.mark.slow
def test_a_sweep_keeps_each_points_traces_and_replay_prices_them_anywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """run.trace: true keeps trace.npz beside each record; `tspbench replay` prices it on any
    profile, and on the sweep's own profile it gives the record's timeline."""
    path = tmp_path / "exp.yaml"
    path.write_text(
        "name: traced\nmodel: {preset: tiny}\nsettings: {seq_len: 128, device: cuda, dtype: bfloat16}\n"
        "layout: {strategy: tsp, tsp: 2}\nrun: {trace: true}\nexecutor: fake\nhardware: h100\n"
    )
    assert main(["run", str(path), "--results", str(tmp_path / "results")]) == 0
    (run,) = [p.parent for p in (tmp_path / "results" / "traced").glob("*/result.json")]
    record = json.loads((run / "result.json").read_text())
    assert (run / "trace.npz").exists() and record["timeline_hardware"] == "h100"
    capsys.readouterr()
    assert main(["replay", str(run), "--hardware", "h100", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["timeline_step_time_s"] == pytest.approx(record["timeline_step_time_s"])
    assert main(["replay", str(run), "--hardware", "mi300x", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["timeline_step_time_s"] > 0
