"""A step trace: what one rank issued in one step, in program order (no torch; numpy columns).

Recorded where the step runs (tspbench.measure.trace: a real CPU step, or a rank of the fake
world), replayed on per-rank lanes with a cost for every op (tspbench.analytic.timeline), and
exported as a Chrome trace. One row per event:

    kind         COMPUTE  an aten op on a compute stream (its cost class below)
                 ISSUE    a collective or p2p op issued (``group``, message ``nbytes``, ASYNC flag)
                 WAIT     the stream waits for the collective issued at row ``ref``
                 RECORD   a CUDA event ``ref`` recorded on ``stream`` (simulated GPU)
                 STREAM   ``stream`` waits for event ``ref`` (``wait_event`` / ``wait_stream``)
                 MARK     a label (``name``): a layer's forward begins (``ref`` 0) or ends (1)
    name         op name (aten op, collective op, or mark label), an index into ``names``
    sig          the op's input/output shapes and dtypes, an index into ``sigs``
    cls          cost class: VIEW (no kernel: views, allocations), GEMM, ATTENTION (flash
                 forward/backward; ``size`` = query length, CAUSAL flag for a square causal
                 call), ELEMENTWISE (everything else: bytes over memory bandwidth)
    flops        hardware FLOPs (torch's FlopCounterMode formulas)
    nbytes       compute: bytes read and written (every tensor argument and result); ISSUE: the
                 message bytes as nccl-tests count them (tspbench.dist.comm)
    stream       the CUDA stream (simulated GPU; 0 = the default stream, and on CPU)
    phase        forward, backward, optimizer, decode (tspbench.core.names.PHASES)
    group        ISSUE: index into ``groups`` (label and global ranks of the process group)
"""

from __future__ import annotations

import io
import json
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tspbench.core.errors import DamagedFileError
from tspbench.core.files import check_regular, write_atomic

COMPUTE, ISSUE, WAIT, RECORD, STREAM, MARK = range(6)
VIEW, GEMM, ATTENTION, ELEMENTWISE, COLLECTIVE = range(5)
CLASS_NAMES = ("view", "gemm", "attention", "elementwise", "collective")
ASYNC, CAUSAL, WEIGHTS = 1, 2, 4  # flags

EVENT = np.dtype(
    [
        ("kind", "u1"),
        ("name", "i4"),
        ("sig", "i4"),
        ("cls", "u1"),
        ("flags", "u1"),
        ("flops", "f8"),
        ("nbytes", "f8"),
        ("size", "i4"),
        ("stream", "i2"),
        ("phase", "i1"),
        ("group", "i2"),
        ("ref", "i4"),
    ]
)

GEMM_OPS = frozenset(("mm", "addmm", "addmm_", "bmm", "baddbmm", "_scaled_mm", "addbmm"))
ATTENTION_OPS = frozenset(
    (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_cudnn_attention_backward",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_efficient_attention_backward",
        "_flash_attention_forward",
        "_flash_attention_backward",
    )
)
# Ops that launch no kernel: they allocate, or make a view (the recorder also detects aliasing
# outputs from the op's schema).
NO_KERNEL = frozenset(
    (
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "resize_",
        "_unsafe_view",  # a view whose schema does not say so
        "lift_fresh",
    )
)


def op_class(name: str) -> int:
    """The cost class of an aten op by name (without the ``aten::`` prefix or overload)."""
    base = name.removeprefix("aten::").split(".")[0]
    if base in GEMM_OPS:
        return GEMM
    if base in ATTENTION_OPS:
        return ATTENTION
    if base in NO_KERNEL:
        return VIEW
    return ELEMENTWISE


@dataclass(frozen=True)
class Group:
    """A process group as the trace names it: its label (mesh axes and channel) and global ranks."""

    label: str
    ranks: tuple[int, ...]


@dataclass
class RankTrace:
    """One rank's step: the event rows and the tables their indices point into."""

    rank: int
    events: np.ndarray
    names: list[str]
    sigs: list[str] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)
    streams: list[str] = field(default_factory=lambda: ["default"])
    phases: tuple[str, ...] = ("forward", "backward", "optimizer", "decode")

    def __len__(self) -> int:
        return len(self.events)

    def tables(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "names": self.names,
            "sigs": self.sigs,
            "groups": [[g.label, list(g.ranks)] for g in self.groups],
            "streams": self.streams,
            "phases": list(self.phases),
        }

    @classmethod
    def from_tables(cls, tables: dict, events: np.ndarray) -> RankTrace:
        return cls(
            rank=tables["rank"],
            events=events,
            names=list(tables["names"]),
            sigs=list(tables["sigs"]),
            groups=[Group(label, tuple(ranks)) for label, ranks in tables["groups"]],
            streams=list(tables["streams"]),
            phases=tuple(tables["phases"]),
        )


def save_traces(path: Path, traces: list[RankTrace], meta: dict | None = None) -> Path:
    """All ranks' traces of one point in one compressed .npz (``meta``: what ran, how)."""
    arrays = {f"rank{t.rank}": t.events for t in traces}
    tables = {"ranks": [t.tables() for t in traces], "meta": meta or {}}
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays, tables=np.frombuffer(json.dumps(tables).encode(), dtype=np.uint8))
    return write_atomic(path, buf.getvalue())


def load_traces(path: Path) -> tuple[list[RankTrace], dict]:
    """The traces and meta written by ``save_traces``; a DamagedFileError naming ``path`` for
    anything else (empty, truncated, flipped bytes, a Chrome trace where the .npz belongs)."""
    check_regular(path)  # a FIFO would block, /dev/zero never end (#45)
    chrome = _chrome_trace(path)
    if path.is_file() and path.stat().st_size == 0:
        raise DamagedFileError(f"{path}: an empty file, not a tspbench trace (.npz)")
    if chrome:
        raise DamagedFileError(
            f"{path}: {chrome}, written for a viewer; replay needs the raw traces: write them with "
            "bench --trace X.npz (or run.trace: true, which stores trace.npz beside the record)"
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            tables = json.loads(data["tables"].tobytes().decode())
            traces = [RankTrace.from_tables(t, data[f"rank{t['rank']}"]) for t in tables["ranks"]]
            meta = tables["meta"]
    except FileNotFoundError:
        raise
    except (OSError, EOFError, KeyError, TypeError, ValueError, zipfile.BadZipFile, zlib.error) as exc:
        raise DamagedFileError(f"{path}: not a readable tspbench trace (.npz): {_reason(exc)}") from None
    return traces, meta


def _chrome_trace(path: Path) -> str:
    """'a Chrome trace (JSON)' if ``path`` starts like one (or its gzip), else ''."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return ""
    if head[:2] == b"\x1f\x8b":
        return "a gzip file (a Chrome trace .json.gz?)"
    if head.lstrip()[:1] in (b"{", b"["):
        return "a Chrome trace (JSON)"
    return ""


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    if not text or "pickle" in text:
        text = "empty or truncated" if isinstance(exc, EOFError) or not text else "not an .npz of arrays"
    return text
