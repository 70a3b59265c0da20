"""tspbench: a reproducible benchmark suite for transformer parallelism (DP, TP, SP, TP+SP, TSP)."""

from importlib.metadata import PackageNotFoundError, version

try:  # one source: pyproject.toml's version, as installed
    __version__ = version("tspbench")
except PackageNotFoundError:  # a checkout on sys.path that was never installed
    __version__ = "0+unknown"
