"""The folder a report writes into, and only what the report owns there (#45).

A report replaces its own files and removes the figures its records no longer support; in a
folder that holds someone else's files the same cleaning would delete them. So a report writes
only into a folder it owns, and deletes only files it wrote:

- a folder that does not exist yet, or is empty, becomes the report's;
- a folder holding ``.tspbench-report`` (the list of files the last report wrote there) is the
  report's, and only the files on that list are ever removed;
- a folder whose report.md a report wrote before the list existed (its text says so) is the
  report's too, so the stored reports regenerate in place;
- any other folder with files in it is refused before anything is written, naming a few files.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from tspbench.core.errors import UsageError
from tspbench.core.files import read_input, write_atomic

MANIFEST = ".tspbench-report"
_SIGNATURES = ("Regenerate with `tspbench report", "# Reports\n")  # what a report.md of ours says


def written_before(out_dir: Path) -> set[str] | None:
    """The names the last report listed as its own in ``out_dir`` (None: no list there)."""
    manifest = out_dir / MANIFEST
    if not os.path.lexists(manifest):
        return None
    try:  # bounded, regular files only: a FIFO or a huge file here is not our list
        text = read_input(manifest, 4 * 2**20).decode("utf-8", "replace")
    except UsageError:
        return None
    return {line for line in text.splitlines() if line and "/" not in line and line not in (".", "..")}


def _ours(report_md: Path) -> bool:
    """Whether ``report_md`` is a report.md a report wrote (its text says so)."""
    try:
        head = read_input(report_md, 16 * 2**20)[:100_000].decode("utf-8", "replace")
    except UsageError:  # absent, a FIFO, a folder, too large: not a report.md of ours
        return False
    return head.startswith(_SIGNATURES[1]) or _SIGNATURES[0] in head


def claim(out_dir: Path, flag: str = "--out") -> None:
    """Refuse ``out_dir`` (one line) unless the report owns it (see the module docstring)."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise UsageError(f"{flag} {out_dir}: is a file, expected a folder")
    entries = sorted(p.name for p in out_dir.iterdir())
    if not entries or written_before(out_dir) is not None or _ours(out_dir / "report.md"):
        return
    shown = ", ".join(entries[:4]) + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")
    raise UsageError(
        f"{flag} {out_dir}: holds files a report did not write ({shown}); a report replaces and "
        "deletes files in its folder, so name a new or empty folder"
    )


def remove_stale(out_dir: Path, names: list[str]) -> None:
    """Remove the files in ``names`` that this folder's report wrote: listed in its manifest, or
    every one of them in a folder of a report from before the manifest (``claim`` passed it)."""
    before = written_before(out_dir)
    for name in names:
        if before is None or name in before:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                (out_dir / name).unlink()


def record_written(out_dir: Path, paths: list[Path]) -> None:
    """Write the manifest: the names of the files (and experiment subfolders) written here."""
    names = sorted({p.relative_to(out_dir).parts[0] for p in paths if p.is_relative_to(out_dir)})
    write_atomic(out_dir / MANIFEST, "".join(f"{n}\n" for n in names))
