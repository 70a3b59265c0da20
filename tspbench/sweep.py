"""``tspbench run`` and ``tspbench status``: run an experiment's points into the results store.

    tspbench run EXPERIMENT.yaml [--executor local|slurm|predict] [--cluster NAME]
                 [--results DIR] [--set key.path=value ...] [--dry-run] [--retry-failed]
    tspbench status RESULTS_DIR

Everything is validated first (experiment, cluster profile, executor); only then is anything
written. Completed points are skipped, so a killed sweep resumes where it stopped; finished
points that did not complete (oom, failed, timeout, cancelled) are results too and rerun only
with ``--retry-failed``. Executors: ``local`` measures points one after another on this machine
through ``tspbench.bench.bench``; ``slurm`` submits them as submitit job arrays
(``tspbench.slurm``); ``predict`` asks the analytic model (``tspbench.analytic``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tspbench.cli import UsageError
from tspbench.experiment import EXECUTORS, Experiment, Point, Skipped, expand, load_experiment
from tspbench.progress import OK_STATUSES, Progress
from tspbench.results import Store, excerpt, now, read_json, status_table, write_json, write_tables

Measure = Callable[[Point], dict[str, Any]]


@dataclass
class Plan:
    """A validated run: the experiment, its executor and cluster, and its points."""

    experiment: Experiment
    executor: str
    points: list[Point]
    skipped: list[Skipped]
    profile: Any = None  # tspbench.slurm.Profile when a cluster is named

    @property
    def gpus_per_node(self) -> int | None:
        return self.profile.gpus_per_node if self.profile is not None else None


def make_plan(path: str, overrides: list[str], executor: str | None, cluster: str | None) -> Plan:
    """Load and validate everything a run needs; raises UsageError (exit 2) on bad input."""
    exp = load_experiment(path, overrides)
    executor = executor or exp.executor
    cluster = cluster or exp.cluster
    profile = None
    if executor == "slurm" and cluster is None:
        raise UsageError(
            f"{exp.path}: the slurm executor needs a cluster profile: --cluster NAME or cluster:"
        )
    if cluster is not None and executor != "predict":
        from tspbench.slurm import load_profile

        profile = load_profile(cluster)
    if executor == "predict" and exp.hardware is None:
        raise UsageError(f"{exp.path}: the predict executor needs a hardware profile: set hardware:")
    method = "predict" if executor == "predict" else "measure"
    points, skipped = expand(exp, method, exp.hardware)
    if executor == "slurm":
        profile.check_points(points, exp.path)
    if executor == "predict":
        _check_predictor(exp, points)
    return Plan(exp, executor, points, skipped, profile)


def _check_predictor(exp: Experiment, points: list[Point]) -> None:
    """Predict the first point now (it is instant), so a bad hardware name fails before the run."""
    predict = predictor(exp.hardware or "")
    try:
        predict(points[0])
    except Exception as exc:
        raise UsageError(f"{exp.path}: hardware {exp.hardware!r}: {str(exc).splitlines()[0]}") from None


def predictor(hardware: str) -> Measure:
    """The analytic model as a measure function; UsageError if it is not available."""
    try:
        from tspbench.analytic import predict_record
    except ImportError as exc:
        raise UsageError(f"predict executor unavailable: {exc}") from None

    def predict(point: Point) -> dict[str, Any]:
        return {**base_record(point), **predict_record(point.layout, point.workload, hardware)}

    return predict


def base_record(point: Point) -> dict[str, Any]:
    """The identifying part of a record, as bench writes it (for points that never measured)."""
    from tspbench.bench import point_record

    m = point.config["measure"]
    return {**point_record(point.layout, point.workload), **m}


def measure_local(point: Point) -> dict[str, Any]:
    """One point on this machine: bench() turns OOM, crashes and hangs into statuses."""
    from tspbench.bench import bench

    m = point.config["measure"]
    return bench(
        point.layout,
        point.workload,
        m["steps"],
        m["warmup"],
        m["repeats"],
        m["capacity_bytes"],
        point.timeout,
    )


def point_label(point: Point) -> str:
    from tspbench.experiment import describe

    return f"{point.run_id} {describe(point.config)}"


# ----------------------------------------------------------------------------- local executor


@contextmanager
def sweep_lock(store: Store) -> Any:
    """One local sweep per experiment folder at a time: a second would rerun the first one's
    running point (a lock left by a killed sweep, whose pid is gone, is taken over)."""
    store.root.mkdir(parents=True, exist_ok=True)
    lock = store.root / ".sweep.lock"
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            holder = read_json(lock) or {}
            if holder.get("host") == socket.gethostname() and not _alive(holder.get("pid", -1)):
                lock.unlink(missing_ok=True)  # its sweep was killed
                continue
            raise UsageError(
                f"{store.root}: another sweep is running it ({holder}); wait or remove {lock}"
            ) from None
    else:
        raise UsageError(f"{store.root}: could not take {lock}")
    os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": now()}).encode())
    os.close(fd)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def select(points: list[Point], store: Store, retry_failed: bool) -> list[Point]:
    """Write every point's folder (point.json, pending) and return those that need a run."""
    for point in points:
        store.prepare(point.to_json())
    return [p for p in points if store.needs_run(p.run_id, retry_failed)]


