"""tspbench: a reproducible benchmark suite for transformer parallelism (DP, TP, SP, TP+SP, TSP).

``tspbench.__version__`` names the code as well as the release, '0.2.0+g1d705c2' (a PEP 440
local version, as setuptools-scm writes it): pyproject.toml's version, as installed, and the
commit, from git when tspbench runs from a checkout, else from the installed package's metadata
(a version that already names one, or the commit pip recorded installing from a git URL).
Worked out on first use (one ``git`` call), not at import: every rank imports tspbench.
"""

from __future__ import annotations

import json
import subprocess
from functools import cache
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent  # the repository root when run from a checkout


def __getattr__(name: str) -> str:
    if name == "__version__":
        return version()
    raise AttributeError(f"module 'tspbench' has no attribute {name!r}")


@cache
def version() -> str:
    """'0.2.0+g1d705c2': the release and the commit; the release alone when neither git nor the
    package's metadata names a commit."""
    try:
        dist = distribution("tspbench")
    except PackageNotFoundError:  # a checkout on sys.path that was never installed
        release, commit = "0+unknown", None
    else:
        release, commit = dist.version, _installed_commit(dist.read_text("direct_url.json"))
    if "+" in release:  # built with the commit in it already
        return release
    commit = _checkout_commit() or commit
    return f"{release}+g{commit}" if commit else release


def _checkout_commit() -> str | None:
    """HEAD's short sha when tspbench is imported from a git checkout of its own (the folder
    above the package holds pyproject.toml: not a site-packages inside some other repository)."""
    if not (_CHECKOUT / "pyproject.toml").is_file():
        return None
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=_CHECKOUT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def _installed_commit(direct_url: str | None) -> str | None:
    """The commit pip installed from (``pip install git+https://...``), shortened as git does."""
    try:
        commit = json.loads(direct_url or "{}").get("vcs_info", {}).get("commit_id")
    except (ValueError, AttributeError):
        return None
    return commit[:7] if isinstance(commit, str) and commit else None
