"""The published entries' steps executed in the fake world, once, and stored for the backtest.

An 8B step at 8K tokens takes seconds to a minute or more per rank under fake tensors, so
``tspbench check backtest`` reads stored records (``results/published/fake/<point id>.json``) and
only ``--execute`` runs them: rank 0 of each point (FSDP and TP ranks of a
step peak alike; one rank keeps it quick), simulated CUDA, bf16. Entries that map to the same
point (a run with and without torch.compile: the project executes no compiled program) share
one record.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tspbench.analytic.profile_choice import choose_profile
from tspbench.checks.published import Published, fake_record_path
from tspbench.core.files import write_atomic
from tspbench.measure.fake import fake_bench


def execute_published(
    published: Published, results: Path, rerun: bool = False, say: Callable[[str], None] = lambda _: None
) -> list[Path]:
    """Execute every predicted entry's point that has no stored record (all of them with
    ``rerun``); returns the records written. ``say`` hears one line per point."""
    written: list[Path] = []
    for entry in published.predicted():
        layout, workload = entry.point()
        path = fake_record_path(results, layout, workload)
        if (path.exists() and not rerun) or path in written:
            continue
        say(f"{entry.id}: executing {layout.describe()} at {workload.seq_len} tokens in the fake world")
        hardware = choose_profile(None, device=workload.device, measured=False)  # the fake world's rule
        record = fake_bench(layout, workload, hardware, ranks=[0], trace_path=path.with_suffix(".npz"))
        record["trace_path"] = path.with_suffix(".npz").name  # beside the record, in the repository
        record["published_entries"] = [e.id for e in published.predicted() if e.point() == (layout, workload)]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
        say(f"  {record['status']}: {path} ({record['fake_seconds']:.0f} s)")
        written.append(path)
    return written
