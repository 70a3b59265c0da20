"""The local and predict executors: points measured (or predicted) one after another, here
(the fake executor, tspbench.sweep.fake, runs its points through ``run_local`` too).

``measurer`` runs a point through ``tspbench.measure.bench.bench``, which turns OOM, a
crashing rank and a hang into statuses; anything else that escapes is recorded ``failed``
with its traceback. Ctrl-C puts the running point back to pending. One sweep per results folder
at a time (``sweep_lock``): a second would rerun the first one's running point.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tspbench.analytic.cost import cost_fields
from tspbench.analytic.decode import decode_record
from tspbench.analytic.predict import predict_record
from tspbench.analytic.profile_choice import HardwareChoice, choose_profile
from tspbench.core.errors import UsageError
from tspbench.core.progress import Progress
from tspbench.core.units import excerpt, format_bytes
from tspbench.measure.bench import bench
from tspbench.measure.env import device_name, environment, record_fields
from tspbench.sweep.owner import GONE, owner_state, this_process
from tspbench.sweep.points import Point
from tspbench.sweep.store import Store, exclusive, now, read_json

Measure = Callable[[Point], dict[str, Any]]


def measurer(experiment_hardware: str | None, store: Store | None = None) -> Measure:
    """Points measured on this machine (bench() turns OOM, crashes and hangs into statuses), each
    priced on its profile (tspbench.analytic.profile_choice: the experiment's ``hardware``, else
    its device's): the model's prediction beside it, the traced step's replay, the MFU; with
    ``run.trace`` the traces are kept in the point's folder."""

    def measure(point: Point) -> dict[str, Any]:
        m = point.config["measure"]
        steps, warmup, repeats, capacity = m["steps"], m["warmup"], m["repeats"], m["capacity_bytes"]
        trace = point.trace_path(store.run_dir(point.run_id)) if store is not None else None
        device = point.workload.device
        choice = choose_profile(
            None,
            device=device,
            device_name=device_name(device),
            experiment=experiment_hardware,
            measured=True,
        )
        return bench(
            point.layout, point.workload, choice, steps, warmup, repeats, capacity, point.timeout, trace
        )

    return measure


def predictor(choice: HardwareChoice) -> Measure:
    """The analytic model on the sweep's profile as a measure function (decode points: its decode
    model)."""

    def predict(point: Point) -> dict[str, Any]:
        model = decode_record if point.workload.mode == "decode" else predict_record
        record = {**point.base_record(), **model(point.layout, point.workload, choice.hardware)}
        return {**record, "hardware_choice": choice.reason, **cost_fields(record, choice.hardware)}

    return predict


@contextmanager
def sweep_lock(store: Store) -> Iterator[None]:
    """One sweep per experiment folder at a time (a lock left by a killed sweep, whose process
    is gone, is taken over)."""
    store.root.mkdir(parents=True, exist_ok=True)
    lock = store.root / ".sweep.lock"
    holder = {**this_process(), "since": now()}

    def abandoned() -> bool:
        return owner_state(read_json(lock) or {}) == GONE

    if not exclusive(lock, holder, abandoned):
        raise UsageError(
            f"{store.root}: another sweep is running it ({read_json(lock)}); wait or remove {lock}"
        )
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def run_local(
    points: list[Point],
    store: Store,
    measure: Measure,
    executor: str = "local",
    progress: Progress | None = None,
    choice: HardwareChoice | None = None,
) -> None:
    """Measure ``points`` one after another. Ctrl-C puts the current point back to pending.
    ``choice``: the predict executor's profile, stored in each point's environment."""
    progress = progress or Progress()
    env = _environment(points, executor, choice)
    for point in points:
        rid = point.run_id
        store.queue(rid, executor=executor)
        attempt = store.start(rid)  # records this process as the point's owner
        if env:
            store.write_env(rid, env)
        progress.update(1, point.label)
        text = ""
        try:
            record = measure(point)
        except KeyboardInterrupt:
            store.update(rid, lambda s: {**s, "status": "pending", "error": "interrupted"} if s else None)
            raise
        except Exception as exc:  # bench turns rank failures into records; this is anything else
            text = traceback.format_exc()
            # the exception first (what status and the progress line show), then where it rose (#45)
            headline = (f"{type(exc).__name__}: {exc}".splitlines() or [""])[0][:500]
            record = {**point.base_record(), "status": "failed", "error": excerpt(f"{headline}\n{text}")}
        if env and not any(k.startswith("env_") for k in record):  # projected, or failed before bench
            record.update(record_fields(env))
        status = record["status"]
        store.finish(rid, status, record)
        if status != "completed" and (text or record.get("error")):
            store.write_log(rid, f"attempt-{attempt}.log", text or str(record["error"]))
        progress.finished(status, f"{point.label}{_headline(record)}")
        progress.update(0)
    progress.close()


def _environment(points: list[Point], executor: str, choice: HardwareChoice | None) -> dict[str, Any]:
    """The environment record stored with each point; for a projection, the model's code and
    the hardware profile it assumed."""
    if not points:
        return {}
    if executor == "fake":
        return {
            **environment("cpu"),
            "executor": "fake",
            "device": points[0].workload.device,
            "backend": "fake",
        }
    if executor != "predict":
        return environment(points[0].workload.device)
    profile = choice.hardware.to_dict() if choice else None
    return {**environment("cpu"), "executor": "predict", "hardware_profile": profile}


def _headline(record: dict[str, Any]) -> str:
    if record.get("status") != "completed":
        error = str(record.get("error") or "").strip()
        return f"  {error.splitlines()[0][:100]}" if error else ""
    out = ""
    if record.get("step_time_s") is not None:
        out += f"  step {record['step_time_s'] * 1e3:.1f} ms"
    if record.get("peak_memory_bytes") is not None:
        out += f"  peak {format_bytes(record['peak_memory_bytes'])}"
    return out
