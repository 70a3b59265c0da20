"""``tspbench run`` and ``tspbench status``: sweeps from experiment files, and what they stored.

tspbench run EXPERIMENT.yaml [--executor local|slurm|predict] [--cluster NAME]
             [--results DIR] [--set key.path=value ...] [--dry-run] [--retry-failed]
tspbench status RESULTS_DIR
"""

from __future__ import annotations

import argparse
import shlex
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from tspbench.cli.args import output_path
from tspbench.cli.terminal import print_table, progress_for
from tspbench.core.errors import UsageError
from tspbench.core.names import AXES, EXECUTORS, OK_STATUSES
from tspbench.core.units import degrees_text

if TYPE_CHECKING:  # the sweep's modules import torch: each command imports what it runs (#45)
    import pandas as pd

    from tspbench.sweep.cluster import Profile
    from tspbench.sweep.damage import RunFiles
    from tspbench.sweep.points import Point
    from tspbench.sweep.run import Sweep
    from tspbench.sweep.slurm import Submission
    from tspbench.sweep.store import Store


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run an experiment file's sweep into the results store")
    p.add_argument("experiment", help="experiment YAML, e.g. experiments/quickstart.yaml")
    p.add_argument("--executor", choices=EXECUTORS, help="default: the experiment's executor")
    p.add_argument(
        "--cluster", help="cluster profile slurm/NAME.yaml (or a path to one); implies --executor slurm"
    )
    p.add_argument("--results", default="results", help="results root (default: results)")
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a value (YAML)")
    p.add_argument("--dry-run", action="store_true", help="list the points and run nothing")
    p.add_argument("--retry-failed", action="store_true", help="rerun oom/failed/timeout/cancelled points")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("status", help="the status of every point stored under a results folder")
    p.add_argument("results_dir", help="results/<experiment> or a results root")
    p.set_defaults(func=cmd_status)


def cmd_run(args: argparse.Namespace) -> int:
    results = output_path(Path(args.results), "--results", folder=True, writable=not args.dry_run)
    from tspbench.sweep.run import prepare_sweep, run_sweep
    from tspbench.sweep.store import Store, mixing_problem, write_tables

    sweep = prepare_sweep(args.experiment, args.set or [], args.executor, args.cluster)
    store = Store(results / sweep.experiment.name)
    method = sweep.points[0].config["method"] if sweep.points else None  # measure, fake or predict
    mixing = mixing_problem(store.root, method) if method else None
    if args.dry_run:
        print_dry_run(sweep, store, args.retry_failed)
        if mixing:
            print(f"run would refuse: {mixing}")
        return 0
    if mixing:  # before anything starts: one study folder holds one kind of record (#46)
        raise UsageError(mixing)
    progress = progress_for()
    try:
        run_sweep(sweep, store, args.retry_failed, progress)
    except KeyboardInterrupt:
        progress.close()
        print(f"\ninterrupted; `{rerun_command(args)}` resumes where it stopped", file=sys.stderr)
        return 130
    finally:
        progress.close()  # after an error too: a terminal is left with its bar drawn and a newline
    damaged: list[RunFiles] = []
    frame = write_tables(store.root, damaged)
    print_damaged(damaged)
    return print_summary(frame, sweep.points, store)


def rerun_command(args: argparse.Namespace) -> str:
    """The command line that repeats this run (every option that decides what runs, and where)."""
    argv = ["tspbench", "run", args.experiment]
    for flag, value in (("--executor", args.executor), ("--cluster", args.cluster)):
        argv += [flag, value] if value else []
    argv += ["--results", args.results]
    for item in args.set or []:
        argv += ["--set", item]
    argv += ["--retry-failed"] if args.retry_failed else []
    return shlex.join(argv)


def print_damaged(damaged: list[RunFiles]) -> None:
    """One line per unreadable file of a damaged run folder (tspbench.sweep.damage)."""
    for files in damaged:
        for problem in files.problems:
            print(f"corrupt: {problem}", file=sys.stderr)


def dry_run_frame(sweep: Sweep, store: Store) -> pd.DataFrame:
    rows = []
    for p in sweep.points:
        layout, w = p.config["layout"], p.config["workload"]
        nodes = p.nodes(sweep.gpus_per_node) if sweep.gpus_per_node else 1
        rows.append(
            {
                "run_id": p.run_id,
                "strategy": layout["strategy"],
                **{a: layout[a] for a in AXES},
                "world": p.world_size,
                "nodes": nodes,
                **{k: w[k] for k in ("seq_len", "batch", "mode", "recompute", "dtype", "device")},
                "stored": "corrupt" if store.problems(p.run_id) else store.state(p.run_id) or "-",
            }
        )
    import pandas as pd

    return pd.DataFrame(rows)


