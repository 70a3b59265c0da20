"""How much this host's speed moved between two measurements of results/cpu_reference.

Compares the measured step times of the points whose code did not change between a previous
commit's records and the working tree's (``--strategies``), and, from the records as they were
measured (before ``calibrate`` ran again and they were re-priced), each model's median absolute
error on the profile calibrated before the run. Writes results/timeline_check/host_drift.json,
which docs/time-model.md quotes.

    tspbench check host-drift --previous 03feae9 --strategies dp tp --as-measured /tmp/measured
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

from tspbench.core.errors import UsageError
from tspbench.core.files import write_atomic
from tspbench.sweep.store import load

STUDY = Path("results/cpu_reference")
GIT_TIMEOUT_S = 60


def records_at(rev: str) -> dict[str, dict]:
    """run id -> record of cpu_reference's completed points at git revision ``rev``."""
    names = git("ls-tree", "-r", "--name-only", rev, str(STUDY), rev=rev).split()
    out = {}
    for name in (n for n in names if n.endswith("/result.json")):
        try:
            out[Path(name).parent.name] = json.loads(git("show", f"{rev}:{name}", rev=rev))
        except ValueError as exc:
            raise UsageError(f"--previous {rev}: {name} is not a record: {exc}") from None
    if not out:
        raise UsageError(f"--previous {rev}: no {STUDY} records at that revision")
    return {k: r for k, r in out.items() if isinstance(r, dict) and r.get("status") == "completed"}


def git(*args: str, rev: str) -> str:
    """``git ARGS``' output, with a timeout; one line naming ``--previous`` when it fails (no git,
    not a checkout, an unknown revision) instead of a CalledProcessError traceback (#45)."""
    try:
        done = subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--previous {rev}: git {args[0]} did not run: {exc}") from None
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise UsageError(f"--previous {rev}: git {args[0]} failed: {reason}")
    return done.stdout


def records_in(folder: Path) -> dict[str, dict]:
    """run id -> record of the completed points of an experiment folder (tspbench.sweep.store)."""
    frame = load(folder)
    return frame[frame["status"] == "completed"].set_index("run_id").to_dict("index")


def median_error(records: dict[str, dict], field: str, signed: bool = False) -> float:
    errors = [r[field] / r["step_time_s"] - 1 for r in records.values()]
    return round(statistics.median(errors if signed else map(abs, errors)), 3)


def host_drift(previous: str, strategies: list[str], as_measured: Path, out: Path) -> dict:
    """Written to ``out`` (JSON) and returned: cpu_reference's ``strategies`` points now against
    git revision ``previous``, and the records ``as_measured`` priced on the profile before."""
    if not as_measured.is_dir():
        raise UsageError(f"--as-measured {as_measured}: not an experiment folder")
    before, now = records_at(previous), records_in(STUDY)
    same = sorted(k for k in now if k in before and now[k]["strategy"] in strategies)
    if not same:
        raise UsageError(f"--strategies {' '.join(strategies)}: no completed point of them in both runs")
    by_point = [
        {
            "run_id": k,
            "strategy": now[k]["strategy"],
            "seq_len": now[k]["seq_len"],
            "previous_step_time_s": before[k]["step_time_s"],
            "step_time_s": now[k]["step_time_s"],
            "previous_time_utc": before[k]["env_time_utc"],
            "time_utc": now[k]["env_time_utc"],
        }
        for k in same
    ]
    ratios = [p["step_time_s"] / p["previous_step_time_s"] for p in by_point]
    measured = records_in(as_measured)
    names = ", ".join(s.upper() for s in strategies)
    result = {
        "what": f"measured step times of results/cpu_reference's {names} points (code unchanged between the "
        f"two runs) in this run against the previous run stored at commit {previous}",
        "points": len(ratios),
        "strategies": strategies,
        "median_ratio": statistics.median(ratios),
        "min_ratio": min(ratios),
        "max_ratio": max(ratios),
        "previous_profile_errors": {
            "what": f"cpu_reference's {len(measured)} points of this run priced on the CPU profile "
            "calibrated before the run, before it was calibrated again: median absolute and median "
            "signed error of each model",
            "timeline": median_error(measured, "timeline_step_time_s"),
            "analytic": median_error(measured, "predicted_step_time_s"),
            "timeline_signed": median_error(measured, "timeline_step_time_s", signed=True),
            "analytic_signed": median_error(measured, "predicted_step_time_s", signed=True),
        },
        "by_point": by_point,
    }
    write_atomic(out, json.dumps(result, indent=1) + "\n")
    return result
