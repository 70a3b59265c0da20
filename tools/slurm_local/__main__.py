"""``python -m tools.slurm_local up|status|down ROOT``: the local cluster by hand."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import tools.slurm_local
from tools.slurm_local.cluster import LocalSlurmCluster, SlurmClusterError
from tools.slurm_local.install import ensure_installed


def main(argv: Sequence[str] | None = None) -> int:
    """``up`` / ``down`` / ``status`` ROOT; ``up`` prints the export line for clients."""
    parser = argparse.ArgumentParser(
        prog="python -m tools.slurm_local",
        description=tools.slurm_local.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("root", type=Path)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cpus-per-node", type=int, default=8)
    parser.add_argument("--no-accounting", action="store_true")
    parser.add_argument("--no-install", action="store_true", help="do not apt-get install")
    args = parser.parse_args(argv)
    cluster = LocalSlurmCluster(args.root, args.nodes, args.cpus_per_node, not args.no_accounting)
    if args.action == "down":
        cluster.stop()
        print(f"stopped cluster under {cluster.root}")
        return 0
    if args.action == "status":
        print(json.dumps(cluster.status(), indent=1))
        return 0
    return _cli_up(cluster, install=not args.no_install)


def _cli_up(cluster: LocalSlurmCluster, install: bool) -> int:
    reason = ensure_installed() if install else None
    if reason is not None:
        print(f"cannot start Slurm: {reason}", file=sys.stderr)
        return 1
    t0 = time.monotonic()
    try:
        cluster.start()
    except SlurmClusterError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"cluster up in {time.monotonic() - t0:.1f} s; partition {cluster.partition!r}")
    print(f"export SLURM_CONF={cluster.conf_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
