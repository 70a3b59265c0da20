"""The figures ``tspbench calibrate`` takes from a profiled single-device step of the model, and
the launch costs of a GPU: element-wise passes, the timeline's per-op terms, kernel launches.
``Recorder`` keeps each figure's provenance and the warnings of a calibration."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tspbench.calibrate import launches, opcosts, profiled
from tspbench.calibrate.probes import Rate
from tspbench.core.progress import Progress
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.dist.launch import launch
from tspbench.strategy import Strategy, check_layout

NOISY_SPREAD = 0.20
# A GPU's profiled step takes seconds (one H200, the 7B cut to 4 layers at 32K tokens: 7 s for the
# element-wise passes, 14 s for the per-op costs, each in a fresh process); a rank still running
# after this long is stuck (one hung past 400 s inside gpu-check at 887f825), not slow.
GPU_TIMEOUT_S = 60.0


def step_timeout(cpu_s: float = 600.0) -> float:
    """How long a profiled step's rank may run: GPU_TIMEOUT_S on a GPU, ``cpu_s`` on a CPU."""
    return GPU_TIMEOUT_S if torch.cuda.is_available() else cpu_s


@dataclass
class Recorder:
    """Provenance, warnings and progress of one calibration."""

    provenance: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    progress: Progress = field(default_factory=Progress)

    def step(self, what: str) -> None:
        """One of ``calibration_steps`` is over; ``what`` names it."""
        self.progress.finished("completed", what)

    def note(self, key: str, rate: Rate, how: str, scale: float = 1.0) -> float:
        self.provenance[key] = f"measured: {how}; median of {rate.repeats}, spread {rate.spread:.0%}"
        if rate.spread > NOISY_SPREAD:
            self.warnings.append(f"{key}: repeats differ by {rate.spread:.0%} (busy host?): {how}")
        return round(rate.value * scale, 6)


