"""tspbench: a reproducible benchmark suite for transformer parallelism (DP, TP, SP, TP+SP, TSP)."""

__version__ = "0.1.0"