def print_dry_run(sweep: Sweep, store: Store, retry_failed: bool) -> None:
    """--dry-run: every point with its id, world size and nodes; the invalid ones with why."""
    exp = sweep.experiment
    todo = sum(store.needs_run(p.run_id, retry_failed) for p in sweep.points)
    where = f", cluster {sweep.profile.name} ({sweep.gpus_per_node} per node)" if sweep.profile else ""
    print(f"{exp.name}: {exp.description}" if exp.description else exp.name)
    print(f"{len(sweep.points)} points ({todo} would run), executor {sweep.executor}{where}")
    print(f"results: {store.root}")
    if sweep.points:
        print_table(dry_run_frame(sweep, store))
    for s in sweep.skipped:
        print(f"skipped (invalid): {s.description}: {s.reason}  [{'; '.join(s.origin) or 'base'}]")
    if sweep.executor == "slurm" and sweep.profile is not None:
        todo = [p for p in sweep.points if store.needs_run(p.run_id, retry_failed)]
        print_submissions(todo, sweep.profile, sweep.node_limit)


def print_submissions(points: list[Point], profile: Profile, node_limit: int | None = None) -> None:
    """What ``run`` would hand to sbatch: each submission (a job array, or a plain job for a
    single point) with its sbatch options, its setup lines and the ids of its points."""
    from tspbench.sweep.slurm import submissions

    jobs = submissions(points, profile)
    if not jobs:
        print(f"slurm ({profile.path}): nothing to submit, no point needs a run")
        return
    arrays = sum(len(job.points) > 1 for job in jobs)
    kinds = [_count(arrays, "job array"), _count(len(jobs) - arrays, "single job")]
    print(
        f"slurm ({profile.path}): {_count(len(points), 'point')} to submit in "
        f"{_count(len(jobs), 'sbatch call')}: {', '.join(k for k in kinds if not k.startswith('0 '))}"
    )
    print(f"  {cluster_size_words(jobs, profile, node_limit)}")
    for i, job in enumerate(jobs, 1):
        size = f"job array of {len(job.points)} points" if len(job.points) > 1 else "single job"
        shape = f"{_count(job.nodes, 'node')} x {_count(job.tasks_per_node, 'task')}"
        print(f"  {i}. {size}, {shape}, time limit {job.minutes} min")
        print(f"    sbatch {' '.join(job.sbatch_options(profile))}")
        for line in profile.setup or []:
            print(f"    setup: {line}")
        if len(jobs) == 1:
            print(f"    points: the {_count(len(job.points), 'point')} to run above")
            continue
        ids = textwrap.wrap(" ".join(p.run_id for p in job.points), 96)
        print("\n".join(f"    {'points: ' if n == 0 else '        '}{line}" for n, line in enumerate(ids)))


def cluster_size_words(jobs: list[Submission], profile: Profile, node_limit: int | None) -> str:
    """The largest job's size against the cluster's (``node_limit``: the profile's ``nodes`` or
    sinfo's, tspbench.sweep.slurm.cluster_limit): a study of 1,024 GPUs plans 128-node jobs
    whatever the cluster holds."""
    largest = max(job.nodes for job in jobs)
    ask = f"the largest job asks {_count(largest, 'node')} ({largest * profile.gpus_per_node:,} GPUs)"
    if node_limit is not None:
        return f"{ask}; this cluster allows {_count(node_limit, 'node')}"
    return (
        f"{ask}; this cluster's size is unknown here (the profile's nodes: is unset and sinfo does "
        f"not answer): set nodes: in {profile.path} to refuse larger points before submitting"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


SUMMARY_COLUMNS = {
    "run_id": "run_id",
    "strategy": "strategy",
    "world_size": "world",
    "seq_len": "seq",
    "batch": "batch",
    "mode": "mode",
    "recompute": "recompute",
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
    table.insert(2, "degrees", rows.apply(lambda row: degrees_text(row["strategy"], row), axis=1))
    from tspbench.sweep.status import headline

    print_table(table.join(headline(rows)))
    counts = rows["status"].value_counts().to_dict()
    print(", ".join(f"{n} {s}" for s, n in counts.items()) + f"; records in {store.root}/records.csv")
    return 0 if set(counts) <= set(OK_STATUSES) else 1


def cmd_status(args: argparse.Namespace) -> int:
    """The table of every stored point; damaged folders listed too, each bad file named on stderr
    (exit 2: the store needs attention)."""
    from tspbench.sweep.status import status_table
    from tspbench.sweep.store import results_folder

    path = results_folder(args.results_dir)
    damaged: list[RunFiles] = []
    table = status_table(path, damaged)
    if table.empty:
        if not (path / "experiment.json").is_file():  # no sweep ever wrote here: a wrong folder
            raise UsageError(f"{path}: no study stored here (a study folder holds experiment.json)")
        print(f"{path}: no points stored")
        return 0
    print_table(table)
    counts = table["status"].value_counts().to_dict()
    print(f"{len(table)} points: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    print_damaged(damaged)
    return 2 if damaged else 0
