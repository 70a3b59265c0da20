"""The ``tspbench`` command line (``main``): argument parsing and printing only; nothing imports it."""

from tspbench.cli.main import main

__all__ = ["main"]
