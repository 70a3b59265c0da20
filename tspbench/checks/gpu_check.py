"""The GPU check: every path only a GPU node can exercise, on every GPU of the node, one command.

    tspbench gpu-check --out results/gpu_check        (or: make gpu-check)
    tspbench gpu-check --checks ops                    (one group of rows: the op-level check)

Each check writes one JSON record into the run's folder (``gpu_check_<device>_<time>/``) and one
row of its summary (``summary.json``, ``summary.md``, and the table the command prints):

    attention    one GPU: a query chunk at an offset (the split into an unmasked key prefix and
                 a causal square, tspbench.model.attention) in bf16, o, dq, dk, dv against float32
                 causal attention over the whole sequence: within 2e-2 (bf16 keeps 8 bits of
                 mantissa; the error of a 2,048-key softmax and its sums is ~1e-2); on CPU in
                 float64 within 4 (d + Sk) eps (``attention_tolerance``)
    calibrate    the node: the profile (GEMM, attention, HBM, collectives) the steps below are
                 predicted from, written beside the records
    validate/S   every strategy on W GPUs (NCCL), bf16 training: loss, logits and every gradient
                 on every rank against the single-device reference within 2e-2 (validate's bf16
                 tolerance), and the collectives counted and dispatched equal the analytic count
    overlap/tsp  TSP on W GPUs, one point timed with its weight transfers async and blocking:
                 the time the overlap saves (measured, no pass mark)
    memory/S     every strategy on W GPUs, the paper's 7B cut to 4 layers at 32K tokens, bf16
                 training: max_memory_allocated against the fake world's peak for the same
                 point (it must lie between it and 15% above: the fake world counts every live
                 tensor; the allocator adds its rounding, kernel workspaces and NCCL buffers),
                 reserved beside it, comm bytes equal to the model's, step time beside the time
                 model's (from the calibration above)
    attention/speed, memory/infer, step, decode/tpot
                 speed against SDPA's default, a flat inference peak, step time and MFU, decode
                 near its memory floor (tspbench.checks.gpu_rows)
    ops/S        dp, tsp and fsdp at world 1: each kind's replayed compute against the device
                 time torch.profiler gives it, within 10% (tspbench.checks.gpu_ops)

Each check's record is written the moment it ends and the summary after every check
(``finished`` false until the last), so a stopped run keeps what finished; a check that raises
or outlives its time limit (--check-seconds) is a failed row.

W is the largest power of two of GPUs visible (at most 8). On one GPU the checks that need a
group (validate, overlap) are skipped and say so; memory runs at world 1. ``--device cpu
--quick`` runs every check on 2 gloo ranks with the tiny model in float32 (the test suite does,
so the script cannot rot on machines without a GPU).
"""

from __future__ import annotations

import json
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from tspbench.analytic.profile_choice import HardwareChoice, choose_profile
from tspbench.calibrate.profile import calibrate
from tspbench.checks.gpu_ops import OP_STRATEGIES, op_level_check
from tspbench.checks.gpu_plan import Check, Plan, plan
from tspbench.checks.gpu_rows import (
    attention_speed_check,
    decode_tpot_check,
    device_profile,
    inference_memory_check,
    step_check,
)
from tspbench.core.files import interrupt_deferred, write_atomic
from tspbench.core.spec import Layout
from tspbench.measure.bench import bench
from tspbench.measure.env import environment
from tspbench.measure.fake import fake_bench
from tspbench.measure.validate import TOLERANCE, validate
from tspbench.model.layers import causal_attention
from tspbench.strategy import iter_strategies, layout_for

BF16_ATTENTION_TOLERANCE = 2e-2  # bf16 keeps 8 bits of mantissa; a 2,048-key softmax and its sums ~1e-2
ATTENTION_KEYS, ATTENTION_QUERIES = 2048, 512  # the check's key prefix and its query chunk at the end
ALLOCATOR_EXCESS = 0.15  # allocated may exceed the fake world's live tensors by this much


