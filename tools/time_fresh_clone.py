"""Time the README's commands on a fresh clone of this repository: results/host_timings.json.

Clones HEAD into a temporary directory, then runs ``make demo``, ``make check`` and ``make test``
there one after another (the first one builds the clone's .venv, as a newcomer's would; its
set-up time is reported apart), and writes their wall times and test counts with the host's
description. tools/gen_docs.py quotes them in the README.

    python -m tools.time_fresh_clone [--out results/host_timings.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PASSED = re.compile(r"(\d+) passed")


def timed(command: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        output = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        raise SystemExit(f"{' '.join(command)} failed in {cwd}:\n{output}")
    return seconds, done.stdout


def passed(output: str) -> int:
    found = PASSED.findall(output)
    if not found:
        raise SystemExit(f"no pytest summary in:\n{output[-2000:]}")
    return int(found[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "host_timings.json")
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory(prefix="tspbench-clone-") as tmp:
        clone = Path(tmp) / "tspbench"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        setup_s, _ = timed(["make", ".venv/.installed"], clone)
        demo_s, _ = timed(["make", "demo"], clone)
        check_s, check_out = timed(["make", "check"], clone)
        test_s, test_out = timed(["make", "test"], clone)
    record = {
        "what": "wall time of the README's commands on a fresh clone, run one after another",
        "commit": commit.strip(),
        "host": f"{platform.machine()}, {os.cpu_count()} CPUs, no GPU, Python {platform.python_version()}",
        "setup_s": round(setup_s, 1),
        "make_demo_s": round(demo_s, 1),
        "make_check_s": round(check_s, 1),
        "check_tests": passed(check_out),
        "make_test_s": round(test_s, 1),
        "tests": passed(test_out),
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
