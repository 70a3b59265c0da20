"""The CLI's exit status as a user sees it, for tests that call ``main`` in-process."""

from __future__ import annotations

from tspbench.cli.main import main


def exit_code(argv: list[str]) -> int:
    """main()'s exit status, whether it returns it or argparse raises SystemExit."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)
