"""What calibrate books each traced op (tspbench.calibrate.opcosts.profiled): an op the trace records
is timed whole, with the ops it calls, so a rate per op name is its own calls' rate."""

from __future__ import annotations

import pytest
import torch

from tspbench.calibrate.opcosts import profiled, traced, traced_names

SOURCE = torch.randn(1 << 21)  # 8 MiB of float32: the conversion's kernel dominates the step
SMALL, TARGET = torch.randn(16), torch.empty(16)


def convert() -> None:
    SOURCE.to(torch.float64)  # aten::to -> _to_copy -> empty_strided + copy_


def step() -> None:
    convert()
    TARGET.copy_(SMALL)  # the step's own copy_: 128 bytes


def test_a_traced_op_holds_the_ops_it_calls() -> None:
    """The trace records the conversion as one `_to_copy` and the small copy as `copy_`. By self
    time the profiler books the conversion's work to the `copy_` inside it, and `copy_`'s rate
    would price the step's own 128-byte copy as if it moved 16 MiB; timed whole, `_to_copy` holds
    the conversion and `copy_` only its own call."""
    names = traced_names(traced(step))
    assert {"_to_copy", "copy_"} <= names
    by_self, whole = profiled(step), profiled(step, names)
    assert by_self["copy_"] > 10 * by_self["_to_copy"]
    assert whole["_to_copy"] > 10 * whole["copy_"]


def test_whole_and_self_time_partition_the_same_profile() -> None:
    """Within one profile, the whole-op seconds and the self seconds of the aten ops sum alike."""
    from torch.profiler import profile

    from tspbench.calibrate.opcosts import whole_op_seconds
    from tspbench.calibrate.profiled import self_seconds

    with profile() as prof:
        convert()
    events = prof.events()
    whole = whole_op_seconds(events, frozenset({"_to_copy"}), cuda=False)
    selfs = sum(self_seconds(e, False) for e in events if e.name.startswith("aten::"))
    assert sum(whole.values()) == pytest.approx(selfs, rel=1e-9)
    assert set(whole) == {"to", "_to_copy"}  # the wrapper keeps its own time; nothing below _to_copy
