"""Where a study's records came from, for the top of its report.md (#46): the command that made
them, the command that makes the report, and how long the points ran on the host that ran them.

The run command is rebuilt from the study's experiment.json (the file, ``--set`` overrides and
executor of its last ``tspbench run``; tspbench.sweep.run), never guessed from the records. The
run time is read from what every run folder stores: status.json's ``started`` and ``finished``
(seconds) and the environment's host and CPU count (``env_host``, ``env_cpu_count``). Points run
side by side or in several sessions make the sum of their times, and the span from the first
start to the last finish, both wrong as a wall time; the time during which at least one point
was running (the union of their intervals) is neither, and is what is given first.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pandas as pd

DEFAULT_RESULTS = Path("results")  # tspbench run's --results default


def shown(path: Path) -> Path:
    """``path`` relative to the working folder where it lies under it (results/x, not /home/...)."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return Path(path)


def run_command(runs: Path) -> str | None:
    """``tspbench run FILE --executor E --set K=V ...`` as experiment.json in ``runs`` stores it
    (``--results`` added where the study is not under results/); None where it stores none."""
    try:
        stored = json.loads((runs / "experiment.json").read_text())
        words = ["tspbench", "run", stored["file"], "--executor", stored["executor"]]
        for override in stored.get("overrides") or []:
            words += ["--set", str(override)]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if Path(runs).parent != DEFAULT_RESULTS:
        words += ["--results", str(Path(runs).parent)]
    return shlex.join(words)


def report_command(runs: Path) -> str:
    """The command that writes this report again; it names the records, not the output folder
    (a report is byte-identical wherever it is written)."""
    root = Path(runs).parent
    return (
        f"`{shlex.join(['tspbench', 'report', str(runs)])}` (into {runs}/report, or `--out DIR`); "
        f"every study under {root} at once: `{shlex.join(['tspbench', 'report', str(root)])}` "
        f"(into {root}/report/<study>/)"
    )


def busy_seconds(starts: pd.Series, ends: pd.Series) -> float:
    """Seconds during which at least one [start, end] interval was open (their union)."""
    total, reach = 0.0, None
    for start, end in sorted(zip(starts, ends, strict=True)):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def duration(seconds: float) -> str:
    """'under 1 s', '45 s', '8 min 10 s', '2 h 5 min'."""
    s = round(seconds)
    if s < 1:
        return "under 1 s"
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s // 60 % 60} min"


def hosts(df: pd.DataFrame) -> str:
    """'vm (2 CPUs)', or each host with its CPU count; 'a host not stored' without env fields."""
    if "env_host" not in df or df["env_host"].isna().all():
        return "a host not stored in the records"
    cpus = df["env_cpu_count"] if "env_cpu_count" in df else pd.Series(index=df.index, dtype=float)
    seen = dict.fromkeys(zip(df["env_host"].fillna("?"), cpus.fillna(0), strict=True))
    return ", ".join(f"{h} ({int(n)} CPUs)" if n else str(h) for h, n in seen)


def spans(df: pd.DataFrame) -> tuple[pd.Series, pd.Series, pd.Series, pd.Timestamp] | None:
    """Each timed point's start and finish (status.json) in seconds from the first start, which
    rows are timed, and that first start; None where no point stores both."""
    if "started" not in df or "finished" not in df:
        return None
    start = pd.to_datetime(df["started"], utc=True, errors="coerce")
    end = pd.to_datetime(df["finished"], utc=True, errors="coerce")
    timed = start.notna() & end.notna()
    if not timed.any():
        return None
    t0 = start[timed].min()
    return (start[timed] - t0).dt.total_seconds(), (end[timed] - t0).dt.total_seconds(), timed, t0


def wall_time(df: pd.DataFrame) -> str:
    """'8 min 10 s': how long some point of ``df`` was running (overlaps once)."""
    found = spans(df)
    return duration(busy_seconds(found[0], found[1])) if found else "not stored"


def run_time(df: pd.DataFrame) -> str:
    """How long the points ran, from status.json's times, on which host; or that it is not stored."""
    found = spans(df)
    if found is None:
        return "not stored in these records (no start and finish times)"
    lo, hi, timed, t0 = found
    each = hi - lo
    days = sorted({t.date().isoformat() for t in (t0, t0 + pd.Timedelta(seconds=hi.max()))})
    untimed = f"; {int((~timed).sum())} points without times" if (~timed).any() else ""
    return (
        f"{duration(busy_seconds(lo, hi))} of wall time with a point running, on {hosts(df[timed])}, "
        f"{' to '.join(days)} ({int(timed.sum())} points: {duration(each.sum())} summed, "
        f"{duration(each.median())} a point at the median; from each point's start and finish in "
        f"status.json{untimed})"
    )


def provenance_lines(df: pd.DataFrame, runs: Path | None) -> list[str]:
    """report.md's lines on how to regenerate the records and the report, and the run time."""
    if runs is None:
        return []
    runs = shown(runs)
    command = run_command(runs)
    made = (
        f"`{command}` (as {runs}/experiment.json stores it; points already stored are not run "
        "again: add `--results NEWDIR` to run them all)"
        if command
        else f"not stored ({runs}/experiment.json is missing or unreadable)"
    )
    return [
        f"- Records: {made}",
        f"- Run time: {run_time(df)}",
        f"- This report: {report_command(runs)}",
        "",
    ]
