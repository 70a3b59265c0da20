"""Whether a study's measured step times can fairly be held against the profile that priced them
(#46): a profile measured on another host (its description names the host and cores that
``tspbench calibrate`` ran on), a host contended while the points ran (each rank's share of a core,
from the kernel's schedstat: tspbench.measure.schedstat), or times far off the prediction with no
cause on record. Each says so, and how to price on this host instead.

A rank's share of a core is (busy - waiting for a core) / step wall time; N ranks on C cores get
min(1, C / N) each when nothing else runs. Under half of that, something else took the cores.
"""

from __future__ import annotations

import re

import pandas as pd

from tspbench.analytic.profile_choice import named_profile
from tspbench.core.errors import HardwareError
from tspbench.report.frame import column

CALIBRATED_ON = re.compile(r"calibrate on (\S+?): .* on (\d+) cores")
CONTENDED = 0.5  # of the fair share of a core: below it, another load took the host
OFF = 25.0  # median |error| of the step time (%), the time_parity figure's band
CALIBRATE = (
    "price on this host: `tspbench calibrate --out this-host.yaml` (minutes), then `tspbench bench ... "
    "--hardware this-host.yaml`; or run the points again on an idle host"
)


def profile_host(name: str) -> tuple[str, int] | None:
    """(host, cores) that ``tspbench calibrate`` measured the profile ``name`` on; None when its
    description does not say (a datasheet profile, or one written by hand)."""
    try:
        found = CALIBRATED_ON.search(named_profile(name).description or "")
    except HardwareError:
        return None
    return (found.group(1), int(found.group(2))) if found else None


def host_notes(df: pd.DataFrame) -> list[str]:
    """Why this study's measured step times may not match the profile's, each a sentence, then
    how to price on this host; empty when nothing is wrong (or nothing was measured on a CPU)."""
    rows = df[(df.get("source") == "measured") & (df["status"] == "completed") & (df.get("device") == "cpu")]
    if rows.empty or "predicted_hardware" not in rows:
        return []
    hosts = sorted(set(rows["env_host"].dropna().astype(str))) if "env_host" in rows else []
    cores = column(rows, "env_cpu_count").dropna()
    notes = []
    for name in sorted(set(rows["predicted_hardware"].dropna().astype(str))):
        where = profile_host(name)
        if where and (where[0] not in hosts or (len(cores) and where[1] != int(cores.median()))):
            count = int(cores.median()) if len(cores) else "?"
            ran = f"{', '.join(hosts) or 'a host not recorded'} ({count} CPUs)"
            notes.append(f"the {name} profile that priced these points was measured on {where[0]} "
                         f"({where[1]} cores); they ran on {ran}")  # fmt: skip
    on_core = (column(rows, "cpu_busy_s") - column(rows, "cpu_runqueue_s")) / column(rows, "step_time_s")
    fair = (cores.reindex(rows.index) / column(rows, "world_size")).clip(upper=1.0)
    share, fair_share = on_core.median(), fair.median()
    if pd.notna(share) and pd.notna(fair_share) and share < CONTENDED * fair_share:
        notes.append(f"this host was contended while they ran: a rank was on a core {share:.0%} of its "
                     f"step, where {fair_share:.0%} is its fair share of the cores")  # fmt: skip
    error = (column(rows, "predicted_step_time_s") / column(rows, "step_time_s") - 1).abs().median() * 100
    if notes or (pd.notna(error) and error > OFF):
        if not notes:
            notes.append(f"the measured steps are {error:.0f}% (median) off the profile's prediction: this "
                         "host's speed is not the profile's (another host, or another load)")  # fmt: skip
        notes.append(CALIBRATE)
    return notes
