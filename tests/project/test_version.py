"""One version: pyproject.toml's, printed by ``tspbench --version`` (with the commit) and released
last in CHANGELOG.md."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
RELEASE = re.compile(r"^## (\d+\.\d+\.\d+) - (\d{4}-\d{2}-\d{2})$", re.MULTILINE)


def pyproject_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@pytest.mark.slow
def test_version_flag_prints_the_pyproject_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tspbench", "--version"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    release, _, commit = done.stdout.strip().partition("+g")  # 'tspbench 0.2.0+g1d705c2'
    assert release == f"tspbench {pyproject_version()}"  # a stale install reads otherwise
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    assert commit == head.stdout.strip() or head.returncode != 0, done.stdout


def test_the_changelog_latest_release_is_the_pyproject_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = RELEASE.findall(text)
    assert releases, "no '## X.Y.Z - YYYY-MM-DD' release heading in CHANGELOG.md"
    assert releases[0][0] == pyproject_version()
    dates = [date.fromisoformat(d) for _, d in releases]
    assert dates == sorted(dates, reverse=True), "releases newest first"
    assert text.index("## Unreleased") < text.index(f"## {releases[0][0]}")
    assert len(text.splitlines()) < 150