CHECK_GROUPS = ("attention", "calibrate", "speed", "validate", "overlap", "memory", "step", "decode", "ops")
NEEDS_PROFILE = ("overlap", "memory", "step", "decode", "ops")  # priced on what calibrate writes


def run(
    device: str,
    quick: bool,
    out: Path,
    strategies: list[str] | None = None,
    check_seconds: float = 900.0,
    groups: list[str] | None = None,
) -> dict[str, object]:
    """Every check in turn (one failing never hides the others), the per-strategy ones for
    ``strategies`` (default: every registered one), only those of ``groups`` (CHECK_GROUPS;
    default: all; calibrate joins any group priced on its profile); the summary, with where it
    is. Each check's record is written as soon as it ends and the summary after every check, so
    a run that is stopped (Ctrl-C, a job's time limit) keeps every finished check; a check that
    raises or runs past ``check_seconds`` is a failed row."""
    p = plan(device, quick)
    folder = out / f"gpu_check_{device}_{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    folder.mkdir(parents=True, exist_ok=True)
    summary = Summary(folder, device, p.world)
    chosen = set(CHECK_GROUPS if groups is None else groups)
    if chosen & set(NEEDS_PROFILE):
        chosen.add("calibrate")
    for group, name, check in checks(p, quick, folder / "profile.yaml", strategies):
        if group in chosen:
            summary.add(guarded(name, check, check_seconds))
    return summary.finish()


def checks(
    p: Plan, quick: bool, profile: Path, strategies: list[str] | None
) -> list[tuple[str, str, Callable[[], Check]]]:
    """(group, row name, the check) for every row of a run, in the order they run."""
    device = p.device
    names = [cls.name for cls in iter_strategies() if strategies is None or cls.name in strategies]

    def hardware() -> HardwareChoice | None:  # the profile calibrate wrote, once it has run
        return choose_profile(str(profile), device=device, measured=True) if profile.exists() else None

    def priced() -> HardwareChoice:  # calibrate's profile, else (it failed) the device's own
        return hardware() or device_profile(device)

    todo: list[tuple[str, str, Callable[[], Check]]] = [
        ("attention", "attention", lambda: attention_check(device)),
        ("calibrate", "calibrate", lambda: calibrate_check(p, quick, profile)),
        ("speed", "attention/speed", lambda: attention_speed_check(device, quick)),
    ]
    todo += [("validate", f"validate/{n}", lambda n=n: validate_check(p, n)) for n in names]
    if "tsp" in names:
        todo.append(("overlap", "overlap/tsp", lambda: overlap_check(p, priced())))
    todo += [("memory", f"memory/{n}", lambda n=n: memory_check(p, n, priced())) for n in names]
    todo.append(("memory", "memory/infer", lambda: inference_memory_check(p, priced())))
    todo.append(("step", "step", lambda: step_check(p, quick, hardware())))
    todo.append(("decode", "decode/tpot", lambda: decode_tpot_check(p, quick, hardware())))
    ops = [n for n in OP_STRATEGIES if n in names]
    return todo + [("ops", f"ops/{n}", lambda n=n: op_level_check(p, n, hardware())) for n in ops]


class Summary:
    """The run's records and summary on disk, rewritten after every check (module doc)."""

    def __init__(self, folder: Path, device: str, world: int) -> None:
        self.folder, self.device, self.world = folder, device, world
        self.checks: list[Check] = []
        self.start = time.perf_counter()

    def add(self, check: Check) -> None:
        """The check's record and the summary that lists it, both or (Ctrl-C before) neither."""
        name = f"{check.name.replace('/', '_')}.json"
        with interrupt_deferred():
            self.checks.append(check)
            write_atomic(self.folder / name, json.dumps(asdict(check), indent=2, default=str))
            self.write(finished=False)

    def write(self, finished: bool) -> dict[str, object]:
        summary = {
            "device": self.device,
            "world": self.world,
            "environment": environment(self.device),
            "seconds": time.perf_counter() - self.start,
            "finished": finished,
            "checks": [{k: v for k, v in asdict(c).items() if k != "details"} for c in self.checks],
            "path": str(self.folder),
        }
        write_atomic(self.folder / "summary.json", json.dumps(summary, indent=2, default=str))
        write_atomic(self.folder / "summary.md", summary_table(self.checks))
        return summary

    def finish(self) -> dict[str, object]:
        return self.write(finished=True)


