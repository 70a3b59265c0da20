"""``tspbench validate``: a strategy against the single-device reference, from identical weights.

Compared (relative error ||a - b|| / ||b||, worst over everything of a kind and over every rank:
each rank's own copy of a replicated parameter is checked, not rank 0's for all):
    loss               the global mean loss of one training step
    logits             [dp B, S, V] at the initial weights, gathered to full shape
    grads              every parameter's gradient, gathered to full shape
    params_after_step  every parameter after one AdamW step (in float64 only: the first AdamW
                       step moves each weight by about lr x sign(g), so in lower precision a
                       gradient element at rounding level flips a whole update)
    decode             every generated token's logits [dp B, V] (the prefill's at position S-1,
                       then each step's), gathered in sequence order; and the greedy tokens,
                       which must equal the reference's at every step on every rank
and the collectives each rank counted in the step (a decode run: phases forward and decode)
against the strategy's analytic count
(calls and message bytes per op, phase, group (mesh axes and channel) and group size must be
equal); what the dispatcher saw of the step (every c10d op, tspbench.dist.c10d_count, torch's
DDP and FSDP2 included) is held against the same analytic count. The parent holds every rank's
full-shape copies at once: validate is meant for the CPU presets.

Peak memory is that of a steady-state step: in training the second step, when the AdamW state
exists (the first step's peak is reported beside it); in prefill the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from tspbench.core.records import busiest_comm
from tspbench.core.spec import Layout, Workload
from tspbench.dist.comm import CommRecord, summarize
from tspbench.dist.launch import launch
from tspbench.measure.runner import RankRun
from tspbench.model.reference import Reference, single_threaded
from tspbench.strategy import check_layout

TOLERANCE = {"float64": 1e-9, "float32": 1e-5, "bfloat16": 2e-2}


def rel_err(a: Tensor, b: Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if a.shape != b.shape:
        return float("inf")
    denom = b.norm()
    return float((a - b).norm() / denom) if denom > 0 else float((a - b).norm())


def worst(a: dict[str, Tensor], b: dict[str, Tensor]) -> tuple[float, str]:
    missing = set(a) ^ set(b)
    if missing:
        return float("inf"), f"parameters not matched: {sorted(missing)[:5]}"
    errs = {name: rel_err(a[name], b[name]) for name in b}
    name = max(errs, key=errs.__getitem__)
    return errs[name], name


@dataclass
class ModeResult:
    comm: list[CommRecord]
    analytic: list[CommRecord]
    peak_bytes: list[int]
    param_bytes: list[int]
    errors: dict[str, float]
    comm_ok: bool  # every rank's counted collectives equal the analytic count
    # ... and so does what the dispatcher saw (every c10d op of the step, whoever issued it): for
    # torch's wrappers (DDP, FSDP2) the counted ones are these very records, so only a comparison
    # with the analytic count, derived from the strategy's traffic, is independent of them
    dispatch_ok: bool
    worst_param: str = ""
    first_step_peak_bytes: list[int] = field(default_factory=list)
    tokens_ok: bool = True  # decode: the same greedy tokens as the reference, every step, every rank

    @property
    def comm_bytes(self) -> float:
        return sum(r.bus_bytes for r in self.comm)


def _rank_validate(layout: Layout, workload: Workload) -> dict:
    """Every rank's full-shape logits (and loss, gradients, parameters after one step), counted
    collectives and peak memory (a steady-state step's; in training also the first step's)."""
    run = RankRun(layout, workload)
    out: dict = {"rank": dist.get_rank() if dist.is_initialized() else 0}
    if workload.mode == "train":
        with torch.no_grad():
            out["logits"] = run.strategy.full_logits(run.strategy.logits(run.model, run.batch)).cpu()
        first = run.measured_step()
        out.update(
            loss=first.loss,
            grads=_copies(run.strategy.full_tensors(run.model, grads=True)),
            params=_copies(run.strategy.full_tensors(run.model)),  # replicated ones are views
            first_step_peak=first.memory.peak_bytes,
        )
        steady = run.measured_step()  # AdamW state exists from here on
    elif workload.mode == "decode":
        first = steady = run.measured_step()
        s, decoded = run.strategy, first.output
        out["tokens"] = torch.stack([s.gather_decoded(t[:, 0], prefill=False) for t in decoded.tokens]).cpu()
        logits = [s.gather_decoded(x, prefill=i == 0) for i, x in enumerate(decoded.logits)]
        out["logits"] = torch.stack(logits).cpu()  # [N + 1, dp B, V]
    else:
        first = steady = run.measured_step()
        out["logits"] = run.strategy.full_logits(first.output).cpu()
    out.update(
        comm=first.comm,
        c10d=first.c10d,
        peak=steady.memory.peak_bytes,
        param_bytes=steady.memory.by_category.get("parameters", 0),
    )
    return out


def _copies(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Own CPU copies (they go back to the parent by pickle; replicated ones are views)."""
    return {name: t.detach().to("cpu", copy=True) for name, t in tensors.items()}


def worst_over_ranks(ranks: list[dict], key: str, reference: dict[str, Tensor]) -> tuple[float, str]:
    """The worst relative error of any rank's ``key`` tensors against ``reference``, and where."""
    worst_err, where = -1.0, ""
    for r in ranks:
        err, name = worst(r[key], reference)
        if err > worst_err:
            worst_err, where = err, f"{name} on rank {r['rank']}"
    return worst_err, where