def run_local(
    points: list[Point],
    store: Store,
    measure: Measure = measure_local,
    executor: str = "local",
    progress: Progress | None = None,
) -> None:
    """Measure ``points`` one after another. Ctrl-C puts the current point back to pending."""
    from tspbench.env import environment

    progress = progress or Progress(len(points))
    env = environment(points[0].workload.device) if points else {}
    if executor == "predict":  # the environment of a projection is the model's code and its hardware
        from tspbench.hardware import load_hardware

        hardware = points[0].config.get("hardware") if points else None
        env = {
            **environment("cpu"),
            "executor": "predict",
            "hardware_profile": load_hardware(hardware).to_dict() if hardware else None,
        }
    for point in points:
        rid = point.run_id
        store.queue(rid, executor=executor)
        attempt = store.start(rid, host=socket.gethostname(), pid=os.getpid())
        if env:
            store.write_env(rid, env)
        progress.update(1, point_label(point))
        text = ""
        try:
            record = measure(point)
        except KeyboardInterrupt:
            store.update(rid, lambda s: {**s, "status": "pending", "error": "interrupted"} if s else None)
            raise
        except Exception:  # bench turns rank failures into records; this is anything else
            text = traceback.format_exc()
            record = {**base_record(point), "status": "failed", "error": excerpt(text)}
        status = record["status"]
        store.finish(rid, status, record)
        if status != "completed" and (text or record.get("error")):
            store.write_log(rid, f"attempt-{attempt}.log", text or str(record["error"]))
        progress.finished(status, f"{point_label(point)}{_headline(record)}")
        progress.update(0)
    progress.close()


def _headline(record: dict[str, Any]) -> str:
    if record.get("status") != "completed":
        return (
            f"  {str(record.get('error') or '').strip().splitlines()[0][:100]}" if record.get("error") else ""
        )
    out = ""
    if record.get("step_time_s") is not None:
        out += f"  step {record['step_time_s'] * 1e3:.1f} ms"
    if record.get("peak_memory_bytes") is not None:
        out += f"  peak {record['peak_memory_bytes'] / 2**20:.1f} MiB"
    return out


# ----------------------------------------------------------------------------- the commands


@contextmanager
def interrupt_on_sigterm() -> Any:
    """SIGTERM (a killed job, a closed terminal) unwinds like Ctrl-C, so ranks are killed too."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def cmd_run(args: argparse.Namespace) -> int:
    plan = make_plan(args.experiment, args.set or [], args.executor, args.cluster)
    store = Store(Path(args.results) / plan.experiment.name)
    if args.dry_run:
        print_plan(plan, store, args.retry_failed)
        return 0
    if plan.executor == "local":
        check_local_devices(plan)
    try:
        with interrupt_on_sigterm(), sweep_lock(store) if plan.executor != "slurm" else nullcontext():
            todo = select(plan.points, store, args.retry_failed)
            write_json(store.root / "experiment.json", _experiment_json(plan))
            print(
                f"{plan.experiment.name}: {len(plan.points)} points, {len(plan.points) - len(todo)} already "
                f"done, {len(todo)} to run with the {plan.executor} executor -> {store.root}"
            )
            execute(plan, todo, store)
    except KeyboardInterrupt:
        print(f"\ninterrupted; `tspbench run {args.experiment}` resumes where it stopped", file=sys.stderr)
        return 130
    frame = write_tables(store.root)
    return print_summary(frame, plan.points, store)


def execute(plan: Plan, todo: list[Point], store: Store) -> None:
    """Hand the points to the plan's executor."""
    if plan.executor == "slurm":
        from tspbench.slurm import run_slurm

        run_slurm(todo, store, plan.profile, Progress(len(todo)))
        return
    measure = measure_local if plan.executor == "local" else predictor(plan.experiment.hardware or "")
    run_local(todo, store, measure, plan.executor, Progress(len(todo)))


def check_local_devices(plan: Plan) -> None:
    """CUDA points need one visible GPU per rank on this machine."""
    cuda = [p for p in plan.points if p.config["workload"]["device"] == "cuda"]
    if not cuda:
        return
    import torch

    need, have = max(p.world_size for p in cuda), torch.cuda.device_count()
    if have < need:
        raise UsageError(
            f"{plan.experiment.path}: device cuda needs {need} GPUs on this machine for the local executor, "
            f"{have} visible; use --executor slurm or predict, or --set settings.device=cpu"
        )