class CheckTimeout(Exception):
    """A check ran past its time limit."""


def guarded(name: str, check: Callable[[], Check], seconds: float = 900.0) -> Check:
    """The check's outcome; a check that raises, or runs past ``seconds`` (where SIGALRM exists),
    is a failed row with its traceback, not a crash. Ctrl-C is not caught: it stops the run."""

    def expire(signum: int, frame: object) -> None:
        raise CheckTimeout(f"ran past its {seconds:.0f} s limit")

    alarm = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, expire) if alarm else None
    if alarm:
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return check()
    except Exception as exc:
        return Check(
            name, "failed", f"raised {type(exc).__name__}: {exc}"[:200], {"traceback": traceback.format_exc()}
        )
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def summary_table(checks: list[Check]) -> str:
    rows = ["| check | status | result |", "|---|---|---|"]
    rows += [f"| {c.name} | {c.status} | {c.summary} |" for c in checks]
    return "\n".join(rows) + "\n"


# ----------------------------------------------------------------------------- the checks


def attention_head_dim(device: str) -> int:
    return 128 if device == "cuda" else 32


def attention_tolerance(device: str) -> float:
    """bf16 on a GPU: BF16_ATTENTION_TOLERANCE. float64 on CPU, from the arithmetic: a sum of n
    terms carries at most n eps of relative rounding error (recursive summation); the forward
    composes a dot product over the head dim and a softmax sum over the keys, the backward two more
    of each (dP = dO V^T, then dQ = dS K and dK = dS^T Q): 4 (d + Sk) eps, 1.8e-12 here."""
    if device == "cuda":
        return BF16_ATTENTION_TOLERANCE
    return 4 * (attention_head_dim(device) + ATTENTION_KEYS) * torch.finfo(torch.float64).eps


def attention_check(device: str) -> Check:
    errors = offset_attention_errors(device, torch.bfloat16 if device == "cuda" else torch.float64)
    tol = attention_tolerance(device)
    worst = max(errors.values())
    status = "passed" if worst <= tol else "failed"
    return Check("attention", status, f"worst rel. error {worst:.1e} (tolerance {tol:.2g})", errors)