def step_figures(
    rec: Recorder, model: ModelConfig, seq_len: int, ranks: int, bandwidth: float, repeats: int, quick: bool
) -> dict:
    """Every figure of this module for a calibration of ``model`` at ``seq_len`` over ``ranks``
    ranks. On a GPU a group that cannot be measured (its rank fails, or outlives GPU_TIMEOUT_S)
    is a warning and the profile goes on without it; on a CPU it is an error. The calibration's
    cached GPU memory is released first: the profiled steps run in processes of their own."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()
    local, profiled = seq_len // ranks, seq_len // ranks if cuda else seq_len
    groups = [
        ("elementwise_passes", lambda: {"elementwise_passes": elementwise_passes(rec, model, local, bandwidth,
                                                                                  repeats)}),
        ("per-op costs", lambda: timeline_costs(rec, model, profiled, repeats, ranks if not quick else 1)),
    ]  # fmt: skip
    if cuda:
        groups.append(("kernel launches", lambda: launch_figures(rec, repeats)))
    out: dict = {}
    for what, measure in groups:
        try:
            out |= measure()
        except (RuntimeError, TimeoutError) as exc:  # a rank's error, a launch's timeout, CUDA's errors
            if not cuda:
                raise
            rec.warnings.append(f"{what}: not measured ({type(exc).__name__}: {exc})"[:300])
            rec.step(f"{what} (not measured)")
    return out


def elementwise_passes(
    rec: Recorder, model: ModelConfig, tokens: int, bandwidth: float, repeats: int
) -> dict:
    """Passes over a block's activations (per layer) and the parameters that a single-device
    step's element-wise time is worth at ``bandwidth`` (tspbench.analytic.timing's terms)."""
    seconds = launch(
        profiled.elementwise_rank, 1, model, tokens, repeats, *device_dtype(), timeout=step_timeout()
    )[0]
    rec.step("element-wise passes of a step")
    device, dtype = device_dtype()  # the bytes of the step that ran (bf16 on a GPU), not float32's
    sized = {mode: single_device(model, tokens, mode, dtype, device) for mode in ("train", "infer")}
    basis = {mode: model.n_layers * s.elementwise_layer_bytes() for mode, s in sized.items()}
    basis["optimizer"] = sized["train"].predict_memory().persistent["parameters"]
    what = {"train": "train step", "infer": "forward", "optimizer": "AdamW step"}
    out = {k: rec.note(f"elementwise_passes.{k}", seconds[k], what[k], bandwidth / basis[k]) for k in what}
    how = (
        f"measured: element-wise ops of {model.name} at {tokens} tokens on one rank (torch.profiler self "
        "time of every op but GEMMs and attention), as passes at hbm_bandwidth_gbs"
    )
    rec.provenance["elementwise_passes"] = how
    return {k: round(v, 2) for k, v in out.items()}


def timeline_costs(rec: Recorder, model: ModelConfig, tokens: int, repeats: int, ranks: int) -> dict:
    """The timeline's per-op terms, from a profiled single-device step (tspbench.calibrate.opcosts),
    and with ``ranks`` the share of each kind when that many ranks run the same step at once
    (``--quick`` leaves that out: the probes' contention stands in)."""
    costs = launch(
        opcosts.timeline_costs_rank, 1, model, tokens, repeats, *device_dtype(), timeout=step_timeout(1800)
    )[0]
    single = costs.pop("kinds")
    if ranks > 1:
        workload = Workload(model, 1, tokens, "train", dtype="float32")
        together = launch(
            opcosts.profiled_kinds, ranks, Layout("dp", dp=ranks), workload, max(repeats, 5), timeout=1800
        )
        shares = opcosts.kind_shares(single, together)
        costs["step_contention"] = {kind: {1: 1.0, ranks: share} for kind, share in shares.items()}
        rec.provenance["step_contention"] = (
            f"measured: each kind's self time in a training step of {model.name} at {tokens} tokens on one "
            f"rank alone, over the same on each of {ranks} ranks at once (dp {ranks}, torch.profiler)"
        )
    rec.step("per-op costs of a profiled step")
    own = "device time" if torch.cuda.is_available() else "CPU time"
    whole = "each traced op timed whole, with the ops it calls"
    how = f"{model.name} at {tokens} tokens on one rank, medians of {repeats} profiled steps"
    host = (
        f"measured: a step's wall time less its traced ops' aten {own}, per traced op (Python, autograd, "
        f"dispatch, launch; {model.name} at {min(tokens, opcosts.HOST_TOKENS)} tokens on one rank, median "
        f"of {max(repeats, opcosts.HOST_REPEATS)} steps)"
    )
    rec.provenance |= {
        "op_overhead_us": f"measured: per-call time of the element-wise ops of a training step ({how}; "
        f"torch.profiler {own} against bytes, least squares; {whole}), tspbench.calibrate.opcosts",
        "host_overhead_us": host,
        "step_gemm_tflops": f"measured: FLOPs / {own} of the step's GEMMs ({how})",
        "elementwise_by_op": f"measured: bytes / {own} of each element-wise op that moves at least "
        f"1 MiB a call ({how}; {whole})",
    }
    if torch.cuda.is_available():  # the host runs ahead of the GPU: its time per op is a launch cost
        costs["launch_us"], costs["host_overhead_us"] = costs["host_overhead_us"], 0.0
        rec.provenance["launch_us"] = (
            host + ": what the GPU waits per op where the host is behind (eager decode)"
        )
        rec.provenance["host_overhead_us"] = (
            "0: on a GPU the host runs ahead of the device (launch_us: its cost)"
        )
    return costs


def device_dtype() -> tuple[str, str]:
    """The device and dtype a profiled single-device step runs with: bf16 on a GPU."""
    return ("cuda", "bfloat16") if torch.cuda.is_available() else ("cpu", "float32")


def launch_figures(rec: Recorder, repeats: int) -> dict:
    """Launch figures on this GPU (tspbench.calibrate.launches), in this process."""
    costs = launches.launch_costs(repeats)
    rec.step("kernel launches")
    how = (
        f"{launches.KERNELS} in-place adds on one element, median of {repeats}; the same launched "
        f"eagerly: {costs.pop('eager_kernel_us')} us each"
    )
    rec.provenance |= {
        "graph_kernel_us": f"measured: per kernel of a replayed CUDA graph of {launches.KERNELS} ({how})",
        "graph_replay_us": f"measured: per replay of a CUDA graph of one kernel ({how})",
    }
    return costs


def single_device(
    model: ModelConfig, tokens: int, mode: str, dtype: str = "float32", device: str = "cpu"
) -> Strategy:
    """The analytic sizes of one rank holding the whole model (DP over a world of one), in the
    ``dtype`` its step runs in (element-wise passes are seconds over these bytes)."""
    workload = Workload(model, 1, tokens, mode, "none", dtype, device)
    return check_layout(Layout("dp"), workload).for_analysis(Layout("dp"), workload)