def _experiment_json(plan: Plan) -> dict[str, Any]:
    exp = plan.experiment
    return {
        "name": exp.name,
        "file": str(exp.path),
        "overrides": list(exp.overrides),
        "executor": plan.executor,
    }


def plan_frame(plan: Plan, store: Store) -> pd.DataFrame:
    rows = []
    for p in plan.points:
        layout, w = p.config["layout"], p.config["workload"]
        nodes = p.nodes(plan.gpus_per_node) if plan.gpus_per_node else 1
        rows.append(
            {
                "run_id": p.run_id,
                "strategy": layout["strategy"],
                **{a: layout[a] for a in ("dp", "tp", "sp", "tsp")},
                "world": p.world_size,
                "nodes": nodes,
                **{k: w[k] for k in ("seq_len", "batch", "mode", "recompute", "dtype", "device")},
                "stored": store.state(p.run_id) or "-",
            }
        )
    return pd.DataFrame(rows)


def print_plan(plan: Plan, store: Store, retry_failed: bool) -> None:
    """--dry-run: every point with its id, world size and nodes; the invalid ones with why."""
    exp = plan.experiment
    todo = sum(store.needs_run(p.run_id, retry_failed) for p in plan.points)
    where = f", cluster {plan.profile.name} ({plan.gpus_per_node} per node)" if plan.profile else ""
    print(f"{exp.name}: {exp.description}" if exp.description else exp.name)
    print(f"{len(plan.points)} points ({todo} would run), executor {plan.executor}{where}")
    print(f"results: {store.root}")
    if plan.points:
        print(plan_frame(plan, store).to_string(index=False))
    for s in plan.skipped:
        print(f"skipped (invalid): {s.description}: {s.reason}  [{'; '.join(s.origin) or 'base'}]")


SUMMARY_COLUMNS = {
    "run_id": "run_id",
    "strategy": "strategy",
    "world_size": "world",
    "seq_len": "seq",
    "batch": "batch",
    "status": "status",
}


def print_summary(frame: pd.DataFrame, points: list[Point], store: Store) -> int:
    """The table of this run's points; exit status 1 if any point failed, hung or was cancelled."""
    ids = {p.run_id for p in points}
    rows = frame[frame["run_id"].isin(ids)] if not frame.empty else frame
    if rows.empty:
        print("no points")
        return 0
    table = rows[list(SUMMARY_COLUMNS)].rename(columns=SUMMARY_COLUMNS)
    table.insert(2, "degrees", rows.apply(_degrees, axis=1))
    for col, src, scale in (
        ("step_ms", "step_time_s", 1e3),
        ("tok/s/gpu", "tokens_per_s_per_gpu", 1),
        ("peak_MiB", "peak_memory_bytes", 2**-20),
    ):
        if src in rows:
            table[col] = (pd.to_numeric(rows[src], errors="coerce") * scale).round(1)
    print(table.to_string(index=False))
    counts = rows["status"].value_counts().to_dict()
    print(", ".join(f"{n} {s}" for s, n in counts.items()) + f"; records in {store.root}/records.csv")
    return 0 if set(counts) <= set(OK_STATUSES) else 1


def _degrees(row: pd.Series) -> str:
    return "x".join(f"{a}{int(row[a])}" for a in ("dp", "tp", "sp", "tsp") if int(row[a]) > 1) or "1"


def cmd_status(args: argparse.Namespace) -> int:
    path = Path(args.results_dir)
    if not path.is_dir():
        raise UsageError(f"{path}: no such results folder")
    table = status_table(path)
    if table.empty:
        print(f"{path}: no points stored")
        return 0
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(table.to_string(index=False))
    counts = table["status"].value_counts().to_dict()
    print(f"{len(table)} points: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """The ``run`` and ``status`` subcommands (called from tspbench.cli.build_parser)."""
    p = sub.add_parser("run", help="run an experiment file's sweep into the results store")
    p.add_argument("experiment", help="experiment YAML, e.g. experiments/quickstart.yaml")
    p.add_argument("--executor", choices=EXECUTORS, help="default: the experiment's executor")
    p.add_argument("--cluster", help="cluster profile slurm/NAME.yaml (or a path to one)")
    p.add_argument("--results", default="results", help="results root (default: results)")
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a value (YAML)")
    p.add_argument("--dry-run", action="store_true", help="list the points and run nothing")
    p.add_argument("--retry-failed", action="store_true", help="rerun oom/failed/timeout/cancelled points")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("status", help="the status of every point stored under a results folder")
    p.add_argument("results_dir", help="results/<experiment> or a results root")
    p.set_defaults(func=cmd_status)