def offset_attention_errors(device: str, dtype: torch.dtype) -> dict[str, float]:
    """Relative errors of o, dq, dk, dv for a query chunk at an offset (Sq < Sk), against the
    matching rows of causal attention over the whole sequence in float32 (float64 on CPU)."""
    torch.manual_seed(0)
    b, heads, sk, sq, d = 1, 8, ATTENTION_KEYS, ATTENTION_QUERIES, attention_head_dim(device)
    q = torch.randn(b, heads, sq, d, device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(b, heads, sk, d, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
    grad = torch.randn(b, heads, sq, d, device=device, dtype=dtype)
    out = causal_attention(q, k, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    full_q = torch.zeros(b, heads, sk, d, device=device, dtype=wide)
    full_q[:, :, sk - sq :] = q.detach().to(wide)
    qf, kf, vf = (t.detach().to(wide).requires_grad_() for t in (full_q, k, v))
    ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True)[:, :, sk - sq :]
    rq, rk, rv = torch.autograd.grad(ref, (qf, kf, vf), grad.to(wide))

    def rel(a: torch.Tensor, b_: torch.Tensor) -> float:
        return float((a.detach().to(wide) - b_.detach()).norm() / b_.detach().norm())

    return {"o": rel(out, ref), "dq": rel(dq, rq[:, :, sk - sq :]), "dk": rel(dk, rk), "dv": rel(dv, rv)}


def calibrate_check(p: Plan, quick: bool, profile: Path) -> Check:
    ranks = max(p.world, 1)
    calibration = calibrate(ranks=ranks, model=p.memory.model, seq_len=p.memory.seq_len, quick=quick)
    profile.write_text(yaml.safe_dump(calibration.profile, sort_keys=False))
    c = calibration.profile
    summary = f"GEMM {c['gemm_tflops']:.3g} TFLOP/s, HBM {c['hbm_bandwidth_gbs']:.4g} GB/s on {ranks} rank(s)"
    return Check("calibrate", "passed", summary, {"profile": c, "warnings": calibration.warnings})


def validate_check(p: Plan, strategy: str) -> Check:
    name = f"validate/{strategy}"
    if p.world < 2:
        return Check(name, "skipped", "needs 2 or more GPUs: a group's NCCL collectives")
    cls = next(c for c in iter_strategies() if c.name == strategy)
    layout = layout_for(cls, p.world)
    result = validate(layout, p.validate, modes=("train",), timeout=900)
    errors = result["max_rel_err"]
    status = "passed" if result["passed"] else "failed"
    summary = (
        f"{layout.describe()}: worst rel. error {max(errors.values()):.1e} "
        f"(tolerance {TOLERANCE[p.validate.dtype]:g}); collectives = analytic: "
        f"{result['comm_matches_analytic'] and result['comm_matches_dispatch']}"
    )
    return Check(name, status, summary, result)


def overlap_check(p: Plan, hardware: HardwareChoice) -> Check:
    if p.world < 2:
        return Check("overlap/tsp", "skipped", "needs 2 or more GPUs: TSP's weight transfers")
    layout = Layout("tsp", tsp=p.world)
    timed = {
        overlap: bench(layout, p.memory.with_(overlap=overlap), hardware, steps=5, warmup=2)
        for overlap in (True, False)
    }
    if any(r["status"] != "completed" for r in timed.values()):
        return Check("overlap/tsp", "failed", "a run did not complete", {str(k): v for k, v in timed.items()})
    on, off = timed[True]["step_time_s"], timed[False]["step_time_s"]
    summary = (
        f"{layout.describe()}: step {on:.4g} s overlapped, {off:.4g} s blocking ({1 - on / off:+.1%} saved)"
    )
    return Check("overlap/tsp", "measured", summary, {"overlapped": timed[True], "blocking": timed[False]})


def memory_check(p: Plan, strategy: str, hardware: HardwareChoice) -> Check:
    name = f"memory/{strategy}"
    cls = next(c for c in iter_strategies() if c.name == strategy)
    layout = layout_for(cls, max(p.world, 1))
    measured = bench(layout, p.memory, hardware, steps=3, warmup=1, timeout=900)
    if measured["status"] != "completed":
        return Check(name, "failed", f"{layout.describe()}: {measured['status']}", {"measured": measured})
    simulated = choose_profile(None, device=p.memory.device, measured=False)  # the fake world's own
    fake = (
        fake_bench(layout, p.memory, simulated) if cls.fake_world_obstacle(layout, p.memory) is None else None
    )
    allocated, reserved = measured["peak_memory_bytes"], measured.get("peak_memory_reserved_bytes")
    comm_equal = measured["comm_bytes_per_step"] == measured["predicted_comm_bytes_per_step"]
    details = {"measured": measured, "fake": fake, "comm_equals_model": comm_equal}
    if fake is None or fake["status"] != "completed":
        return Check(
            name,
            "measured",
            f"{layout.describe()}: {allocated / 2**30:.2f} GiB allocated; no fake world",
            details,
        )
    executed = fake["peak_memory_bytes"]
    excess = allocated / executed - 1
    ok = 0 <= excess <= ALLOCATOR_EXCESS and comm_equal
    predicted = measured.get("predicted_step_time_s") or float("nan")
    summary = (
        f"{layout.describe()}: allocated {allocated / 2**30:.2f} GiB, fake world {executed / 2**30:.2f} "
        f"({excess:+.1%}), reserved {(reserved or 0) / 2**30:.2f}; comm = model: {comm_equal}; "
        f"step {measured['step_time_s']:.3g} s (model {predicted:.3g})"
    )
    return Check(name, "passed" if ok else "failed", summary, details)