def validate_mode(layout: Layout, workload: Workload, timeout: float = 600.0) -> ModeResult:
    """Run one mode of ``workload`` under ``layout`` and against the reference, on every rank."""
    cls = check_layout(layout, workload)
    with single_threaded():
        reference = Reference(workload, layout.data_degree * workload.batch)
        if workload.mode == "decode":
            ref_tokens, ref_logits = reference.decode()
        else:
            ref_logits = reference.logits()
        if workload.mode == "train":
            ref_loss = reference.train_step()
    ranks = launch(
        _rank_validate, layout.world_size, layout, workload, device=workload.device, timeout=timeout
    )
    if workload.mode == "decode":  # the worst step's logits
        errors = {
            "logits": max(rel_err(x, y) for r in ranks for x, y in zip(r["logits"], ref_logits, strict=True))
        }
    else:
        errors = {"logits": max(rel_err(r["logits"], ref_logits) for r in ranks)}
    tokens_ok = workload.mode != "decode" or all(torch.equal(r["tokens"], ref_tokens) for r in ranks)
    worst_param = ""
    if workload.mode == "train":
        errors["loss"] = max(rel_err(torch.tensor(r["loss"], dtype=torch.float64), ref_loss) for r in ranks)
        errors["grads"], worst_param = worst_over_ranks(ranks, "grads", reference.tensors(grads=True))
        after, worst_after = worst_over_ranks(ranks, "params", reference.tensors())
        if workload.dtype == "float64":
            errors["params_after_step"] = after
        worst_param = f"{worst_param} (after step: {worst_after}, rel err {after:.1e})"
    analytic = cls.comm_volume(layout, workload)
    return ModeResult(
        comm=busiest_comm(ranks),
        analytic=analytic,
        peak_bytes=[r["peak"] for r in ranks],
        param_bytes=[r["param_bytes"] for r in ranks],
        errors=errors,
        comm_ok=all(summarize(r["comm"]) == summarize(analytic) for r in ranks),
        dispatch_ok=all(summarize(r["c10d"]) == summarize(analytic) for r in ranks),
        worst_param=worst_param,
        first_step_peak_bytes=[r.get("first_step_peak", r["peak"]) for r in ranks],
        tokens_ok=tokens_ok,
    )


def validate(
    layout: Layout, workload: Workload, modes: tuple[str, ...] = ("train", "infer"), timeout: float = 600.0
) -> dict:
    """The `tspbench validate` record: errors per kind (worst over modes and ranks), comm, memory,
    passed."""
    check_layout(layout, workload)
    tol = TOLERANCE[workload.dtype]

    def of_mode(m: str) -> Workload:  # decode_tokens belongs to decode mode only
        return workload.with_(mode=m, decode_tokens=workload.decode_tokens if m == "decode" else 0)

    per_mode = {m: validate_mode(layout, of_mode(m), timeout) for m in modes}
    max_err: dict[str, float] = {}
    for result in per_mode.values():
        for key, err in result.errors.items():
            max_err[key] = max(max_err.get(key, 0.0), err)
    comm_ok = all(r.comm_ok for r in per_mode.values())
    dispatch_ok = all(r.dispatch_ok for r in per_mode.values())
    tokens_ok = all(r.tokens_ok for r in per_mode.values())
    main = per_mode.get("train") or next(iter(per_mode.values()))
    return {
        "strategy": layout.strategy,
        "layout": layout.describe(),
        **layout.degrees(),
        "world_size": layout.world_size,
        "model": workload.model.name,
        "seq_len": workload.seq_len,
        "batch": workload.batch,
        "dtype": workload.dtype,
        "recompute": workload.recompute,
        "modes": list(modes),
        "tolerance": tol,
        "max_rel_err": max_err,
        "worst_grad_param": main.worst_param,
        "comm_bytes_per_step": main.comm_bytes,
        "comm_bytes_per_step_by_mode": {m: r.comm_bytes for m, r in per_mode.items()},
        "comm_matches_analytic": comm_ok,
        "comm_matches_dispatch": dispatch_ok,
        "tokens_match_reference": tokens_ok,
        "decode_tokens": workload.decode_tokens if "decode" in modes else 0,
        "comm_counted": {m: _summary_json(r.comm) for m, r in per_mode.items()},
        "comm_analytic": {m: _summary_json(r.analytic) for m, r in per_mode.items()},
        "ranks_compared": layout.world_size,
        "peak_memory_bytes": max(main.peak_bytes),
        "peak_memory_bytes_per_rank": main.peak_bytes,
        "peak_memory_step": "second (AdamW state exists)" if main is per_mode.get("train") else "first",
        "peak_memory_first_step_bytes": max(main.first_step_peak_bytes),
        "parameter_bytes_per_rank": main.param_bytes,
        "passed": comm_ok and dispatch_ok and tokens_ok and all(v <= tol for v in max_err.values()),
    }


def _summary_json(records: list[CommRecord]) -> list[dict]:
    return [
        {"op": op, "phase": phase, "group": g, "group_size": n, "calls": calls, "msg_bytes": nbytes}
        for (op, phase, g, n), (calls, nbytes) in summarize(records).items()
    ]
